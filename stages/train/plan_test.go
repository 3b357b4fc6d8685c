package train

import (
	"fmt"
	"math/rand/v2"
	"testing"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
)

// seg is a segment of rollout r with n tokens, the last resp of them the
// response region, trained trained of those.
func seg(r int64, s int32, n, resp, trained int) Segment {
	out := Segment{RolloutID: r, Segment: s, Tokens: make([]int32, n), ResponseLength: int32(resp),
		LossMask: make([]uint8, resp), RolloutLogProbs: make([]float32, resp), Advantage: float64(r)}
	for i := range out.Tokens {
		out.Tokens[i] = int32(100*r) + int32(i)
	}
	for i := 0; i < trained; i++ {
		out.LossMask[resp-1-i] = 1
		out.RolloutLogProbs[resp-1-i] = -0.5
	}
	return out
}

// withD sets each segment's RolloutTrainedTokens to its rollout's total.
func withD(segs []Segment) []Segment {
	d := map[int64]int64{}
	for i := range segs {
		d[segs[i].RolloutID] += segs[i].Trained()
	}
	for i := range segs {
		segs[i].RolloutTrainedTokens = d[segs[i].RolloutID]
	}
	return segs
}

func TestSchedule(t *testing.T) {
	// Rollouts in first-occurrence order 5, 3, 9, 1, 7 (interleaved).
	segs := []Segment{seg(5, 0, 4, 2, 1), seg(3, 0, 4, 2, 1), seg(5, 1, 4, 2, 1), seg(9, 0, 4, 2, 1), seg(3, 1, 4, 2, 1), seg(1, 0, 4, 2, 1), seg(7, 0, 4, 2, 1), seg(9, 1, 4, 2, 1)}
	cases := []struct {
		g       int
		steps   [][]int64
		segs    [][]int
		dropped int
	}{
		{1, [][]int64{{5}, {3}, {9}, {1}, {7}}, [][]int{{0, 2}, {1, 4}, {3, 7}, {5}, {6}}, 0},
		{2, [][]int64{{5, 3}, {9, 1}}, [][]int{{0, 1, 2, 4}, {3, 5, 7}}, 1},
		{5, [][]int64{{5, 3, 9, 1, 7}}, [][]int{{0, 1, 2, 3, 4, 5, 6, 7}}, 0},
		{6, nil, nil, 5},
	}
	for _, c := range cases {
		steps, dropped, err := Schedule(segs, c.g)
		require.NoError(t, err)
		assert.Equal(t, c.dropped, dropped, "G=%d", c.g)
		require.Len(t, steps, len(c.steps), "G=%d", c.g)
		for i, st := range steps {
			assert.Equal(t, c.steps[i], st.Rollouts, "G=%d step %d", c.g, i)
			assert.Equal(t, c.segs[i], st.Segments, "G=%d step %d", c.g, i)
		}
	}
	_, _, err := Schedule(segs, 0)
	assert.Error(t, err)
}

func TestPack(t *testing.T) {
	cases := []struct {
		name    string
		lengths []int
		limit   int
		packing Packing
		want    [][]int
	}{
		{"first fit", []int{6, 5, 4, 3, 2}, 10, FirstFit, [][]int{{0, 2}, {1, 3, 4}}},
		{"first fit reuses an early bin", []int{7, 7, 3, 3}, 10, FirstFit, [][]int{{0, 2}, {1, 3}}},
		{"oversize alone", []int{3, 25, 4}, 10, FirstFit, [][]int{{0, 2}, {1}}},
		{"oversize never shared", []int{25, 1, 1}, 10, FirstFit, [][]int{{0}, {1, 2}}},
		{"exact fit", []int{5, 5, 10}, 10, FirstFit, [][]int{{0, 1}, {2}}},
		{"decreasing", []int{2, 6, 3, 5, 4}, 10, FirstFitDecreasing, [][]int{{1, 4}, {3, 2, 0}}},
		{"decreasing is stable", []int{3, 3, 3}, 6, FirstFitDecreasing, [][]int{{0, 1}, {2}}},
		{"no cap", []int{3, 4}, 0, FirstFit, [][]int{{0, 1}}},
		{"empty", nil, 10, FirstFit, nil},
	}
	for _, c := range cases {
		assert.Equal(t, c.want, Pack(c.lengths, c.limit, c.packing), c.name)
	}
}

