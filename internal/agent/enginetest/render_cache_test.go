package enginetest

import (
	"encoding/json"
	"fmt"
	"testing"
)

// TestRenderCache holds the engine's cached parsing of messages to
// ChatTemplate.Render: growing conversations resent turn after turn, with
// and without the generation prompt, and lists whose cached messages are
// followed by one that fails.
func TestRenderCache(t *testing.T) {
	e := New(Options{Template: ChatTemplate{ToolCallStyle: Qwen3CoderXML, OpenThinkInGenerationPrompt: true}})
	msgs := []any{map[string]any{"role": "system", "content": "Be brief."}, map[string]any{"role": "user", "content": "Fix the build."}}
	for k := 0; k < 4; k++ {
		msgs = append(msgs,
			map[string]any{"role": "assistant", "content": "", "reasoning_content": fmt.Sprint("step ", k),
				"tool_calls": []any{map[string]any{"id": fmt.Sprint("c", k), "type": "function",
					"function": map[string]any{"name": "lookup", "arguments": `{"q":"a.go"}`}}}},
			map[string]any{"role": "tool", "tool_call_id": fmt.Sprint("c", k), "content": "found"})
	}
	tools := []byte(`[{"type":"function","function":{"name":"lookup","parameters":{"type":"object"}}}]`)
	render := func(raw []byte, o RenderOptions) string {
		t.Helper()
		want, wantErr := e.opts.Template.Render(raw, tools, o)
		got, err := e.render(raw, tools, o)
		if fmt.Sprint(err) != fmt.Sprint(wantErr) || got != want {
			t.Fatalf("render(%s, %+v) = %q, %v; Render %q, %v", raw, o, got, err, want, wantErr)
		}
		return got
	}
	for pass := 0; pass < 2; pass++ { // the second pass is all cache hits
		for k := 1; k <= len(msgs); k++ {
			raw, _ := json.Marshal(msgs[:k])
			for _, o := range []RenderOptions{{AddGenerationPrompt: true}, {}, {ContinueFinalMessage: true}, {AddGenerationPrompt: true, ContinueFinalMessage: true},
				{AddGenerationPrompt: true, Kwargs: map[string]any{"enable_thinking": false}}} {
				render(raw, o)
			}
		}
	}
	good, _ := json.Marshal(msgs[:3])
	for _, bad := range []string{`{"role":1}`, `{"role":"assistant","tool_calls":[{"function":{"name":"x","arguments":"{"}}]}`, `7`, `null`} {
		render(append(append(good[:len(good)-1:len(good)-1], ','), bad+"]"...), RenderOptions{AddGenerationPrompt: true})
	}
	for _, raw := range []string{`null`, `{}`, `[`, `[]`, ` [ {"role":"user","content":"hi"} ] `} {
		render([]byte(raw), RenderOptions{AddGenerationPrompt: true})
	}
	if len(e.msgs) == 0 {
		t.Fatal("nothing was cached")
	}
}
