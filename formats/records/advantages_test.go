package records

import (
	"bytes"
	"encoding/json"
	"math"
	"testing"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
)

func TestAdvantagesRoundTrip(t *testing.T) {
	want := []Advantage{
		{RolloutID: 3, Segment: 0, GroupIndex: 7, Advantage: 0.8660239037870368, RolloutTrainedTokens: 5, Reward: 1},
		{RolloutID: 3, Segment: 1, GroupIndex: 7, Advantage: 0.8660239037870368, RolloutTrainedTokens: 5, Reward: 1},
		{RolloutID: 4, Segment: 0, GroupIndex: 7, Advantage: -0.8660239037870368, RolloutTrainedTokens: 2, Reward: 0},
	}
	for _, opts := range []ArrowOptions{{}, {Uncompressed: true}, {BatchTokens: 1}} {
		var buf bytes.Buffer
		enc, err := NewAdvantageEncoder(&buf, opts)
		require.NoError(t, err)
		require.NoError(t, enc.Write(want...))
		require.NoError(t, enc.Close())
		var got []Advantage
		require.NoError(t, EachAdvantage(buf.Bytes(), func(a *Advantage) error { got = append(got, *a); return nil }))
		assert.Equal(t, want, got, "options %+v", opts)
		var rows []json.RawMessage
		require.NoError(t, AdvantagesKind().EachJSON(buf.Bytes(), func(r json.RawMessage) error { rows = append(rows, r); return nil }))
		require.Len(t, rows, 3)
		assert.JSONEq(t, `{"rollout_id":4,"segment":0,"group_index":7,"advantage":-0.8660239037870368,"rollout_trained_tokens":2,"reward":0}`, string(rows[2]))
	}
	k, err := Lookup("advantages")
	require.NoError(t, err)
	assert.Equal(t, Arrow, k.Encoding)
}

func TestAdvantageValidate(t *testing.T) {
	cases := []struct {
		a   Advantage
		err string
	}{
		{Advantage{RolloutID: 1, Advantage: math.NaN(), RolloutTrainedTokens: 1}, "not a finite number"},
		{Advantage{RolloutID: 1, Advantage: math.Inf(1), RolloutTrainedTokens: 1}, "not a finite number"},
		{Advantage{RolloutID: 1, Reward: math.NaN(), RolloutTrainedTokens: 1}, "reward of rollout 1"},
		{Advantage{RolloutID: 1, RolloutTrainedTokens: 0}, "must be positive"},
	}
	for _, c := range cases {
		var buf bytes.Buffer
		enc, err := NewAdvantageEncoder(&buf, ArrowOptions{})
		require.NoError(t, err)
		assert.ErrorContains(t, enc.Write(c.a), c.err)
	}
}

// EachSegmentTotals agrees with EachTrajectory on what it reads.
func TestEachSegmentTotals(t *testing.T) {
	var buf bytes.Buffer
	enc, err := NewTrajectoryEncoder(&buf, ArrowOptions{BatchTokens: 4})
	require.NoError(t, err)
	segs := sampleTrajectories()
	require.NoError(t, enc.Write(append(segs, segs...)...))
	require.NoError(t, enc.Close())
	var got []SegmentTotals
	require.NoError(t, EachSegmentTotals(buf.Bytes(), func(s SegmentTotals) error { got = append(got, s); return nil }))
	want := []SegmentTotals{{RolloutID: 7, Index: 7, GroupIndex: 2, Segment: 0, Trained: 2}, {RolloutID: 7, Index: 7, GroupIndex: 2, Segment: 1, Trained: 1, Truncated: true}}
	assert.Equal(t, append(want, want...), got)
}

// rawTrajectories writes segments without the encoder's checks, so the
// reader's own checks can be tested.
func rawTrajectories(t *testing.T, segs ...Trajectory) []byte {
	var buf bytes.Buffer
	aw, err := newArrowWriter(&buf, trajectorySchema, ArrowOptions{})
	require.NoError(t, err)
	for _, s := range segs {
		appendTrajectory(aw, &s)
		require.NoError(t, aw.rowDone(len(s.Tokens)))
	}
	require.NoError(t, aw.Close())
	return buf.Bytes()
}

func TestEachSegmentTotalsRejects(t *testing.T) {
	good := func() Trajectory {
		return Trajectory{RolloutID: 9, Segment: 2, Tokens: []int32{1, 2, 3}, ResponseLength: 2, LossMask: []uint8{0, 1}, RolloutLogProbs: []float32{0, -1}}
	}
	cases := []struct {
		edit func(*Trajectory)
		err  string
	}{
		{func(s *Trajectory) { s.LossMask = []uint8{2, 1} }, "rollout_id=9 segment=2: loss_mask[0] = 2"},
		{func(s *Trajectory) { s.LossMask = []uint8{0, 0} }, "no trained token"},
		{func(s *Trajectory) { s.LossMask = []uint8{1} }, "loss_mask has 1 entries, response_length is 2"},
		{func(s *Trajectory) { s.RolloutLogProbs = nil }, "rollout_log_probs has 0 entries"},
		{func(s *Trajectory) { s.ResponseLength = 4; s.LossMask = []uint8{1, 1, 1, 1} }, "response_length 4 is not within its 3 tokens"},
		{func(s *Trajectory) { s.ResponseLength = 0; s.LossMask = nil; s.RolloutLogProbs = nil }, "response_length 0"},
	}
	for _, c := range cases {
		s := good()
		c.edit(&s)
		err := EachSegmentTotals(rawTrajectories(t, good(), s), func(SegmentTotals) error { return nil })
		assert.ErrorContains(t, err, c.err)
	}
	require.NoError(t, EachSegmentTotals(rawTrajectories(t, good()), func(SegmentTotals) error { return nil }))
}
