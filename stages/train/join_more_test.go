package train

import (
	"testing"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/kilnrl/kiln/formats/records"
)

// advantagesOf is an advantages row for each segment, as kiln-advantages
// writes them (the segment's advantage and its rollout's trained tokens).
func advantagesOf(segs []Segment) []records.Advantage {
	var adv []records.Advantage
	for _, s := range segs {
		adv = append(adv, records.Advantage{RolloutID: s.RolloutID, Segment: s.Segment, Advantage: s.Advantage, RolloutTrainedTokens: s.RolloutTrainedTokens})
	}
	return adv
}

// TestJoinCountsFilteredRollouts: a rollout kiln-advantages filtered out
// (no row for any of its segments) is left out of the join, in the
// trajectories' order otherwise, and each of its segments is counted in
// WithoutAdvantages (kiln-train's segments_without_advantages).
func TestJoinCountsFilteredRollouts(t *testing.T) {
	segs := fixture() // rollout 10: segments 0, 1, 2; 11 to 14: one each
	var rows []Segment
	for _, s := range segs {
		if s.RolloutID != 10 && s.RolloutID != 13 {
			rows = append(rows, s)
		}
	}
	out, stats, err := Join(fixture(), advantagesOf(rows))
	require.NoError(t, err)
	assert.Equal(t, 4, stats.WithoutAdvantages, "rollout 10's three segments and rollout 13's one")
	var got []int64
	for _, s := range out {
		got = append(got, s.RolloutID)
	}
	assert.Equal(t, []int64{11, 12, 14}, got)
}

// TestSegmentOfTopP: a trajectories row's top-p nuclei reach the segment,
// their logprobs only when the row records them: nil, not empty, when it
// does not, which is how the micro-batch writer tells the two apart.
func TestSegmentOfTopP(t *testing.T) {
	row := records.Trajectory{RolloutID: 3, ResponseLength: 2, Tokens: []int32{1, 2, 3}, LossMask: []uint8{1, 1}, RolloutLogProbs: []float32{-1, -2},
		Replay: records.Replay{TopPTokenOffsets: []int32{0, 2, 3}, TopPTokenIDs: []int32{2, 7, 3}, TopPLogProbs: []float32{-0.1, -2.5, 0}}}
	s := segmentOf(&row, false)
	assert.Equal(t, []int32{0, 2, 3}, s.TopPOffsets)
	assert.Equal(t, []int32{2, 7, 3}, s.TopPIDs)
	assert.Equal(t, []float32{-0.1, -2.5, 0}, s.TopPLogProbs)
	row.TopPLogProbs = nil
	s = segmentOf(&row, false)
	assert.Equal(t, []int32{2, 7, 3}, s.TopPIDs)
	assert.Nil(t, s.TopPLogProbs)
}

// TestRepeatEpochs: n epochs run the plan's steps n times in the same
// order, naming the same micro-batch files, with indices continuing; one
// epoch leaves the plan as it is.
func TestRepeatEpochs(t *testing.T) {
	p, _, _ := fixturePlan(t, t.TempDir())
	one := append([]PlanStep(nil), p.Steps...)
	require.Greater(t, len(one), 1)
	p.RepeatEpochs(1)
	assert.Equal(t, one, p.Steps)
	p.RepeatEpochs(3)
	require.Len(t, p.Steps, 3*len(one))
	for i, st := range p.Steps {
		assert.Equal(t, i, st.Index)
		assert.Equal(t, one[i%len(one)].MicroBatches, st.MicroBatches, "step %d", i)
	}
}
