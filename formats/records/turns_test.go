package records

import (
	"bytes"
	"encoding/json"
	"testing"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
)

func TestTurnsRoundTrip(t *testing.T) {
	resp := `{"role":"assistant","content":"ok","tool_calls":[{"id":"c1"}]}`
	reward, started := 0.5, int64(1700000000000)
	want := []Turn{
		{RolloutID: 3, Index: 3, GroupIndex: 1, Session: "s-3", Turn: 0,
			PromptIDs: []int32{1, 2, 3}, OutputIDs: []int32{4, 5}, OutputLogProbs: []float32{-0.1, -0.2},
			FinishReason: "tool_calls", PromptMessages: `[{"role":"user","content":"é"}]`, ResponseMessage: &resp,
			MaxContextTokens: 32768, StartedMs: &started},
		{RolloutID: 3, Index: 3, GroupIndex: 1, Session: "s-3", Turn: 1,
			PromptIDs: []int32{1, 2, 3, 4, 5, 6}, OutputIDs: []int32{}, OutputLogProbs: []float32{}, FinishReason: "length", IllFormed: true,
			PromptMessages: `[]`, Reward: &reward,
			Replay: Replay{TopPTokenIDs: []int32{}, TopPTokenOffsets: []int32{0}}},
	}
	var buf bytes.Buffer
	enc, err := NewTurnEncoder(&buf, ArrowOptions{})
	require.NoError(t, err)
	require.NoError(t, enc.Write(want...))
	require.NoError(t, enc.Close())
	var got []Turn
	require.NoError(t, EachTurn(buf.Bytes(), func(tr *Turn) error { got = append(got, *tr); return nil }))
	require.Equal(t, want, got)

	// The JSON view converts back to the same turn.
	row, err := got[0].MarshalRow()
	require.NoError(t, err)
	var j TurnJSON
	require.NoError(t, json.Unmarshal(row, &j))
	back, err := j.ToTurn(9)
	require.NoError(t, err)
	assert.Equal(t, want[0], back)
	assert.Contains(t, string(row), `"prompt_messages":[{"role":"user","content":"é"}]`)
}

func TestTurnValidate(t *testing.T) {
	cases := []struct {
		name string
		turn Turn
		want string
	}{
		{"no session", Turn{PromptMessages: "[]"}, "empty session"},
		{"logprob count", Turn{Session: "s", PromptMessages: "[]", OutputIDs: []int32{1, 2}, OutputLogProbs: []float32{-1}}, "output_log_probs has 1 entries for 2 output ids"},
		{"messages", Turn{Session: "s", PromptMessages: "{}"}, "prompt_messages is not a JSON array"},
		{"messages not JSON", Turn{Session: "s", PromptMessages: `[{"role":"user"},`}, "prompt_messages is not a JSON array"},
		{"offsets", Turn{Session: "s", PromptMessages: "[]", OutputIDs: []int32{1}, Replay: Replay{TopPTokenOffsets: []int32{0}}}, "rollout_top_p_token_offsets has 1 entries, want 2"},
	}
	for _, c := range cases {
		t.Run(c.name, func(t *testing.T) {
			enc, err := NewTurnEncoder(&bytes.Buffer{}, ArrowOptions{})
			require.NoError(t, err)
			assert.ErrorContains(t, enc.Write(c.turn), c.want)
		})
	}
}
