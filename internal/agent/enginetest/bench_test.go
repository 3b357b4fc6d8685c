package enginetest

import (
	"encoding/json"
	"fmt"
	"net/http"
	"net/http/httptest"
	"strings"
	"testing"
)

// BenchmarkEngineTurn is the engine's own CPU for one agent turn as the
// adapter asks for it (two chat renders, a generation over the rendered
// prompt, a decode), handlers only, no sockets: what the scripted engine
// costs the load benchmarks it stands in a GPU server's place for.
func BenchmarkEngineTurn(b *testing.B) {
	e := New(Options{MaxModelLen: 65536, Template: ChatTemplate{ToolCallStyle: Qwen3CoderXML, OpenThinkInGenerationPrompt: true},
		Script: func(Request) Output {
			return Output{Text: "Inspect the tree first.\n</think>\n\n<tool_call>\n<function=lookup>\n<parameter=q>\nsrc/a.go\n</parameter>\n</function>\n</tool_call>"}
		}})
	msgs := []any{map[string]any{"role": "user", "content": "Please fix the failing build; start by looking around."}}
	for k := 0; k < 10; k++ {
		msgs = append(msgs,
			map[string]any{"role": "assistant", "content": "", "reasoning_content": "I should inspect part of the tree before editing anything.",
				"tool_calls": []any{map[string]any{"id": fmt.Sprint("call_", k), "type": "function",
					"function": map[string]any{"name": "lookup", "arguments": `{"q":"src/pkg/file.go"}`}}}},
			map[string]any{"role": "tool", "tool_call_id": fmt.Sprint("call_", k), "content": strings.Repeat("src/turn/entry_0.go  1.2KB\n", 6)})
	}
	tools := `[{"type":"function","function":{"name":"lookup","description":"Look a path up.","parameters":{"type":"object","properties":{"q":{"type":"string"}},"required":["q"]}}}]`
	full, _ := json.Marshal(msgs)
	prefix, _ := json.Marshal(msgs[:len(msgs)-1])
	tok := func(m []byte, gen bool) string {
		return fmt.Sprintf(`{"messages":%s,"tools":%s,"add_generation_prompt":%v}`, m, tools, gen)
	}
	text, err := e.opts.Template.Render(full, []byte(tools), RenderOptions{AddGenerationPrompt: true})
	if err != nil {
		b.Fatal(err)
	}
	ids, _ := json.Marshal(Encode(text))
	out, _ := json.Marshal(Encode("Inspect the tree first.\n</think>"))
	reqs := []struct{ path, body string }{
		{"/tokenize", tok(full, true)}, {"/tokenize", tok(prefix, false)},
		{"/inference/v1/generate", fmt.Sprintf(`{"token_ids":%s,"sampling_params":{"max_tokens":4096,"temperature":1,"logprobs":0,"detokenize":false,"skip_special_tokens":false}}`, ids)},
		{"/detokenize", fmt.Sprintf(`{"tokens":%s}`, out)},
	}
	b.ReportAllocs()
	for b.Loop() {
		for _, r := range reqs {
			w := httptest.NewRecorder()
			e.ServeHTTP(w, httptest.NewRequest(http.MethodPost, r.path, strings.NewReader(r.body)))
			if w.Code != http.StatusOK {
				b.Fatalf("%s: %d %s", r.path, w.Code, w.Body)
			}
		}
		e.Reset()
	}
	b.ReportMetric(float64(len(text)), "prompt-tokens")
}
