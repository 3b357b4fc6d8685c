package protocol

import (
	"encoding/json"
	"net/http"
	"os"
	"strconv"
	"testing"
)

// BenchmarkDecodeClaudeCode decodes a request Claude Code 2.1.328 sent
// (--tools Bash,Read,Edit; recorded with shared/tools/wire_recorder.py): a
// 7 KB system prompt and 7 KB of tools that every turn resends, plus the
// history, here grown to 20 turns of tool calls and results: plain, and
// with the session's History, as the adapter decodes a session's every
// request after its first (the history up to the last assistant message
// taken from the request before).
//
//	go test ./internal/agent/protocol -run '^$' -bench DecodeClaudeCode
func BenchmarkDecodeClaudeCode(b *testing.B) {
	raw, err := os.ReadFile("testdata/requests/claude_code_full_turn2.json")
	if err != nil {
		b.Fatal(err)
	}
	var req map[string]any
	if err := json.Unmarshal(raw, &req); err != nil {
		b.Fatal(err)
	}
	msgs := req["messages"].([]any)
	for k := 0; k < 18; k++ {
		msgs = append(msgs,
			map[string]any{"role": "assistant", "content": []any{
				map[string]any{"type": "text", "text": "Let me look at the next file before I change anything in it."},
				map[string]any{"type": "tool_use", "id": "toolu_" + string(rune('a'+k)), "name": "Bash",
					"input": map[string]any{"command": "sed -n 1,80p src/module.py", "description": "Show the module"}}}},
			map[string]any{"role": "user", "content": []any{map[string]any{"type": "tool_result",
				"tool_use_id": "toolu_" + string(rune('a'+k)), "is_error": false,
				"content": "def f(x):\n    return x * 2\n\n# ... 40 more lines of code of the module under test ...\n"}}})
	}
	req["messages"] = msgs
	if os.Getenv("KILN_BENCH_NO_SYSTEM_TOOLS") != "" {
		delete(req, "system")
		delete(req, "tools")
	}
	body, err := json.Marshal(req)
	if err != nil {
		b.Fatal(err)
	}
	h := http.Header{"Authorization": {"Bearer s"}}
	for _, c := range []struct {
		name string
		dec  func(http.Header, []byte) (Request, error)
	}{{"plain", DecodeAnthropic}, {"history", historyDecoder()}} {
		b.Run(c.name, func(b *testing.B) {
			b.SetBytes(int64(len(body)))
			b.ReportAllocs()
			for b.Loop() {
				if _, err := c.dec(h, body); err != nil {
					b.Fatal(err)
				}
			}
		})
	}
}

// historyDecoder decodes with one History, as the adapter does for one
// session.
func historyDecoder() func(http.Header, []byte) (Request, error) {
	h := &History{}
	return func(hd http.Header, body []byte) (Request, error) { return DecodeAnthropicHistory(hd, body, h) }
}

// BenchmarkDecodeCodex decodes a request Codex 0.169.0 sent (recorded with
// shared/tools/wire_recorder.py: its instructions travel as developer
// messages in input), its history grown to 20 rounds of reasoning, a
// command and its output; without and with the session's History.
//
//	go test ./internal/agent/protocol -run '^$' -bench DecodeCodex
func BenchmarkDecodeCodex(b *testing.B) {
	raw, err := os.ReadFile("testdata/requests/codex_full_turn2.json")
	if err != nil {
		b.Fatal(err)
	}
	var req map[string]any
	if err := json.Unmarshal(raw, &req); err != nil {
		b.Fatal(err)
	}
	items := req["input"].([]any)
	for k := 0; k < 19; k++ {
		id := "call_" + string(rune('a'+k))
		items = append(items,
			map[string]any{"type": "reasoning", "summary": []any{}, "encrypted_content": "kiln-reasoning:v1:bG9vaw=="},
			map[string]any{"type": "function_call", "call_id": id, "name": "exec_command",
				"arguments": `{"cmd":"sed -n 1,80p src/module.py","workdir":"/repo"}`},
			map[string]any{"type": "function_call_output", "call_id": id,
				"output": "Chunk ID: 1\nWall time: 0.01 seconds\nProcess exited with code 0\nOutput:\ndef f(x):\n    return x * 2\n"})
	}
	req["input"] = items
	body, err := json.Marshal(req)
	if err != nil {
		b.Fatal(err)
	}
	h := http.Header{"Authorization": {"Bearer s"}}
	hist := &History{}
	for _, tc := range []struct {
		name string
		dec  func(http.Header, []byte) (Request, error)
	}{{"plain", DecodeResponses}, {"history", func(hd http.Header, body []byte) (Request, error) {
		return DecodeResponsesHistory(hd, body, hist)
	}}} {
		b.Run(tc.name, func(b *testing.B) {
			b.SetBytes(int64(len(body)))
			b.ReportAllocs()
			for b.Loop() {
				if _, err := tc.dec(h, body); err != nil {
					b.Fatal(err)
				}
			}
		})
	}
}

// BenchmarkDecodeChatSession decodes a Chat Completions session as an
// adapter receives it: 40 requests, each the history so far plus an
// assistant tool call and its tool result (~60 KB by the end), in order,
// plain and with one History per session. Reported: time
// per request, averaged over the session.
//
//	go test ./internal/agent/protocol -run '^$' -bench DecodeChatSession
func BenchmarkDecodeChatSession(b *testing.B) {
	const turns = 40
	msgs := []any{map[string]any{"role": "system", "content": "You are a coding agent. Use the tools to inspect and edit the repository."},
		map[string]any{"role": "user", "content": "The tests in tests/test_module.py fail; fix src/module.py."}}
	tools := []any{map[string]any{"type": "function", "function": map[string]any{"name": "bash", "description": "Run a shell command",
		"parameters": map[string]any{"type": "object", "properties": map[string]any{"command": map[string]any{"type": "string"}}, "required": []any{"command"}}}}}
	var bodies [][]byte
	for k := 0; k < turns; k++ {
		body, err := json.Marshal(map[string]any{"model": "m", "messages": msgs, "tools": tools, "max_tokens": 1024})
		if err != nil {
			b.Fatal(err)
		}
		bodies = append(bodies, body)
		id := "call_" + strconv.Itoa(k)
		msgs = append(msgs,
			map[string]any{"role": "assistant", "content": "Let me look at the next part of the module.", "tool_calls": []any{
				map[string]any{"id": id, "type": "function", "function": map[string]any{"name": "bash",
					"arguments": `{"command":"sed -n 1,80p src/module.py"}`}}}},
			map[string]any{"role": "tool", "tool_call_id": id,
				"content": "def f(x):\n    return x * 2\n\n# ... 40 more lines of code of the module under test ...\n"})
	}
	h := http.Header{"Authorization": {"Bearer s"}}
	for _, tc := range []struct {
		name    string
		session func() func(http.Header, []byte) (Request, error)
	}{
		{"plain", func() func(http.Header, []byte) (Request, error) { return DecodeChat }},
		{"history", func() func(http.Header, []byte) (Request, error) {
			hist := &History{}
			return func(hd http.Header, body []byte) (Request, error) { return DecodeChatHistory(hd, body, hist) }
		}},
	} {
		b.Run(tc.name, func(b *testing.B) {
			b.ReportAllocs()
			for b.Loop() {
				dec := tc.session()
				for _, body := range bodies {
					if _, err := dec(h, body); err != nil {
						b.Fatal(err)
					}
				}
			}
			b.ReportMetric(float64(b.Elapsed().Nanoseconds())/float64(b.N*turns)/1e3, "µs/request")
		})
	}
}
