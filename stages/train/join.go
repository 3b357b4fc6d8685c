package train

import (
	"context"
	"fmt"

	"github.com/kilnrl/kiln/formats/dataset"
	"github.com/kilnrl/kiln/formats/records"
	"github.com/kilnrl/kiln/internal/stagecmd"
)

// JoinStats counts what the join left out.
type JoinStats struct {
	// WithoutAdvantages are trajectories segments with no advantages row:
	// rollouts kiln-advantages filtered out (advantages.md §4).
	WithoutAdvantages int
}

type segKey struct {
	rollout int64
	segment int32
}

// Join pairs segments with advantages rows by (rollout_id, segment)
// (docs/train-stage.md §2), keeping the trajectories' order. segs carry
// the trajectory fields; Advantage and RolloutTrainedTokens are filled
// from adv. Errors (all bad input): an advantages row without its
// segment, a key repeated on either side, a rollout only partly in the
// advantages, a denominator that is not the rollout's trained tokens.
func Join(segs []Segment, adv []records.Advantage) ([]Segment, JoinStats, error) {
	var stats JoinStats
	byKey := make(map[segKey]int, len(adv))
	for i := range adv {
		k := segKey{adv[i].RolloutID, adv[i].Segment}
		if _, dup := byKey[k]; dup {
			return nil, stats, fmt.Errorf("advantages: rollout %d segment %d has two rows", k.rollout, k.segment)
		}
		byKey[k] = i
	}
	used := make([]bool, len(adv))
	out := segs[:0:0]
	kept, left := map[int64]bool{}, map[int64]bool{}
	trained := map[int64]int64{}
	seen := make(map[segKey]bool, len(segs))
	for _, s := range segs {
		k := segKey{s.RolloutID, s.Segment}
		if seen[k] {
			return nil, stats, fmt.Errorf("trajectories: rollout %d segment %d appears twice", k.rollout, k.segment)
		}
		seen[k] = true
		i, ok := byKey[k]
		if !ok {
			stats.WithoutAdvantages++
			left[s.RolloutID] = true
			continue
		}
		used[i] = true
		kept[s.RolloutID] = true
		s.Advantage = adv[i].Advantage
		s.RolloutTrainedTokens = adv[i].RolloutTrainedTokens
		trained[s.RolloutID] += s.Trained()
		out = append(out, s)
	}
	for i, u := range used {
		if !u {
			return nil, stats, fmt.Errorf("advantages row rollout %d segment %d has no segment in the trajectories: the advantages were computed from other trajectories; recompute them (kiln-advantages)", adv[i].RolloutID, adv[i].Segment)
		}
	}
	for id := range kept {
		if left[id] {
			return nil, stats, fmt.Errorf("rollout %d has advantages for some of its segments only: recompute the advantages from these trajectories (kiln-advantages)", id)
		}
	}
	for _, s := range out {
		if s.RolloutTrainedTokens != trained[s.RolloutID] {
			return nil, stats, fmt.Errorf("rollout %d: advantages say %d trained tokens (rollout_trained_tokens), its segments' loss masks hold %d: recompute the advantages from these trajectories", s.RolloutID, s.RolloutTrainedTokens, trained[s.RolloutID])
		}
	}
	var topP, without *Segment
	for i := range out {
		if out[i].TopPOffsets != nil {
			topP = &out[i]
		} else {
			without = &out[i]
		}
	}
	if topP != nil && without != nil {
		return nil, stats, fmt.Errorf("rollout %d segment %d carries top-p replay data and rollout %d segment %d does not: train them separately (the replay columns are all or none, docs/train-stage.md §5)",
			topP.RolloutID, topP.Segment, without.RolloutID, without.Segment)
	}
	return out, stats, nil
}

// ReadJoined reads both versions and joins them; a join error is bad input
// naming both versions. With topK the segments' spans are the recorded
// top-k heads instead of the top-p nuclei (docs/train-stage.md §5).
func ReadJoined(ctx context.Context, tv, av *dataset.Version, topK bool) ([]Segment, JoinStats, error) {
	var segs []Segment
	err := tv.EachShard(ctx, func(_ int, data []byte) error {
		return records.EachTrajectory(data, func(t *records.Trajectory) error {
			segs = append(segs, segmentOf(t, topK))
			return nil
		})
	})
	if err != nil {
		return nil, JoinStats{}, fmt.Errorf("trajectories %s: %w", tv.Ref(), err)
	}
	var adv []records.Advantage
	err = av.EachShard(ctx, func(_ int, data []byte) error {
		return records.EachAdvantage(data, func(a *records.Advantage) error {
			adv = append(adv, *a)
			return nil
		})
	})
	if err != nil {
		return nil, JoinStats{}, fmt.Errorf("advantages %s: %w", av.Ref(), err)
	}
	out, stats, err := Join(segs, adv)
	if err != nil {
		return nil, stats, stagecmd.BadInputError{Err: fmt.Errorf("trajectories %s, advantages %s: %w", tv.Ref(), av.Ref(), err)}
	}
	return out, stats, nil
}

// segmentOf copies what training needs of a trajectories row (the
// reader's slices alias its buffers). With topK the row's top-k heads,
// K ids a response token with their logprobs, become the spans.
func segmentOf(t *records.Trajectory, topK bool) Segment {
	s := Segment{
		RolloutID: t.RolloutID, Segment: t.Segment, ResponseLength: t.ResponseLength,
		Tokens: append([]int32(nil), t.Tokens...), LossMask: append([]uint8(nil), t.LossMask...),
		RolloutLogProbs: append([]float32(nil), t.RolloutLogProbs...),
	}
	if topK {
		if t.TopK > 0 {
			s.TopPOffsets = make([]int32, t.ResponseLength+1)
			for i := range s.TopPOffsets {
				s.TopPOffsets[i] = int32(i) * t.TopK
			}
			s.TopPIDs = append([]int32{}, t.TopKTokenIDs...)
			s.TopPLogProbs = append([]float32{}, t.TopKLogProbs...)
		}
		return s
	}
	if t.TopPTokenOffsets != nil {
		s.TopPOffsets = append([]int32(nil), t.TopPTokenOffsets...)
		s.TopPIDs = append([]int32{}, t.TopPTokenIDs...)
		if t.TopPLogProbs != nil {
			s.TopPLogProbs = append([]float32{}, t.TopPLogProbs...)
		}
	}
	return s
}
