package records

import (
	"bytes"
	"encoding/json"
	"math"
	"testing"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
)

func sampleTrajectories() []Trajectory {
	reward := 1.0
	return []Trajectory{
		{RolloutID: 7, Index: 7, GroupIndex: 2, Segment: 0,
			Tokens: []int32{1, 2, 3, 4, 5, 6}, ResponseLength: 3,
			LossMask: []uint8{1, 0, 1}, RolloutLogProbs: []float32{-0.5, 0, -1.25},
			UseTool: true},
		{RolloutID: 7, Index: 7, GroupIndex: 2, Segment: 1,
			Tokens: []int32{1, 2, 9, 10}, ResponseLength: 2,
			LossMask: []uint8{0, 1}, RolloutLogProbs: []float32{0, -0.01},
			Truncated: true, IllFormed: true, Reward: &reward,
			Replay: Replay{TopPTokenIDs: []int32{10, 11}, TopPTokenOffsets: []int32{0, 0, 2}, TopPLogProbs: []float32{-0.01, -4}, TopKTokenIDs: []int32{0, 1, 10, 3}, TopKLogProbs: []float32{-0.7, -0.7, -0.01, -5}, TopK: 2, RoutedExperts: []int32{1, 2, 3, 4, 5, 6}, RoutedExpertsShape: []int32{3, 1, 2}}},
	}
}

func TestTrajectoriesRoundTrip(t *testing.T) {
	for _, opts := range []ArrowOptions{{}, {Uncompressed: true}, {BatchTokens: 1}} {
		var buf bytes.Buffer
		enc, err := NewTrajectoryEncoder(&buf, opts)
		require.NoError(t, err)
		want := sampleTrajectories()
		require.NoError(t, enc.Write(want...))
		require.NoError(t, enc.Close())
		var got []Trajectory
		require.NoError(t, EachTrajectory(buf.Bytes(), func(tr *Trajectory) error {
			got = append(got, *tr)
			return nil
		}))
		require.Equal(t, want, got, "options %+v", opts)
	}
}

func TestTrajectoryJSONView(t *testing.T) {
	tr := sampleTrajectories()[0]
	row, err := tr.MarshalRow()
	require.NoError(t, err)
	assert.JSONEq(t, `{"rollout_id":7,"index":7,"group_index":2,"segment":0,"tokens":[1,2,3,4,5,6],
		"response_length":3,"loss_mask":[1,0,1],"rollout_log_probs":[-0.5,0,-1.25],
		"truncated":false,"use_tool":true,"ill_formed":false,"reward":null}`, string(row))
	var buf bytes.Buffer
	enc, _ := NewTrajectoryEncoder(&buf, ArrowOptions{})
	require.NoError(t, enc.Write(sampleTrajectories()...))
	require.NoError(t, enc.Close())
	var rows []json.RawMessage
	require.NoError(t, TrajectoriesKind().EachJSON(buf.Bytes(), func(r json.RawMessage) error { rows = append(rows, r); return nil }))
	require.Len(t, rows, 2)
	assert.Contains(t, string(rows[1]), `"rollout_topk_k":2`)
}

func TestTrajectoryValidate(t *testing.T) {
	base := func() Trajectory { return sampleTrajectories()[0] }
	cases := []struct {
		name string
		mut  func(*Trajectory)
		want string
	}{
		{"zero response", func(tr *Trajectory) { tr.ResponseLength = 0 }, "must be positive"},
		{"response too long", func(tr *Trajectory) { tr.ResponseLength = 9 }, "exceeds 6 tokens"},
		{"mask length", func(tr *Trajectory) { tr.LossMask = []uint8{1} }, "loss_mask has 1 entries"},
		{"logprob length", func(tr *Trajectory) { tr.RolloutLogProbs = []float32{-1} }, "rollout_log_probs has 1 entries"},
		{"nothing trained", func(tr *Trajectory) { tr.LossMask = []uint8{0, 0, 0} }, "no trained token"},
		{"mask value", func(tr *Trajectory) { tr.LossMask = []uint8{2, 0, 1} }, "want 0 or 1"},
		{"nan logprob", func(tr *Trajectory) { tr.RolloutLogProbs = []float32{float32(math.NaN()), 0, 0} }, "not a finite logprob"},
		{"positive logprob", func(tr *Trajectory) { tr.RolloutLogProbs = []float32{0.5, 0, 0} }, "not a finite logprob"},
		{"top-p offsets", func(tr *Trajectory) { tr.TopPTokenIDs = []int32{1}; tr.TopPTokenOffsets = []int32{0, 1} }, "top-p offsets"},
		{"top-p decreasing", func(tr *Trajectory) { tr.TopPTokenIDs = []int32{1}; tr.TopPTokenOffsets = []int32{0, 1, 0, 1} }, "decrease"},
		{"top-k shape", func(tr *Trajectory) { tr.TopKTokenIDs = []int32{1}; tr.TopKLogProbs = []float32{0}; tr.TopK = 2 }, "top-k heads"},
		{"experts shape", func(tr *Trajectory) { tr.RoutedExperts = []int32{1}; tr.RoutedExpertsShape = []int32{2, 1, 1} }, "routed experts"},
	}
	for _, c := range cases {
		t.Run(c.name, func(t *testing.T) {
			tr := base()
			c.mut(&tr)
			enc, err := NewTrajectoryEncoder(&bytes.Buffer{}, ArrowOptions{})
			require.NoError(t, err)
			err = enc.Write(tr)
			require.Error(t, err)
			assert.Contains(t, err.Error(), c.want)
			assert.Contains(t, err.Error(), "rollout_id=7 segment=0")
		})
	}
}

func TestEachTrajectoryRejectsForeignArrow(t *testing.T) {
	err := EachTrajectory([]byte("not arrow at all"), func(*Trajectory) error { return nil })
	require.ErrorContains(t, err, "trajectories shard")
}
