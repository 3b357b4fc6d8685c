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
		require.NoError(t, AdvantagesKind.EachJSON(buf.Bytes(), func(r json.RawMessage) error { rows = append(rows, r); return nil }))
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
