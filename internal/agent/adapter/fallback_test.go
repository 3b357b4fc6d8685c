package adapter_test

import (
	"context"
	"encoding/json"
	"net/http"
	"testing"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/kilnrl/kiln/internal/agent/adapter"
	"github.com/kilnrl/kiln/internal/agent/engine"
	"github.com/kilnrl/kiln/internal/agent/enginetest"
)

const lookupTool = `{"type":"function","function":{"name":"lookup","description":"look it up","parameters":{"properties":{"q":{"type":"string"}},"type":"object"}}}`

// canonical renders a recorded turn's prompt messages the way the adapter's
// canonical path does.
func canonical(t *testing.T, f *fixture, promptMessages string, tools ...string) []int32 {
	t.Helper()
	var msgs []json.RawMessage
	require.NoError(t, json.Unmarshal([]byte(promptMessages), &msgs))
	var ts []json.RawMessage
	for _, s := range tools {
		ts = append(ts, json.RawMessage(s))
	}
	ids, err := f.client.TokenizeChat(context.Background(), engine.ChatRequest{Messages: msgs, Tools: ts, AddGenerationPrompt: true})
	require.NoError(t, err)
	return ids
}

// docs/adapter.md §8 case 18 (a)–(f): every fallback of docs/adapter.md §3 renders canonically, and the
// cheap (hash and id) checks reject without a second /tokenize call.
func TestAnthropicFallbacksRenderCanonically(t *testing.T) {
	turn1 := enginetest.Output{Text: "Let me look.\n\n\n</think>\n\n" + lookupCall}
	cases := []struct {
		name   string
		first  enginetest.Output
		maxTok int
		edit   func(hist []any, reply []map[string]any) ([]any, []any)
	}{
		{"a-user-changed", turn1, 200, func(h []any, _ []map[string]any) ([]any, []any) {
			h[0] = map[string]any{"role": "user", "content": "find vime!"}
			return h, anthropicTools
		}},
		{"b-assistant-changed", turn1, 200, func(h []any, r []map[string]any) ([]any, []any) {
			h[1] = map[string]any{"role": "assistant", "content": []any{map[string]any{"type": "thinking", "thinking": "Other."}, r[1]}}
			return h, anthropicTools
		}},
		{"c-tools-changed", turn1, 200, func(h []any, _ []map[string]any) ([]any, []any) {
			return h, []any{map[string]any{"name": "lookup", "description": "write it",
				"input_schema": map[string]any{"type": "object", "properties": map[string]any{"q": map[string]any{"type": "string"}}}}}
		}},
		{"d-summary", turn1, 200, func(h []any, _ []map[string]any) ([]any, []any) {
			return []any{map[string]any{"role": "user", "content": "Summary: looked up vime."}, h[2]}, anthropicTools
		}},
		{"e-finish-length", turn1, 10, func(h []any, _ []map[string]any) ([]any, []any) { return h, anthropicTools }},
		{"f-last-not-special", enginetest.Output{Text: "Let me look.\n</think>\n\n" + lookupCall, NoEnd: true, FinishReason: "stop"}, 200,
			func(h []any, _ []map[string]any) ([]any, []any) { return h, anthropicTools }},
	}
	for _, tc := range cases {
		t.Run(tc.name, func(t *testing.T) {
			f := qwenFixture(t, enginetest.SequenceOutputs(tc.first, enginetest.Output{Text: "Done."}),
				adapter.Options{ReasoningParser: "qwen3", ToolParser: "qwen3_coder"})
			user := map[string]any{"role": "user", "content": "find vime"}
			r1 := f.post(t, "/v1/messages", "s", map[string]any{"max_tokens": tc.maxTok, "tools": anthropicTools, "messages": []any{user}})
			require.Equal(t, http.StatusOK, r1.status, string(r1.body))
			var m1 struct {
				Content []map[string]any `json:"content"`
			}
			require.NoError(t, json.Unmarshal(r1.body, &m1))
			useID := "toolu_x"
			if len(m1.Content) > 1 {
				useID = m1.Content[len(m1.Content)-1]["id"].(string)
			}
			for len(m1.Content) < 2 {
				m1.Content = append(m1.Content, map[string]any{"type": "text", "text": "x"})
			}
			hist := []any{user, map[string]any{"role": "assistant", "content": m1.Content},
				map[string]any{"role": "user", "content": []any{map[string]any{"type": "tool_result", "tool_use_id": useID, "content": "result"}}}}
			hist, tools := tc.edit(hist, m1.Content)
			before := f.tokenizeCalls()
			r2 := f.post(t, "/v1/messages", "s", map[string]any{"max_tokens": 200, "tools": tools, "messages": hist})
			require.Equal(t, http.StatusOK, r2.status, string(r2.body))
			assert.Equal(t, 1, f.tokenizeCalls()-before, "no anchor render for a rejected prefix")
			turns, err := f.ad.Finish("s")
			require.NoError(t, err)
			require.Len(t, turns, 2)
			toolJSON := lookupTool
			if tc.name == "c-tools-changed" {
				toolJSON = `{"type":"function","function":{"name":"lookup","description":"write it","parameters":{"properties":{"q":{"type":"string"}},"type":"object"}}}`
			}
			assert.Equal(t, canonical(t, f, turns[1].PromptMessages, toolJSON), turns[1].PromptIDs)
		})
	}
}

