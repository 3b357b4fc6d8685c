package parse

import (
	"encoding/json"
	"strings"
)

// Format names the configured tool-call parser.
type Format uint8

const (
	// FallbackOnly: no tool parser configured; only the adapter's XML
	// fallback runs.
	FallbackOnly Format = iota
	// Qwen3CoderXML is vLLM's "qwen3_coder" parser (the RL run's).
	Qwen3CoderXML
	// HermesJSON is vLLM's "hermes" parser.
	HermesJSON
)

// ParseFormat maps a vLLM tool-parser name ("" for none) to a Format.
func ParseFormat(name string) (Format, bool) {
	switch name {
	case "":
		return FallbackOnly, true
	case "qwen3_coder":
		return Qwen3CoderXML, true
	case "hermes":
		return HermesJSON, true
	}
	return FallbackOnly, false
}

func (f Format) String() string {
	switch f {
	case Qwen3CoderXML:
		return "qwen3_coder"
	case HermesJSON:
		return "hermes"
	}
	return ""
}

// Call is one parsed tool call.
type Call struct {
	Name string
	// Arguments is always a JSON object: compact, keys in the order the
	// model wrote them, no HTML escaping.
	Arguments json.RawMessage
}

// Result is what ToolCalls makes of a body.
type Result struct {
	// Content is the text outside recognized calls, whitespace-trimmed.
	Content string
	Calls   []Call
	// IllFormed marks output that needed recovery: calls salvaged by the
	// lenient JSON re-parse, or a call whose arguments were not an object
	// (wrapped as {"_raw_arguments": ...}).
	IllFormed bool
}

// ToolCalls extracts tool calls from a body (the output after reasoning
// was split off), following docs/adapter.md §6.2. It never fails: what cannot be
// parsed stays in Content.
//
//   - No tools: nothing is parsed; Content is the trimmed body.
//   - Qwen3CoderXML / HermesJSON: the configured parser runs. If it finds
//     no calls but a `<tool_call>{...}</tool_call>` block is present, those
//     blocks are re-parsed leniently; if any has a name the request offers,
//     they are the calls, all such blocks are removed from Content and
//     IllFormed is set. Otherwise the parser's calls and content are used.
//   - When no calls were found so far (and always with FallbackOnly), the
//     XML fallback runs on the body.
func ToolCalls(text string, tools []Tool, format Format) Result {
	return toolCalls(text, NewToolSet(tools), format)
}

func toolCalls(text string, ts *ToolSet, format Format) Result {
	if len(ts.tools) == 0 {
		return Result{Content: pyStrip(text)}
	}
	body := text
	var calls []Call
	ill := false
	if format == Qwen3CoderXML || format == HermesJSON {
		var info parserResult
		if format == HermesJSON {
			info = hermes(text)
		} else {
			info = qwen3Coder(text, ts)
		}
		if !info.called {
			if spans := jsonBlockSpans(text); len(spans) > 0 {
				if rec := lenientRecover(spans, ts); len(rec) > 0 {
					return Result{Content: pyStrip(removeSpans(text, spans)), Calls: rec, IllFormed: true}
				}
			}
		} else {
			body = info.content
			for _, c := range info.calls {
				args, wrapped := normalizeArgs(c.args)
				ill = ill || wrapped
				name := c.name
				if name == "" {
					name = "tool"
				}
				calls = append(calls, Call{Name: name, Arguments: encode(args)})
			}
		}
	}
	if len(calls) == 0 {
		body, calls = xmlFallback(body, ts)
	}
	return Result{Content: pyStrip(body), Calls: calls, IllFormed: ill}
}

// Options configures Parse: the adapter's parser settings for a request.
type Options struct {
	// Qwen3Reasoning runs the qwen3 reasoning split (the RL run's
	// reasoning parser). Without it reasoning is "" and the whole output
	// is the body.
	Qwen3Reasoning bool
	// Reasoning options, used only with Qwen3Reasoning.
	ReasoningOptions []ReasoningOption
	// Tools is the request's tool schema; empty means no tool parsing.
	Tools []Tool
	// ToolSet, when set, is Tools already indexed (NewToolSet), and Tools
	// is not read.
	ToolSet *ToolSet
	// ToolFormat is the configured tool parser.
	ToolFormat Format
	// TrailingSpecials are special-token texts (e.g. "<|im_end|>") removed
	// from the end of the visible text; see StripTrailingSpecials.
	TrailingSpecials []string
}

// Output is one parsed model output.
type Output struct {
	Reasoning string // not trimmed
	Text      string // visible text, trimmed
	Calls     []Call
	IllFormed bool
}

// Parse is the adapter's whole output parse (docs/adapter.md §6): reasoning split,
// tool calls, visible text. It never fails.
func Parse(raw string, o Options) Output {
	reasoning, body := "", raw
	if o.Qwen3Reasoning {
		reasoning, body = Reasoning(raw, o.ReasoningOptions...)
	}
	ts := o.ToolSet
	if ts == nil {
		ts = NewToolSet(o.Tools)
	}
	r := toolCalls(body, ts, o.ToolFormat)
	return Output{
		Reasoning: reasoning,
		Text:      StripTrailingSpecials(r.Content, o.TrailingSpecials...),
		Calls:     r.Calls,
		IllFormed: r.IllFormed,
	}
}

// QwenEndTokens returns the Qwen chat models' end-of-turn / end-of-text
// tokens (a fresh slice: the caller may keep and change it).
func QwenEndTokens() []string { return []string{"<|im_end|>", "<|endoftext|>"} }

// StripTrailingSpecials removes any run of the given special-token texts
// (and whitespace between them) from the end of text and trims it. The
// reference keeps them (docs/adapter.md §6.3); the adapter must apply the same
// function to the manager message so prefix reuse still matches.
func StripTrailingSpecials(text string, specials ...string) string {
	text = pyStrip(text)
	for changed := true; changed; {
		changed = false
		for _, sp := range specials {
			if sp != "" && strings.HasSuffix(text, sp) {
				text = pyStrip(text[:len(text)-len(sp)])
				changed = true
			}
		}
	}
	return text
}
