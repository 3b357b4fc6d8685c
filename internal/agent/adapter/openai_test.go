package adapter_test

import (
	"context"
	"encoding/json"
	"net/http"
	"testing"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/kilnrl/kiln/internal/agent/adapter"
	"github.com/kilnrl/kiln/internal/agent/enginetest"
)

var responsesTools = []any{map[string]any{"type": "function", "name": "lookup", "description": "look it up",
	"parameters": map[string]any{"type": "object", "properties": map[string]any{"q": map[string]any{"type": "string"}}}}}

var chatTools = []any{map[string]any{"type": "function", "function": map[string]any{"name": "lookup", "description": "look it up",
	"parameters": map[string]any{"type": "object", "properties": map[string]any{"q": map[string]any{"type": "string"}}}}}}

// docs/adapter.md §8 cases 16/17/21 for Responses: a two-turn tool session reuses turn 1's
// prompt+output ids. Responses drops reasoning from the echoed message, so
// with a Qwen3 template reuse needs the reasoning to stay in the visible
// text: no reasoning parser here (see doc.go). Both JSON and SSE.
func TestResponsesToolSessionReusesPrefix(t *testing.T) {
	for _, stream := range []bool{false, true} {
		name := map[bool]string{false: "json", true: "sse"}[stream]
		t.Run(name, func(t *testing.T) {
			f := qwenFixture(t, enginetest.Sequence("Let me look.\n\n</think>\n\n"+lookupCall, "Fixed."),
				adapter.Options{ToolParser: "qwen3_coder"})
			user := map[string]any{"type": "message", "role": "user", "content": "find vime"}
			r1 := f.post(t, "/v1/responses", "s", map[string]any{"model": "m", "store": false, "tools": responsesTools, "input": []any{user}})
			require.Equal(t, http.StatusOK, r1.status, string(r1.body))
			var resp struct {
				Output []map[string]any `json:"output"`
			}
			require.NoError(t, json.Unmarshal(r1.body, &resp))
			require.Len(t, resp.Output, 2)
			assert.Equal(t, "message", resp.Output[0]["type"])
			fc := resp.Output[1]
			assert.Equal(t, "function_call", fc["type"])
			assert.Equal(t, "lookup", fc["name"])

			input := []any{user, resp.Output[0], fc, map[string]any{"type": "function_call_output", "call_id": fc["call_id"], "output": "result"}}
			before := f.tokenizeCalls()
			r2 := f.post(t, "/v1/responses", "s", map[string]any{"model": "m", "store": false, "stream": stream, "tools": responsesTools, "input": input})
			require.Equal(t, http.StatusOK, r2.status, string(r2.body))
			assert.LessOrEqual(t, f.tokenizeCalls()-before, 2)
			if stream {
				assert.Equal(t, "text/event-stream", r2.header.Get("Content-Type"))
				ev := parseSSE(t, r2.body)
				require.NotEmpty(t, ev)
				assert.Equal(t, "response.created", ev[0].event)
				assert.Equal(t, "response.completed", ev[len(ev)-1].event)
				for i, e := range ev { // docs/adapter.md §8 case 22: contiguous sequence numbers
					var d struct {
						Type string `json:"type"`
						Seq  int    `json:"sequence_number"`
					}
					require.NoError(t, json.Unmarshal([]byte(e.data), &d))
					assert.Equal(t, i, d.Seq)
					assert.Equal(t, e.event, d.Type)
				}
			} else {
				assert.Contains(t, string(r2.body), "Fixed.")
			}
			turns, err := f.ad.Finish("s")
			require.NoError(t, err)
			require.Len(t, turns, 2)
			root := concat(turns[0].PromptIDs, turns[0].OutputIDs)
			assert.Equal(t, root, turns[1].PromptIDs[:len(root)])
			rest, err := f.client.Detokenize(context.Background(), turns[1].PromptIDs[len(root):])
			require.NoError(t, err)
			assert.Equal(t, "\n<|im_start|>user\n<tool_response>\nresult\n</tool_response><|im_end|>\n<|im_start|>assistant\n<think>\n", rest)
			assert.NotEqual(t, canonical(t, f, turns[1].PromptMessages, lookupTool)[:len(root)], root, "reuse, not a coincidence")
		})
	}
}