// anthropicTurn1 sends the first request of a tool session and returns the
// reply's content blocks.
func anthropicTurn1(t *testing.T, f *fixture, sid string) []map[string]any {
	t.Helper()
	r := f.post(t, "/v1/messages", sid, map[string]any{"max_tokens": 200, "tools": anthropicTools,
		"messages": []any{map[string]any{"role": "user", "content": "find vime"}}})
	require.Equal(t, http.StatusOK, r.status, string(r.body))
	var m struct {
		Content []map[string]any `json:"content"`
	}
	require.NoError(t, json.Unmarshal(r.body, &m))
	return m.Content
}

// anthropicTurn2 echoes content and answers its call with result.
func anthropicTurn2(t *testing.T, f *fixture, sid string, content []map[string]any, result string) {
	t.Helper()
	hist := []any{map[string]any{"role": "user", "content": "find vime"}, map[string]any{"role": "assistant", "content": content},
		map[string]any{"role": "user", "content": []any{map[string]any{"type": "tool_result",
			"tool_use_id": content[len(content)-1]["id"], "content": result}}}}
	r := f.post(t, "/v1/messages", sid, map[string]any{"max_tokens": 200, "tools": anthropicTools, "messages": hist})
	require.Equal(t, http.StatusOK, r.status, string(r.body))
}

// docs/adapter.md §8 case 19: two branches after the same turn both reuse the root's
// tokens and never see each other's suffix.
func TestAnthropicSiblingBranches(t *testing.T) {
	f := qwenFixture(t, enginetest.Sequence("A.\n</think>\n\n"+lookupCall, "left.\n</think>\n\nL", "right.\n</think>\n\nR"),
		adapter.Options{ReasoningParser: "qwen3", ToolParser: "qwen3_coder"})
	c := anthropicTurn1(t, f, "s")
	anthropicTurn2(t, f, "s", c, "left branch")
	anthropicTurn2(t, f, "s", c, "right branch")
	turns, err := f.ad.Finish("s")
	require.NoError(t, err)
	require.Len(t, turns, 3)
	root := concat(turns[0].PromptIDs, turns[0].OutputIDs)
	for _, tr := range turns[1:] {
		assert.Equal(t, root, tr.PromptIDs[:len(root)])
	}
	text, err := f.client.Detokenize(context.Background(), turns[2].PromptIDs)
	require.NoError(t, err)
	assert.Contains(t, text, "right branch")
	assert.NotContains(t, text, "left branch")
}

// docs/adapter.md §8 case 20: two stored prefixes with identical messages but different
// output ids (whitespace the parser trims) are ambiguous: canonical render,
// decided without an anchor render.
func TestAnthropicAmbiguousPrefixes(t *testing.T) {
	f := qwenFixture(t, enginetest.Sequence("A.\n</think>\n\n"+lookupCall, "A.\n</think>\n\n\n"+lookupCall, "done"),
		adapter.Options{ReasoningParser: "qwen3", ToolParser: "qwen3_coder"})
	c0 := anthropicTurn1(t, f, "s")
	c1 := anthropicTurn1(t, f, "s")
	require.Equal(t, c0[0], c1[0])
	before := f.tokenizeCalls()
	anthropicTurn2(t, f, "s", c0, "result")
	assert.Equal(t, 1, f.tokenizeCalls()-before)
	turns, err := f.ad.Finish("s")
	require.NoError(t, err)
	require.Len(t, turns, 3)
	require.NotEqual(t, turns[0].OutputIDs, turns[1].OutputIDs)
	assert.Equal(t, canonical(t, f, turns[2].PromptMessages, lookupTool), turns[2].PromptIDs)
}
