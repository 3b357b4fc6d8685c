package parse

import (
	"encoding/json"
	"strings"
	"testing"
	"unicode/utf8"
)

var fuzzTools = []Tool{typedTool, calcTool, lookupTool, grepTool, writeTool, readTool}

var toolSeeds = []string{
	"",
	"just text",
	"Intro\n<tool_call>\n<function=calc>\n<parameter=n>\n5\n</parameter>\n<parameter=o>\n{\"a\":1}\n</parameter>\n</function>\n</tool_call>",
	"<tool_call>\n<function=write>\n<parameter=content>\nx</tool_call>y\n</parameter>\n</function>\n</tool_call>",
	"<tool_call>\n<function=write>\n<parameter=path>\np\n<parameter=content>\n<parameter=q>\nv\n</parameter>\n",
	"lead <tool_call><function=lookup><parameter=q>vime</parameter></function></tool_call> tail",
	`<tool_call>{"name":"grep","arguments":{"pattern":"\d+ \u12"}}</tool_call>`,
	"<tool_call>{\"name\":\"write\",\"arguments\":\"{\\\"content\\\": \\\"a\nb\\\"}\"}</tool_call> <tool_call>{bad}</tool_call>",
	`<tool_call>{"name":"x","arguments":[1]}</tool_call><tool_call>{"name":"grep","arguments":{}}`,
	"<tool_call>\n<function=typed>\n<parameter=o>\n{'k': (1, 2.5, None)}\n</parameter>\n<parameter=num>\n1e-7\n</parameter>\n</function>\n</tool_call><|im_end|>",
}

// checkResult asserts what always holds for ToolCalls (see doc.go):
// arguments are JSON objects; Content is trimmed and is the input with
// spans deleted (a subsequence of it); no calls means the input comes back
// unchanged; IllFormed only with calls; no tools means no parsing.
func checkResult(t *testing.T, text string, tools []Tool, f Format) {
	r := ToolCalls(text, tools, f)
	for _, c := range r.Calls {
		if !json.Valid(c.Arguments) || c.Arguments[0] != '{' || !utf8.Valid(c.Arguments) {
			t.Fatalf("arguments not a JSON object: %q", c.Arguments)
		}
		var m map[string]any
		if err := json.Unmarshal(c.Arguments, &m); err != nil {
			t.Fatalf("arguments: %v", err)
		}
		if c.Name == "" {
			t.Fatal("empty call name")
		}
	}
	if pyStrip(r.Content) != r.Content {
		t.Fatalf("content not trimmed: %q", r.Content)
	}
	if len(r.Calls) == 0 && (r.Content != pyStrip(text) || r.IllFormed) {
		t.Fatalf("no calls but content %q (ill %v) for %q", r.Content, r.IllFormed, text)
	}
	if !isSubsequence(r.Content, text) {
		t.Fatalf("content %q is not the input with parts removed", r.Content)
	}
	if len(tools) == 0 && len(r.Calls) != 0 {
		t.Fatal("calls without tools")
	}
	if f == FallbackOnly {
		for _, c := range r.Calls {
			var m map[string]any
			_ = json.Unmarshal(c.Arguments, &m)
			for _, v := range m {
				if _, ok := v.(string); !ok {
					t.Fatalf("fallback argument not a string: %v", v)
				}
			}
		}
	}
}

func isSubsequence(sub, s string) bool {
	i := 0
	for j := 0; j < len(s) && i < len(sub); j++ {
		if s[j] == sub[i] {
			i++
		}
	}
	return i == len(sub)
}

func FuzzToolCallsXML(f *testing.F) {
	for _, s := range toolSeeds {
		f.Add(s)
	}
	f.Fuzz(func(t *testing.T, text string) {
		checkResult(t, text, fuzzTools, Qwen3CoderXML)
		checkResult(t, text, fuzzTools, FallbackOnly)
		checkResult(t, text, nil, Qwen3CoderXML)
	})
}

func FuzzToolCallsHermes(f *testing.F) {
	for _, s := range toolSeeds {
		f.Add(s)
	}
	f.Fuzz(func(t *testing.T, text string) {
		checkResult(t, text, fuzzTools, HermesJSON)
		// The escape repair and both decoders must agree with
		// encoding/json on what they produce.
		if v, ok := parseJSON(text, false); ok {
			if out := encode(v); !json.Valid(out) {
				t.Fatalf("re-encoded JSON invalid: %q", out)
			}
			if !json.Valid([]byte(text)) && utf8.ValidString(text) {
				t.Fatalf("strict decoder accepted invalid JSON %q", text)
			}
		} else if json.Valid([]byte(text)) {
			t.Fatalf("strict decoder rejected valid JSON %q", text)
		}
		if v, ok := parseJSON(repairEscapes(text), true); ok && !json.Valid(encode(v)) {
			t.Fatalf("lenient re-encode invalid")
		}
		if v, ok := pyLiteral(text); ok && !json.Valid(encode(v)) {
			t.Fatalf("literal re-encode invalid: %q", encode(v))
		}
	})
}

// FuzzReasoning: the split only ever drops the text up to and including the
// first <think> and the one or two </think> tags it splits at: what is left
// is reasoning+content, reasoning+"</think>"+content or
// "</think>"+reasoning+"</think>"+content.
func FuzzReasoning(f *testing.F) {
	for _, s := range []string{
		"", "<think>reason here</think>visible", "r</think>\n\nv", "only thoughts",
		"plan <tool_call>\n<function=read>", "</think>a</think>b", "pre<think>a<think>b</think>c",
		"x<tool_call>\t<function y", "<tool_call>", "a<tool_call><function",
	} {
		f.Add(s)
	}
	f.Fuzz(func(t *testing.T, text string) {
		rest := text
		if _, after, ok := strings.Cut(text, thinkOpen); ok {
			rest = after
		}
		for _, opts := range [][]ReasoningOption{nil, {ThinkingDisabled()}} {
			r, c := Reasoning(text, opts...)
			if rest != r+c && rest != r+thinkClose+c && rest != thinkClose+r+thinkClose+c {
				t.Fatalf("Reasoning(%q) = (%q, %q) lost text", text, r, c)
			}
			if !strings.Contains(rest, thinkClose) && opts == nil && c != "" && !strings.HasPrefix(c, toolCallOpen) {
				t.Fatalf("content without </think> must start at <tool_call>: %q", c)
			}
		}
	})
}