// docs/adapter.md §3 fallbacks for Responses: a changed history renders canonically; with
// the qwen3 reasoning parser the echoed message has no reasoning, the
// template renders it differently once a tool result follows, and step 5
// fails (one anchor render, then the canonical prompt).
func TestResponsesFallbacks(t *testing.T) {
	for _, tc := range []struct {
		name      string
		reasoning string
		edit      bool
		tokenize  int
	}{{"history-changed", "", true, 1}, {"reasoning-dropped", "qwen3", false, 2}} {
		t.Run(tc.name, func(t *testing.T) {
			f := qwenFixture(t, enginetest.Sequence("Let me look.\n</think>\n\n"+lookupCall, "Fixed."),
				adapter.Options{ReasoningParser: tc.reasoning, ToolParser: "qwen3_coder"})
			user := map[string]any{"type": "message", "role": "user", "content": "find vime"}
			r1 := f.post(t, "/v1/responses", "s", map[string]any{"store": false, "tools": responsesTools, "input": []any{user}})
			require.Equal(t, http.StatusOK, r1.status, string(r1.body))
			var resp struct {
				Output []map[string]any `json:"output"`
			}
			require.NoError(t, json.Unmarshal(r1.body, &resp))
			fc := resp.Output[len(resp.Output)-1]
			first := any(user)
			if tc.edit {
				first = map[string]any{"type": "message", "role": "user", "content": "find vime, please"}
			}
			input := append([]any{first}, anySlice(resp.Output)...)
			input = append(input, map[string]any{"type": "function_call_output", "call_id": fc["call_id"], "output": "result"})
			before := f.tokenizeCalls()
			r2 := f.post(t, "/v1/responses", "s", map[string]any{"store": false, "tools": responsesTools, "input": input})
			require.Equal(t, http.StatusOK, r2.status, string(r2.body))
			assert.Equal(t, tc.tokenize, f.tokenizeCalls()-before)
			turns, err := f.ad.Finish("s")
			require.NoError(t, err)
			require.Len(t, turns, 2)
			assert.Equal(t, canonical(t, f, turns[1].PromptMessages, lookupTool), turns[1].PromptIDs)
		})
	}
}

func anySlice[T any](in []T) []any {
	out := make([]any, len(in))
	for i, v := range in {
		out[i] = v
	}
	return out
}