// Pack's segment tree agrees with a plain first-fit scan.
func TestPackMatchesNaive(t *testing.T) {
	rng := rand.New(rand.NewPCG(1, 2))
	for trial := 0; trial < 200; trial++ {
		n, limit := rng.IntN(60), 1+rng.IntN(50)
		lengths := make([]int, n)
		for i := range lengths {
			lengths[i] = 1 + rng.IntN(limit+limit/4)
		}
		var want [][]int
		var free []int
		for i, l := range lengths {
			placed := false
			for b := range want {
				if l <= limit && free[b] >= l {
					want[b] = append(want[b], i)
					free[b] -= l
					placed = true
					break
				}
			}
			if !placed {
				want = append(want, []int{i})
				free = append(free, max(limit-l, 0))
				if l > limit {
					free[len(free)-1] = 0
				}
			}
		}
		assert.Equal(t, want, Pack(lengths, limit, FirstFit), "trial %d: %v limit %d", trial, lengths, limit)
	}
}

func TestDenominators(t *testing.T) {
	// The spec's reduction vector (docs/train.md §7 item 3): rollout 0 has
	// segments with 3 and 2 trained tokens (D = 5), rollout 1 one with 2.
	segs := withD([]Segment{seg(0, 0, 6, 4, 3), seg(1, 0, 4, 2, 2), seg(0, 1, 5, 3, 2)})
	st := Step{Rollouts: []int64{0, 1}, Segments: []int{0, 1, 2}}
	cases := []struct {
		r       Reduction
		denom   []float32
		divisor float64
	}{
		{ReduceRollout, []float32{5, 2, 5}, 2},
		{ReduceTokenMean, []float32{1, 1, 1}, 7},
		{ReduceSequenceMean, []float32{3, 2, 2}, 3},
	}
	for _, c := range cases {
		d, div := Denominators(segs, st, c.r)
		assert.Equal(t, c.denom, d, c.r)
		assert.Equal(t, c.divisor, div, c.r)
	}
}

// Invariants of the layout on random inputs: every kept segment is placed
// exactly once, each step holds exactly G rollouts with all their
// segments, a rollout never spans steps, the dropped count is the rest,
// and no micro-batch over the cap holds more than one segment.
func TestLayoutInvariants(t *testing.T) {
	rng := rand.New(rand.NewPCG(3, 4))
	for trial := 0; trial < 100; trial++ {
		nr := 1 + rng.IntN(30)
		var segs []Segment
		for k := 0; k < 3*nr; k++ {
			r := int64(rng.IntN(nr))
			n := 2 + rng.IntN(40)
			segs = append(segs, seg(r, int32(k), n, 1+rng.IntN(n-1), 1))
		}
		segs = withD(segs)
		g, limit := 1+rng.IntN(6), 8+rng.IntN(40)
		for _, packing := range []Packing{FirstFit, FirstFitDecreasing} {
			l, err := BuildLayout(segs, Batching{GlobalBatchSize: g, MaxTokens: limit, Packing: packing, Reduction: ReduceRollout})
			require.NoError(t, err)
			rollouts := map[int64]bool{}
			for i := range segs {
				rollouts[segs[i].RolloutID] = true
			}
			assert.Equal(t, len(rollouts)-len(l.Steps)*g, l.Dropped)
			assert.Less(t, l.Dropped, g)
			placed := map[int]int{}
			stepOf := map[int64]int{}
			for s, st := range l.Steps {
				assert.Len(t, st.Rollouts, g)
				in := map[int64]bool{}
				for _, r := range st.Rollouts {
					in[r] = true
					_, dup := stepOf[r]
					assert.False(t, dup, "rollout %d in two steps", r)
					stepOf[r] = s
				}
				for _, mb := range l.MBs[s] {
					tok := 0
					for _, i := range mb {
						placed[i]++
						tok += len(segs[i].Tokens)
						assert.True(t, in[segs[i].RolloutID], "segment of another step")
					}
					if tok > limit {
						assert.Len(t, mb, 1, "over the cap with several segments")
					}
				}
			}
			for i := range segs {
				if _, ok := stepOf[segs[i].RolloutID]; ok {
					assert.Equal(t, 1, placed[i], "segment %d placed %d times", i, placed[i])
				} else {
					assert.Zero(t, placed[i])
				}
			}
		}
	}
}

func TestContextCheck(t *testing.T) {
	segs := withD([]Segment{seg(0, 0, 8, 2, 1), seg(4, 2, 20, 2, 1)})
	_, err := BuildLayout(segs, Batching{GlobalBatchSize: 1, MaxTokens: 100, Reduction: ReduceRollout, MaxContext: 16})
	require.Error(t, err)
	assert.Contains(t, err.Error(), "rollout 4 segment 2 has 20 tokens, more than the model's context of 16")
	_, err = BuildLayout(segs, Batching{GlobalBatchSize: 1, MaxTokens: 100, Reduction: ReduceRollout, MaxContext: 20})
	assert.NoError(t, err)
}

func ExamplePack() {
	fmt.Println(Pack([]int{6, 5, 4, 3, 2}, 10, FirstFit))
	// Output: [[0 2] [1 3 4]]
}
