package train

import (
	"fmt"
	"slices"
)

// Segment is one trained segment: a trajectories row joined to its
// advantages row (docs/train-stage.md §2). Slices are owned by the segment.
type Segment struct {
	RolloutID int64
	Segment   int32
	Tokens    []int32
	// ResponseLength is the response region: the last ResponseLength
	// tokens, aligned with LossMask and RolloutLogProbs.
	ResponseLength  int32
	LossMask        []uint8
	RolloutLogProbs []float32
	Advantage       float64
	// RolloutTrainedTokens is D of the rollout (advantages.md §2.2).
	RolloutTrainedTokens int64
	// TopPOffsets (len ResponseLength+1, from 0), TopPIDs and TopPLogProbs
	// are the recorded nucleus per response row; nil when not recorded.
	TopPOffsets  []int32
	TopPIDs      []int32
	TopPLogProbs []float32
}

// Trained is the number of loss-mask ones.
func (s *Segment) Trained() int64 {
	n := int64(0)
	for _, m := range s.LossMask {
		n += int64(m)
	}
	return n
}

// Reduction names a loss reduction (docs/train.md §4).
type Reduction string

const (
	ReduceRollout      Reduction = "rollout"
	ReduceTokenMean    Reduction = "token-mean"
	ReduceSequenceMean Reduction = "sequence-mean"
)

// ParseReduction checks a --reduction value.
func ParseReduction(s string) (Reduction, error) {
	switch r := Reduction(s); r {
	case ReduceRollout, ReduceTokenMean, ReduceSequenceMean:
		return r, nil
	}
	return "", fmt.Errorf("--reduction %q: want rollout, token-mean or sequence-mean", s)
}

// Step is one optimizer step: exactly G rollouts with all their segments
// (indices into the schedule's segments), in first-occurrence order.
type Step struct {
	Rollouts []int64 // rollout ids, in order; a rollout's position is its rollout_index
	Segments []int   // every segment of those rollouts, in input order
}

// Schedule groups segments by rollout id (first-occurrence order) and
// deals the rollouts into steps of exactly g; the trailing rollouts that
// fill no step are dropped and counted (docs/train-stage.md §3). A rollout
// never spans steps.
func Schedule(segs []Segment, g int) (steps []Step, dropped int, err error) {
	if g < 1 {
		return nil, 0, fmt.Errorf("global batch size %d: want at least 1 rollout per step", g)
	}
	order := []int64{}
	members := map[int64][]int{}
	for i := range segs {
		id := segs[i].RolloutID
		if _, ok := members[id]; !ok {
			order = append(order, id)
		}
		members[id] = append(members[id], i)
	}
	n := len(order) / g
	for s := 0; s < n; s++ {
		st := Step{Rollouts: order[s*g : (s+1)*g]}
		for _, id := range st.Rollouts {
			st.Segments = append(st.Segments, members[id]...)
		}
		slices.Sort(st.Segments) // input order within the step
		steps = append(steps, st)
	}
	return steps, len(order) - n*g, nil
}

// Packing selects the bin-packing order.
type Packing string

const (
	// FirstFit places segments in input order into the first micro-batch
	// with room: the default, 1.8% above the lower bound on the benchmark's
	// distribution (docs/train-stage.md §3).
	FirstFit Packing = "first-fit"
	// FirstFitDecreasing is first fit over the segments sorted by length,
	// longest first (ties in input order): 0.4% above the bound on the
	// benchmark, at half the speed; the order does not matter to the loss,
	// whose reduction is per rollout.
	FirstFitDecreasing Packing = "first-fit-decreasing"
)

// Pack packs items of the given lengths into bins of at most limit tokens,
// first fit (in the order packing says), and returns each bin's items (as
// indices into lengths) in placement order. An item longer than limit gets
// a bin of its own. limit <= 0 means one bin for everything.
func Pack(lengths []int, limit int, packing Packing) [][]int {
	idx := make([]int, len(lengths))
	for i := range idx {
		idx[i] = i
	}
	if limit <= 0 {
		if len(idx) == 0 {
			return nil
		}
		return [][]int{idx}
	}
	if packing == FirstFitDecreasing {
		slices.SortStableFunc(idx, func(a, b int) int { return lengths[b] - lengths[a] })
	}
	var bins [][]int
	// free[b] is bin b's room; tree is a max segment tree over free, so
	// the first bin with room is found in O(log bins).
	var free []int
	t := newMaxTree()
	for _, i := range idx {
		l := lengths[i]
		if l > limit {
			bins = append(bins, []int{i})
			free = append(free, 0)
			t.push(0)
			continue
		}
		b := t.first(l)
		if b < 0 {
			bins = append(bins, nil)
			free = append(free, limit)
			t.push(limit)
			b = len(bins) - 1
		}
		bins[b] = append(bins[b], i)
		free[b] -= l
		t.set(b, free[b])
	}
	return bins
}

// maxTree is a growable max segment tree: first(x) finds the lowest index
// whose value is at least x.
type maxTree struct {
	size int   // leaves in use
	cap  int   // leaves allocated (a power of two)
	v    []int // 1-based heap layout, 2*cap entries
}

func newMaxTree() *maxTree { return &maxTree{cap: 1, v: make([]int, 2)} }

func (t *maxTree) push(x int) {
	if t.size == t.cap {
		old := t.v[t.cap : t.cap+t.size]
		t.cap *= 2
		t.v = make([]int, 2*t.cap)
		copy(t.v[t.cap:], old)
		for i := t.cap - 1; i >= 1; i-- {
			t.v[i] = max(t.v[2*i], t.v[2*i+1])
		}
	}
	t.size++
	t.set(t.size-1, x)
}

func (t *maxTree) set(i, x int) {
	i += t.cap
	t.v[i] = x
	for i /= 2; i >= 1; i /= 2 {
		t.v[i] = max(t.v[2*i], t.v[2*i+1])
	}
}

func (t *maxTree) first(x int) int {
	if t.size == 0 || t.v[1] < x {
		return -1
	}
	i := 1
	for i < t.cap {
		if t.v[2*i] >= x {
			i = 2 * i
		} else {
			i = 2*i + 1
		}
	}
	if i-t.cap >= t.size {
		return -1
	}
	return i - t.cap
}

// Denominators are the per-segment denominators and the step divisor of
// reduction r for the segments of one step (docs/train.md §4; the same
// rule as kiln_gpu.loss.step_denominators): rollout => the rollout's D
// and G; token-mean => 1 and the step's trained tokens; sequence-mean =>
// the segment's trained tokens and the step's segments.
func Denominators(segs []Segment, st Step, r Reduction) (denom []float32, divisor float64) {
	denom = make([]float32, len(st.Segments))
	var trained int64
	for j, i := range st.Segments {
		s := &segs[i]
		n := s.Trained()
		trained += n
		switch r {
		case ReduceRollout:
			denom[j] = float32(s.RolloutTrainedTokens)
		case ReduceTokenMean:
			denom[j] = 1
		case ReduceSequenceMean:
			denom[j] = float32(n)
		}
	}
	switch r {
	case ReduceRollout:
		divisor = float64(len(st.Rollouts))
	case ReduceTokenMean:
		divisor = float64(max(trained, 1))
	case ReduceSequenceMean:
		divisor = float64(len(st.Segments))
	}
	return denom, divisor
}