// docs/adapter.md §8 cases 27, 28 and docs/adapter.md §3 for Chat Completions: a two-turn tool session
// (JSON then SSE). Chat's echoed assistant message is content "" plus the
// first call, without reasoning, so a Qwen3 template renders it
// differently once a tool result follows: the turn falls back to the
// canonical render after one anchor attempt (the reference behaves the same,
// docs/adapter.md §3 "echoing reasoning_content (Chat Completions ...)"). A changed history
// falls back without an anchor render.
func TestChatToolSession(t *testing.T) {
	f := qwenFixture(t, enginetest.Sequence("Let me look.\n</think>\n\nuse it "+lookupCall, "streamed text", "again"),
		adapter.Options{ReasoningParser: "qwen3", ToolParser: "qwen3_coder"})
	user := map[string]any{"role": "user", "content": "find vime"}
	r1 := f.post(t, "/v1/chat/completions", "s", map[string]any{"model": "m", "tools": chatTools, "messages": []any{user}})
	require.Equal(t, http.StatusOK, r1.status, string(r1.body))
	var c struct {
		Choices []struct {
			Message      map[string]any `json:"message"`
			FinishReason string         `json:"finish_reason"`
		} `json:"choices"`
		Usage map[string]int `json:"usage"`
	}
	require.NoError(t, json.Unmarshal(r1.body, &c))
	require.Len(t, c.Choices, 1)
	assert.Equal(t, "tool_calls", c.Choices[0].FinishReason)
	msg := c.Choices[0].Message
	assert.Nil(t, msg["content"])
	calls := msg["tool_calls"].([]any)
	require.Len(t, calls, 1)
	callID := calls[0].(map[string]any)["id"]

	echo := map[string]any{"role": "assistant", "content": nil, "tool_calls": calls}
	hist := []any{user, echo, map[string]any{"role": "tool", "tool_call_id": callID, "content": "result"}}
	before := f.tokenizeCalls()
	r2 := f.post(t, "/v1/chat/completions", "s", map[string]any{"model": "m", "stream": true, "tools": chatTools, "messages": hist})
	require.Equal(t, http.StatusOK, r2.status, string(r2.body))
	assert.LessOrEqual(t, f.tokenizeCalls()-before, 2)
	ev := parseSSE(t, r2.body)
	require.GreaterOrEqual(t, len(ev), 3)
	assert.Equal(t, "[DONE]", ev[len(ev)-1].data)
	assert.Contains(t, string(r2.body), "streamed text")

	hist[0] = map[string]any{"role": "user", "content": "find it"}
	before = f.tokenizeCalls()
	r3 := f.post(t, "/v1/chat/completions", "s", map[string]any{"model": "m", "tools": chatTools, "messages": hist})
	require.Equal(t, http.StatusOK, r3.status, string(r3.body))
	assert.Equal(t, 1, f.tokenizeCalls()-before)

	turns, err := f.ad.Finish("s")
	require.NoError(t, err)
	require.Len(t, turns, 3)
	assert.JSONEq(t, `{"role":"assistant","content":"","tool_calls":[{"type":"function","function":{"name":"lookup","arguments":{"q":"vime"}}}]}`, *turns[0].ResponseMessage)
	for _, tr := range turns[1:] {
		assert.Equal(t, canonical(t, f, tr.PromptMessages, lookupTool), tr.PromptIDs)
	}
}

// docs/adapter.md §8 case 13 and 14: the Anthropic SSE stream, by body.stream and by the
// Accept header.
func TestAnthropicStream(t *testing.T) {
	f := qwenFixture(t, constant("r\n</think>\n\nt "+lookupCall), adapter.Options{ReasoningParser: "qwen3", ToolParser: "qwen3_coder"})
	want := []string{"message_start",
		"content_block_start", "content_block_delta", "content_block_stop",
		"content_block_start", "content_block_delta", "content_block_stop",
		"content_block_start", "content_block_delta", "content_block_stop",
		"message_delta", "message_stop"}
	msgs := []any{map[string]any{"role": "user", "content": "go"}}
	for i, r := range []response{
		f.post(t, "/v1/messages", "s1", map[string]any{"max_tokens": 100, "stream": true, "tools": anthropicTools, "messages": msgs}),
		func() response {
			b, _ := json.Marshal(map[string]any{"max_tokens": 100, "tools": anthropicTools, "messages": msgs})
			return f.do(t, http.MethodPost, "/v1/messages", "s2", string(b), "Accept", "text/event-stream")
		}(),
	} {
		require.Equal(t, http.StatusOK, r.status, "request %d: %s", i, r.body)
		assert.Equal(t, "text/event-stream", r.header.Get("Content-Type"))
		assert.Equal(t, "no-cache", r.header.Get("Cache-Control"))
		ev := parseSSE(t, r.body)
		var names []string
		for _, e := range ev {
			names = append(names, e.event)
			var d struct {
				Type string `json:"type"`
			}
			require.NoError(t, json.Unmarshal([]byte(e.data), &d))
			assert.Equal(t, e.event, d.Type)
		}
		assert.Equal(t, want, names)
		assert.Contains(t, ev[1].data, `"thinking"`)
		assert.Contains(t, ev[7].data, `"tool_use"`)
		assert.Contains(t, ev[10].data, `"stop_reason":"tool_use"`)
	}
	for _, sid := range []string{"s1", "s2"} {
		turns, err := f.ad.Finish(sid)
		require.NoError(t, err)
		assert.Len(t, turns, 1)
	}
}
