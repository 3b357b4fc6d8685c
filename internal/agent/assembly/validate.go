package assembly

import (
	"fmt"
	"math"

	"github.com/kilnrl/kiln/formats/records"
)

// ValidateSamplerTopP checks a segment's top-p columns against the
// validate_sampler_top_p contract (docs/assembly.md §2.3): offsets well formed, ids
// non-negative and distinct within a row, logprobs finite and <= 0, a
// trained row has a non-empty span, and every active row (non-empty span or
// trained) contains the sampled token exactly once, with the rollout logprob
// when nucleus logprobs are present (rtol 1e-4, atol 1e-5). Sampler mass is
// not checked. A segment without top-p columns passes.
func ValidateSamplerTopP(t *records.Trajectory) error {
	var l linearizer
	return l.validateTopP(t)
}

func (l *linearizer) validateTopP(t *records.Trajectory) error {
	if t.TopPTokenOffsets == nil && t.TopPTokenIDs == nil && t.TopPLogProbs == nil {
		return nil
	}
	where := func(format string, args ...any) error {
		return fmt.Errorf("trajectory rollout_id=%d segment=%d: top-p: %s", t.RolloutID, t.Segment, fmt.Sprintf(format, args...))
	}
	n := int(t.ResponseLength)
	off, ids, lps := t.TopPTokenOffsets, t.TopPTokenIDs, t.TopPLogProbs
	if n < 0 || n > len(t.Tokens) || len(t.LossMask) != n || len(t.RolloutLogProbs) != n {
		return where("response columns do not match response_length %d", n)
	}
	if len(off) != n+1 || off[0] != 0 || int(off[n]) != len(ids) {
		return where("offsets must have response_length+1 = %d entries from 0 to %d", n+1, len(ids))
	}
	if lps != nil && len(lps) != len(ids) {
		return where("%d logprobs for %d ids", len(lps), len(ids))
	}
	prompt := len(t.Tokens) - n
	for r := 0; r < n; r++ {
		a, b := off[r], off[r+1]
		if b < a {
			return where("offsets decrease at row %d", r)
		}
		row := ids[a:b]
		for j, id := range row {
			if id < 0 {
				return where("row %d: token id %d is negative", r, id)
			}
			if lps != nil {
				if lp := float64(lps[int(a)+j]); math.IsNaN(lp) || math.IsInf(lp, 0) || lp > 0 {
					return where("row %d: logprob %v is not a finite logprob", r, lp)
				}
			}
		}
		if err := l.distinct(row); err != nil {
			return where("row %d: %v", r, err)
		}
		trained := t.LossMask[r] == 1
		if trained && len(row) == 0 {
			return where("row %d is trained but its sampler span is empty", r)
		}
		if len(row) == 0 {
			continue
		}
		tok := t.Tokens[prompt+r]
		found, at := 0, -1
		for j, id := range row {
			if id == tok {
				found++
				at = int(a) + j
			}
		}
		if found != 1 {
			return where("row %d: sampler distribution must include the sampled token %d exactly once (found %d times)", r, tok, found)
		}
		if lps != nil {
			got, want := float64(lps[at]), float64(t.RolloutLogProbs[r])
			if math.Abs(got-want) > 1e-5+1e-4*math.Abs(want) {
				return where("row %d: sampler distribution must include the sampled token %d with its rollout logprob %v (nucleus logprob %v)", r, tok, want, got)
			}
		}
	}
	return nil
}

// distinct reports a repeated id within one top-p row.
func (l *linearizer) distinct(row []int32) error {
	if len(row) <= 32 {
		for i := 1; i < len(row); i++ {
			for j := 0; j < i; j++ {
				if row[i] == row[j] {
					return fmt.Errorf("token id %d repeats", row[i])
				}
			}
		}
		return nil
	}
	if l.seen == nil {
		l.seen = make(map[int32]struct{}, len(row))
	}
	clear(l.seen)
	for _, id := range row {
		if _, dup := l.seen[id]; dup {
			return fmt.Errorf("token id %d repeats", id)
		}
		l.seen[id] = struct{}{}
	}
	return nil
}
