package adapter_test

import (
	"encoding/json"
	"fmt"
	"net/http"
	"testing"
	"unsafe"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/kilnrl/kiln/formats/records"
	"github.com/kilnrl/kiln/internal/agent/adapter"
	"github.com/kilnrl/kiln/internal/agent/enginetest"
)

// A session whose every turn is reused with the model's own tokens (its
// whitespace is not the template's, so no prompt is a render): each prompt
// begins with the last one's prompt+output, and the recorded prompts are
// views of one array, not a copy each: memory per session about its
// longest prompt, not the sum of all of them.
func TestReusedPromptsShareOneArray(t *testing.T) {
	const turns = 12
	var outs []string
	for i := range turns - 1 {
		outs = append(outs, fmt.Sprintf("Step %d.\n\n\n</think>\n\n", i)+lookupCall)
	}
	outs = append(outs, "Done.\n</think>\n\nIt is vime.")
	f := qwenFixture(t, enginetest.Sequence(outs...), adapter.Options{ReasoningParser: "qwen3", ToolParser: "qwen3_coder"})

	hist := []any{map[string]any{"role": "user", "content": "find vime"}}
	for i := range turns {
		r := f.post(t, "/v1/messages", "s", map[string]any{"max_tokens": 200, "tools": anthropicTools, "messages": hist})
		require.Equal(t, http.StatusOK, r.status, string(r.body))
		var m struct {
			Content []map[string]any `json:"content"`
		}
		require.NoError(t, json.Unmarshal(r.body, &m))
		if i == turns-1 {
			break
		}
		require.Len(t, m.Content, 2, "turn %d", i)
		hist = append(hist, map[string]any{"role": "assistant", "content": m.Content},
			map[string]any{"role": "user", "content": []any{map[string]any{"type": "tool_result",
				"tool_use_id": m.Content[1]["id"], "content": fmt.Sprintf("result %d", i)}}})
	}
	recorded, err := f.ad.Finish("s")
	require.NoError(t, err)
	require.Len(t, recorded, turns)

	arrays := map[*int32]bool{}
	for i, tr := range recorded {
		arrays[unsafe.SliceData(tr.PromptIDs)] = true
		if i == 0 {
			continue
		}
		prev := concat(recorded[i-1].PromptIDs, recorded[i-1].OutputIDs)
		require.Greater(t, len(tr.PromptIDs), len(prev), "turn %d", i)
		require.Equal(t, prev, tr.PromptIDs[:len(prev)], "turn %d begins with turn %d's prompt+output", i, i-1)
	}
	assert.Equal(t, f.prompts(t), promptsOf(recorded), "recorded prompts are what the engine got")
	assert.Len(t, arrays, 1, "the recorded prompts share one array")
}

func promptsOf(turns []records.Turn) [][]int32 {
	var out [][]int32
	for _, t := range turns {
		out = append(out, t.PromptIDs)
	}
	return out
}
