package rollout

import (
	"context"
	"errors"
	"io"
	"testing"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/kilnrl/kiln/formats/dataset"
	"github.com/kilnrl/kiln/formats/records"
	"github.com/kilnrl/kiln/formats/store"
)

func replayTurns() []records.Turn {
	// Rollout 7's turns out of order (as shards may hold them); rollout 8
	// has one turn.
	return []records.Turn{
		{RolloutID: 7, Session: "a", Turn: 1, PromptIDs: []int32{1, 2, 3, 10, 11, 4}, OutputIDs: []int32{12}, OutputLogProbs: []float32{-0.5}, FinishReason: "stop", PromptMessages: "[]"},
		{RolloutID: 7, Session: "a", Turn: 0, PromptIDs: []int32{1, 2, 3}, OutputIDs: []int32{10, 11}, OutputLogProbs: []float32{-0.1, -0.2}, FinishReason: "stop", PromptMessages: "[]"},
		{RolloutID: 8, Session: "b", Turn: 0, PromptIDs: []int32{5}, OutputIDs: []int32{6}, OutputLogProbs: []float32{-1}, FinishReason: "stop", PromptMessages: "[]"},
	}
}

// TestReplayBookNext: a recorded prompt gets its recorded turn back; any
// other names the rollout, the turn and the first differing position.
func TestReplayBookNext(t *testing.T) {
	b, err := newReplayBook(replayTurns())
	require.NoError(t, err)
	tests := []struct {
		name      string
		rollout   int64
		turn      int
		prompt    []int32
		wantOut   []int32
		wantPos   int
		wantError string
	}{
		{name: "first turn", rollout: 7, turn: 0, prompt: []int32{1, 2, 3}, wantOut: []int32{10, 11}},
		{name: "second turn", rollout: 7, turn: 1, prompt: []int32{1, 2, 3, 10, 11, 4}, wantOut: []int32{12}},
		{name: "other run", rollout: 8, turn: 0, prompt: []int32{5}, wantOut: []int32{6}},
		{name: "changed token", rollout: 7, turn: 1, prompt: []int32{1, 2, 3, 10, 99, 4}, wantPos: 4,
			wantError: "replay: rollout 7 turn 1: prompt token 4 is 99, the recorded one 11"},
		{name: "shorter prompt", rollout: 7, turn: 1, prompt: []int32{1, 2, 3, 10}, wantPos: 4,
			wantError: "replay: rollout 7 turn 1: the prompt has 4 tokens, the recorded one 6; they agree up to position 4"},
		{name: "longer prompt", rollout: 7, turn: 0, prompt: []int32{1, 2, 3, 4}, wantPos: 3,
			wantError: "replay: rollout 7 turn 0: the prompt has 4 tokens, the recorded one 3; they agree up to position 3"},
		{name: "extra turn", rollout: 7, turn: 2, prompt: []int32{1}, wantPos: -1,
			wantError: "replay: rollout 7 turn 2 was never recorded: the recording has 2 turns of this rollout"},
		{name: "unknown rollout", rollout: 9, turn: 0, prompt: []int32{1}, wantPos: -1,
			wantError: "replay: rollout 9 turn 0: the recording has no turn of this rollout"},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			got, err := b.next(tt.rollout, tt.turn, tt.prompt)
			if tt.wantError == "" {
				require.NoError(t, err)
				assert.Equal(t, tt.wantOut, got.OutputIDs)
				assert.Equal(t, tt.turn, int(got.Turn))
				return
			}
			require.EqualError(t, err, tt.wantError)
			var m *replayMismatchError
			require.True(t, errors.As(err, &m))
			assert.Equal(t, tt.wantPos, m.Position)
			assert.Equal(t, tt.turn, m.Turn)
		})
	}
}

func TestReplayBookGap(t *testing.T) {
	_, err := newReplayBook([]records.Turn{{RolloutID: 3, Turn: 0}, {RolloutID: 3, Turn: 2}})
	require.EqualError(t, err, "rollout 3: turn 2 where turn 1 was expected: a replay needs every turn of a run, numbered from 0 (replay the turns version kiln-rollout run committed)")
}

func TestReplayRef(t *testing.T) {
	ref, ok := replayRef("replay://rollout/step-0/turns@abc")
	assert.True(t, ok)
	assert.Equal(t, "rollout/step-0/turns@abc", ref)
	_, ok = replayRef("http://127.0.0.1:8000")
	assert.False(t, ok)
}

// TestLoadReplayBook reads a committed turns version back, and refuses a
// version of another kind.
func TestLoadReplayBook(t *testing.T) {
	st, err := store.Open(t.TempDir())
	require.NoError(t, err)
	ctx := context.Background()
	write := func(name string, kind records.Kind, encode func(io.Writer) error) string {
		w, err := dataset.NewWriter(ctx, st, dataset.Spec{Name: name, Kind: kind, Identity: dataset.Identity{Stage: "rollout", CodeVersion: "1"}})
		require.NoError(t, err)
		_, err = w.WriteShard(ctx, 3, nil, encode)
		require.NoError(t, err)
		res, err := w.Commit(ctx, nil)
		require.NoError(t, err)
		return res.Ref.String()
	}
	ref := write("rollout/r/turns", records.TurnsKind(), func(out io.Writer) error {
		enc, err := records.NewTurnEncoder(out, records.ArrowOptions{})
		if err != nil {
			return err
		}
		if err := enc.Write(replayTurns()...); err != nil {
			return err
		}
		return enc.Close()
	})
	b, err := loadReplayBook(ctx, st, ref)
	require.NoError(t, err)
	got, err := b.next(7, 1, []int32{1, 2, 3, 10, 11, 4})
	require.NoError(t, err)
	assert.Equal(t, []float32{-0.5}, got.OutputLogProbs)

	_, err = loadReplayBook(ctx, st, "no such ref")
	require.Error(t, err)
	assert.Contains(t, err.Error(), "replay://NAME/turns@VERSION")
}
