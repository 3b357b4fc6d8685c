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

// The turn-1 output: reasoning with non-canonical whitespace (the template
// would render one "\n" before </think>), then a qwen3_coder call.
const lookupCall = "<tool_call>\n<function=lookup>\n<parameter=q>\nvime\n</parameter>\n</function>\n</tool_call>"

var anthropicTools = []any{map[string]any{"name": "lookup", "description": "look it up",
	"input_schema": map[string]any{"type": "object", "properties": map[string]any{"q": map[string]any{"type": "string"}}}}}

func qwenFixture(t *testing.T, script enginetest.Script, ao adapter.Options) *fixture {
	t.Helper()
	return newFixture(t, enginetest.Options{MaxModelLen: 4096, Script: script,
		Template: enginetest.ChatTemplate{ToolCallStyle: enginetest.Qwen3CoderXML, OpenThinkInGenerationPrompt: true}}, ao)
}

// docs/adapter.md §8 cases 1, 16, 17 (Anthropic): two turns of a tool session; turn 2's
// prompt is turn 1's prompt+output ids plus only the new suffix, at most two
// /tokenize calls per turn, and Finish returns both turns with every field.
func TestAnthropicToolSessionReusesPrefix(t *testing.T) {
	f := qwenFixture(t, enginetest.Sequence("Let me look.\n\n\n</think>\n\n"+lookupCall, "Found it.\n</think>\n\nIt is vime."),
		adapter.Options{ReasoningParser: "qwen3", ToolParser: "qwen3_coder"})
	require.NoError(t, f.ad.Open("sid-a", adapter.SessionOptions{RolloutID: 3, Index: 4, GroupIndex: 5, MaxContextTokens: 3000}))

	user := map[string]any{"role": "user", "content": "find vime"}
	r1 := f.post(t, "/v1/messages?beta=true", "sid-a", map[string]any{"model": "m", "max_tokens": 200,
		"tools": anthropicTools, "messages": []any{user}})
	require.Equal(t, http.StatusOK, r1.status, string(r1.body))
	assert.Equal(t, 1, f.tokenizeCalls(), "first turn: one canonical render")
	var m1 struct {
		Content    []map[string]any `json:"content"`
		StopReason string           `json:"stop_reason"`
		Usage      map[string]int   `json:"usage"`
	}
	require.NoError(t, json.Unmarshal(r1.body, &m1))
	assert.Equal(t, "tool_use", m1.StopReason)
	require.Len(t, m1.Content, 2)
	assert.Equal(t, "thinking", m1.Content[0]["type"])
	assert.Equal(t, "tool_use", m1.Content[1]["type"])
	assert.Equal(t, map[string]any{"q": "vime"}, m1.Content[1]["input"])

	// The client echoes the reply blocks and answers the call.
	hist := []any{user, map[string]any{"role": "assistant", "content": m1.Content},
		map[string]any{"role": "user", "content": []any{map[string]any{"type": "tool_result",
			"tool_use_id": m1.Content[1]["id"], "content": "result"}}}}
	before := f.tokenizeCalls()
	r2 := f.post(t, "/v1/messages", "sid-a", map[string]any{"model": "m", "max_tokens": 200,
		"tools": anthropicTools, "messages": hist})
	require.Equal(t, http.StatusOK, r2.status, string(r2.body))
	assert.LessOrEqual(t, f.tokenizeCalls()-before, 2, "reuse path: at most two /tokenize calls")
	assert.Contains(t, string(r2.body), "It is vime.")

	turns, err := f.ad.Finish("sid-a")
	require.NoError(t, err)
	require.Len(t, turns, 2)
	p0, o0 := turns[0].PromptIDs, turns[0].OutputIDs
	p1 := turns[1].PromptIDs
	require.Greater(t, len(p1), len(p0)+len(o0))
	assert.Equal(t, concat(p0, o0), p1[:len(p0)+len(o0)], "turn 2 begins with turn 1's prompt+output")
	prompts := f.prompts(t)
	require.Len(t, prompts, 2)
	assert.Equal(t, p1, prompts[1], "recorded prompt is what the engine got")

	ctx := context.Background()
	rest, err := f.client.Detokenize(ctx, p1[len(p0)+len(o0):])
	require.NoError(t, err)
	assert.Equal(t, "\n<|im_start|>user\n<tool_response>\nresult\n</tool_response><|im_end|>\n<|im_start|>assistant\n<think>\n", rest)

	// The canonical render differs (the model's whitespace is not the
	// template's), so this is reuse, not coincidence (docs/adapter.md §8 case 17).
	var msgs []json.RawMessage
	require.NoError(t, json.Unmarshal([]byte(turns[1].PromptMessages), &msgs))
	tools := []json.RawMessage{json.RawMessage(`{"type":"function","function":{"name":"lookup","description":"look it up","parameters":{"properties":{"q":{"type":"string"}},"type":"object"}}}`)}
	canon, err := f.client.TokenizeChat(ctx, engine.ChatRequest{Messages: msgs, Tools: tools, AddGenerationPrompt: true})
	require.NoError(t, err)
	assert.NotEqual(t, canon[:min(len(canon), len(p0)+len(o0))], concat(p0, o0))

	// Every field of the records.
	for i, tr := range turns {
		assert.Equal(t, int64(3), tr.RolloutID)
		assert.Equal(t, int64(4), tr.Index)
		assert.Equal(t, int64(5), tr.GroupIndex)
		assert.Equal(t, "sid-a", tr.Session)
		assert.Equal(t, int32(i), tr.Turn)
		assert.Equal(t, "stop", tr.FinishReason)
		assert.False(t, tr.IllFormed)
		assert.Len(t, tr.OutputLogProbs, len(tr.OutputIDs))
		assert.Equal(t, int32(3000), tr.MaxContextTokens)
		require.NotNil(t, tr.ResponseMessage)
		assert.True(t, json.Valid([]byte(tr.PromptMessages)))
		assert.NotNil(t, tr.StartedMs)
		assert.Equal(t, int32(enginetest.IMEnd), tr.OutputIDs[len(tr.OutputIDs)-1])
	}
	assert.Len(t, msgs, 3)
	assert.JSONEq(t, `{"role":"assistant","content":"","reasoning_content":"Let me look.\n\n\n","tool_calls":[{"type":"function","function":{"name":"lookup","arguments":{"q":"vime"}}}]}`, *turns[0].ResponseMessage)
	assert.JSONEq(t, `[{"role":"user","content":"find vime"}]`, turns[0].PromptMessages)

	// docs/adapter.md §8 case 38: finished sessions answer 503 and Finish is idempotent.
	again, err := f.ad.Finish("sid-a")
	require.NoError(t, err)
	assert.Empty(t, again)
	r3 := f.post(t, "/v1/messages", "sid-a", map[string]any{"max_tokens": 5, "messages": []any{user}})
	assert.Equal(t, http.StatusServiceUnavailable, r3.status)
	assert.Contains(t, string(r3.body), "session closed")
}
