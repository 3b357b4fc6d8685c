package rollout

import (
	"testing"

	"github.com/kilnrl/kiln/formats/records"
)

// TestMaskedTokenErrors holds the end-to-end tests' check of every
// trained token (assertMaskedTokensSampled) to positions: a trained token
// that its rollout sampled, with that logprob, but at another position is
// an error. Before, the check was set membership, and these passed it.
func TestMaskedTokenErrors(t *testing.T) {
	// Rollout 1: turn 0 samples 10 11 12 after the prompt 1 2; turn 1
	// samples 13 14 after turn 0's prompt and output and the tool's 5 6.
	turns := []records.Turn{
		{RolloutID: 1, Session: "s", Turn: 0, PromptIDs: []int32{1, 2}, OutputIDs: []int32{10, 11, 12}, OutputLogProbs: []float32{-0.1, -0.2, -0.3}},
		{RolloutID: 1, Session: "s", Turn: 1, PromptIDs: []int32{1, 2, 10, 11, 12, 5, 6}, OutputIDs: []int32{13, 14}, OutputLogProbs: []float32{-0.4, -0.5}},
	}
	seg := func(tokens []int32, mask []uint8, lps []float32) []records.Trajectory {
		return []records.Trajectory{{RolloutID: 1, Tokens: tokens, ResponseLength: int32(len(mask)), LossMask: mask, RolloutLogProbs: lps}}
	}
	for _, c := range []struct {
		name string
		segs []records.Trajectory
		errs int
	}{
		{"as assembled", seg([]int32{1, 2, 10, 11, 12, 5, 6, 13, 14}, []uint8{1, 1, 1, 0, 0, 1, 1}, []float32{-0.1, -0.2, -0.3, 0, 0, -0.4, -0.5}), 0},
		{"truncated in turn 1", seg([]int32{1, 2, 10, 11, 12, 5, 6, 13}, []uint8{1, 1, 1, 0, 0, 1}, []float32{-0.1, -0.2, -0.3, 0, 0, -0.4}), 0},
		// every token and logprob pair is one the rollout sampled
		{"two trained tokens swapped", seg([]int32{1, 2, 10, 11, 12, 5, 6, 14, 13}, []uint8{1, 1, 1, 0, 0, 1, 1}, []float32{-0.1, -0.2, -0.3, 0, 0, -0.5, -0.4}), 2},
		{"turn 1's output one position late", seg([]int32{1, 2, 10, 11, 12, 5, 6, 6, 13, 14}, []uint8{1, 1, 1, 0, 0, 0, 1, 1}, []float32{-0.1, -0.2, -0.3, 0, 0, 0, -0.4, -0.5}), 2},
		{"mask on the tool's tokens", seg([]int32{1, 2, 10, 11, 12, 10, 11, 13, 14}, []uint8{1, 1, 1, 1, 1, 1, 1}, []float32{-0.1, -0.2, -0.3, -0.1, -0.2, -0.4, -0.5}), 4},
	} {
		t.Run(c.name, func(t *testing.T) {
			errs := maskedTokenErrors(turns, c.segs)
			if len(errs) != c.errs {
				t.Errorf("%d errors, want %d: %q", len(errs), c.errs, errs)
			}
		})
	}
}
