package advantages

import (
	"fmt"
	"math"
	"math/rand/v2"
	"slices"
	"testing"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/kilnrl/kiln/formats/records"
)

// The spec's GRPO vectors (docs/advantages.md §7 lists them).
func TestGroupAdvantagesVectors(t *testing.T) {
	cases := []struct {
		est     Estimator
		rewards []float64
		want    []float64
	}{
		{GRPO, []float64{1, 0, 0, 1}, []float64{0.8660239037870368, -0.8660239037870368, -0.8660239037870368, 0.8660239037870368}},
		{GRPO, []float64{1, 1, 1, 1}, []float64{0, 0, 0, 0}},
		{GRPO, []float64{0, 0, 0, 0}, []float64{0, 0, 0, 0}},
		{GRPO, []float64{1, 0, 1, 1}, []float64{0.499999, -1.499997, 0.499999, 0.499999}},
		{GRPO, []float64{1, 0, 0, 0}, []float64{1.499997, -0.499999, -0.499999, -0.499999}},
		{GRPO, []float64{0.2, 0.5, 0.9}, []float64{-0.949155, -0.094916, 1.044071}},
		{GRPO, []float64{1, 0}, []float64{0.707106, -0.707106}},
		{GRPO, []float64{3, 1, 2, 2, 7}, []float64{0, -0.852803, -0.426401, -0.426401, 1.705605}},
		{GRPO, []float64{1}, []float64{0}},
		{DrGRPO, []float64{1, 0, 0, 0}, []float64{0.75, -0.25, -0.25, -0.25}},
		{DrGRPO, []float64{0.3, 0.3, 0.3}, []float64{0, 0, 0}},
		{ReinforceBaseline, []float64{1, 0, 0, 0}, []float64{0.75, -0.25, -0.25, -0.25}},
		{RLOO, []float64{1, 0, 0, 0}, []float64{1, -1.0 / 3, -1.0 / 3, -1.0 / 3}},
		{RLOO, []float64{1, 1, 0}, []float64{0.5, 0.5, -1}},
		{RLOO, []float64{0}, []float64{0}},
		{Raw, []float64{1, 0, 1}, []float64{1, 0, 1}},
	}
	for _, c := range cases {
		got := make([]float64, len(c.rewards))
		GroupAdvantages(c.est, c.rewards, 1e-6, got)
		for i := range got {
			assert.InDelta(t, c.want[i], got[i], 1e-6, "%s %v [%d]", c.est, c.rewards, i)
		}
	}
	// Uniform groups are exactly 0, not a floating-point residue.
	got := make([]float64, 3)
	GroupAdvantages(GRPO, []float64{0.1, 0.1, 0.1}, 1e-6, got)
	assert.Equal(t, []float64{0, 0, 0}, got)
}

// spec is one rollout of a test batch: segment k has k+1 trained tokens.
type spec struct {
	group, rollout int64
	reward         float64
	segments       int
}

func build(specs []spec) ([]Segment, []Grade) {
	var segs []Segment
	var grades []Grade
	for _, s := range specs {
		grades = append(grades, Grade{RolloutID: s.rollout, GroupIndex: s.group, TaskID: fmt.Sprintf("task-%d", s.group), Reward: s.reward, Failure: failureOf(s.reward)})
		for k := 0; k < s.segments; k++ {
			segs = append(segs, Segment{RolloutID: s.rollout, Index: s.rollout, GroupIndex: s.group, Segment: int32(k), Trained: int64(k + 1)})
		}
	}
	return segs, grades
}

func failureOf(r float64) string {
	if r == 1 {
		return records.FailureNone
	}
	return records.FailureTestsFailed
}

func byRollout(rows []records.Advantage) map[int64]float64 {
	m := map[int64]float64{}
	for _, r := range rows {
		m[r.RolloutID] = r.Advantage
	}
	return m
}

func grpo() Options {
	return Options{Estimator: GRPO, StdEps: 1e-6, Infra: InfraExclude, MinGroupSize: 1}
}

// TV30: interleaved, shuffled groups with unequal fork counts and a
// singleton; per-rollout statistics, and denominators over all of a
// rollout's segments.
func TestComputeFanOutVector(t *testing.T) {
	type row struct {
		group, rollout int64
		reward         float64
	}
	order := []row{{8, 4, 1}, {7, 0, 1}, {7, 1, 0}, {8, 5, 0}, {7, 0, 1}, {8, 6, 1}, {7, 2, 0}, {7, 0, 1}, {7, 3, 1}, {8, 7, 1}, {7, 2, 0}, {9, 8, 1}}
	var segs []Segment
	var grades []Grade
	seen := map[int64]int32{}
	for _, r := range order {
		if _, ok := seen[r.rollout]; !ok {
			grades = append(grades, Grade{RolloutID: r.rollout, GroupIndex: r.group, TaskID: "t", Reward: r.reward, Failure: failureOf(r.reward)})
		}
		segs = append(segs, Segment{RolloutID: r.rollout, Index: r.rollout, GroupIndex: r.group, Segment: seen[r.rollout], Trained: 2})
		seen[r.rollout]++
	}
	res, err := Compute(segs, grades, grpo())
	require.NoError(t, err)
	require.Len(t, res.Rows, len(segs))
	want := map[int64]float64{0: 0.866024, 3: 0.866024, 1: -0.866024, 2: -0.866024, 4: 0.499999, 6: 0.499999, 7: 0.499999, 5: -1.499997, 8: 0}
	for i, r := range res.Rows {
		assert.Equal(t, segs[i].RolloutID, r.RolloutID, "rows keep the trajectories order")
		assert.InDelta(t, want[r.RolloutID], r.Advantage, 1e-6, "rollout %d", r.RolloutID)
		assert.Equal(t, int64(2*seen[r.RolloutID]), r.RolloutTrainedTokens, "rollout %d denominator", r.RolloutID)
	}
	assert.Equal(t, map[string]int{"1": 7, "2": 1, "3": 1}, res.SegmentsPerRollout)
	assert.Equal(t, 3, len(res.Groups))
	assert.Equal(t, GroupStat{GroupIndex: 7, TaskID: "t", Rollouts: 4, Segments: 7, Gradeable: 4, RewardMean: 0.5, PassRate: 0.5, Trained: 4}, res.Groups[1])
	assert.True(t, res.Groups[2].ZeroAdvantage)
}

// A rollout with 20 segments weighs what one with 1 does; two tasks in a
// batch are separate (TV29); unequal fork counts change nothing.
func TestComputeFanOutWeights(t *testing.T) {
	flat := []spec{{7, 0, 1, 1}, {7, 1, 0, 1}, {7, 2, 0, 1}, {7, 3, 1, 1}, {8, 4, 1, 1}, {8, 5, 1, 1}, {8, 6, 1, 1}, {8, 7, 1, 1}}
	forked := []spec{{7, 0, 1, 20}, {7, 1, 0, 1}, {7, 2, 0, 3}, {7, 3, 1, 1}, {8, 4, 1, 2}, {8, 5, 1, 1}, {8, 6, 1, 7}, {8, 7, 1, 1}}
	for _, est := range []Estimator{GRPO, DrGRPO, RLOO, ReinforceBaseline, Raw} {
		o := grpo()
		o.Estimator = est
		s1, g1 := build(flat)
		r1, err := Compute(s1, g1, o)
		require.NoError(t, err)
		s2, g2 := build(forked)
		r2, err := Compute(s2, g2, o)
		require.NoError(t, err)
		assert.Equal(t, byRollout(r1.Rows), byRollout(r2.Rows), "%s", est)
		if est == GRPO {
			a := byRollout(r2.Rows)
			assert.InDelta(t, 0.866024, a[0], 1e-6)
			assert.InDelta(t, -0.866024, a[2], 1e-6)
			for r := int64(4); r < 8; r++ {
				assert.Equal(t, 0.0, a[r], "group 8 is uniform: centring over all 8 would give +0.25")
			}
		}
	}
	segs, grades := build(forked)
	res, err := Compute(segs, grades, grpo())
	require.NoError(t, err)
	for _, r := range res.Rows {
		if r.RolloutID == 0 {
			assert.Equal(t, int64(20*21/2), r.RolloutTrainedTokens)
		}
	}
	assert.Equal(t, map[string]int{"1": 4, "2": 1, "3": 1, "7": 1, "17-32": 1}, res.SegmentsPerRollout)
}

// A group of four with one infra_error gives the other three what a group
// of three without it gives; --infra-failures zero does not.
// A group whose every rollout is dropped has no statistics: its reward mean
// and pass rate stay 0, never 0/0 = NaN, which no manifest could hold (a
// mutation survivor: len(rewards) >= 0).
func TestComputeGroupWithoutStatistics(t *testing.T) {
	g := []Grade{{RolloutID: 1, GroupIndex: 7, TaskID: "t", Reward: 0, Failure: records.FailureInfraError}}
	s := []Segment{{RolloutID: 1, Index: 1, GroupIndex: 7, Segment: 0, Trained: 1}}
	res, err := Compute(s, g, grpo())
	require.NoError(t, err)
	require.Len(t, res.Groups, 1)
	assert.Zero(t, res.Groups[0].RewardMean)
	assert.Zero(t, res.Groups[0].PassRate)
	assert.NotEmpty(t, res.Groups[0].Dropped)
}

func TestComputeInfraFailures(t *testing.T) {
	three := []Grade{
		{RolloutID: 1, GroupIndex: 3, TaskID: "t", Reward: 1, Failure: records.FailureNone},
		{RolloutID: 2, GroupIndex: 3, TaskID: "t", Reward: 0, Failure: records.FailureTestsFailed},
		{RolloutID: 3, GroupIndex: 3, TaskID: "t", Reward: 0, Failure: records.FailurePatchFailed},
	}
	four := append(append([]Grade{}, three...), Grade{RolloutID: 4, GroupIndex: 3, TaskID: "t", Reward: 0, Failure: records.FailureInfraError})
	segsOf := func(gs []Grade) []Segment {
		var s []Segment
		for _, g := range gs {
			s = append(s, Segment{RolloutID: g.RolloutID, Index: g.RolloutID, GroupIndex: g.GroupIndex, Segment: 0, Trained: 1},
				Segment{RolloutID: g.RolloutID, Index: g.RolloutID, GroupIndex: g.GroupIndex, Segment: 1, Trained: 1})
		}
		return s
	}
	base, err := Compute(segsOf(three), three, grpo())
	require.NoError(t, err)
	excl, err := Compute(segsOf(four), four, grpo())
	require.NoError(t, err)
	assert.Equal(t, byRollout(base.Rows), byRollout(excl.Rows))
	assert.Equal(t, map[string]int{ReasonInfraFailure: 2}, excl.DroppedRows)
	assert.Equal(t, map[string]int{ReasonInfraFailure: 1}, excl.DroppedRollouts)

	o := grpo()
	o.Infra = InfraZero
	zero, err := Compute(segsOf(four), four, o)
	require.NoError(t, err)
	assert.Len(t, zero.Rows, 8)
	assert.NotEqual(t, byRollout(base.Rows)[1], byRollout(zero.Rows)[1], "reward 0 for the infra failure moves the others' advantages")
	assert.InDelta(t, 1.5, byRollout(zero.Rows)[1], 1e-5) // [1,0,0,0]

	o.Infra = InfraDropGroup
	dg, err := Compute(segsOf(four), four, o)
	require.NoError(t, err)
	assert.Empty(t, dg.Rows)
	assert.Equal(t, map[string]int{ReasonInfraFailureGroup: 8}, dg.DroppedRows)
	assert.Equal(t, map[string]int{ReasonInfraFailureGroup: 1}, dg.DroppedGroups)

	// Excluding can leave a group too small: dropped whole and counted.
	two := []Grade{four[0], four[3]}
	o = grpo()
	o.MinGroupSize = 2
	small, err := Compute(segsOf(two), two, o)
	require.NoError(t, err)
	assert.Empty(t, small.Rows)
	assert.Equal(t, map[string]int{ReasonInfraFailure: 2, ReasonSmallGroup: 2}, small.DroppedRows)
	assert.Equal(t, ReasonSmallGroup, small.Groups[0].Dropped)
}

func TestInfraMapping(t *testing.T) {
	cases := map[string]bool{
		records.FailureNone: false, records.FailurePatchFailed: false, records.FailureTestsFailed: false, records.FailureTimeout: false,
		records.FailureInfraError: true, records.FailureAborted: true, records.FailureNoGrading: true,
	}
	for f, want := range cases {
		infra, ok := NotAboutPatch(f)
		assert.True(t, ok, f)
		assert.Equal(t, want, infra, f)
	}
	_, ok := NotAboutPatch("preempted")
	assert.False(t, ok, "an unknown class is not guessed")
}

func TestComputeFilters(t *testing.T) {
	specs := []spec{{1, 10, 1, 2}, {1, 11, 1, 1}, {2, 20, 1, 1}, {2, 21, 0, 3}, {2, 22, 0, 1}}
	segs, grades := build(specs)
	segs[4].Truncated = true // rollout 21's second segment
	o := grpo()
	o.DropUniform, o.DropTruncated = true, true
	res, err := Compute(segs, grades, o)
	require.NoError(t, err)
	assert.Equal(t, map[string]int{ReasonUniformGroup: 3, ReasonTruncated: 3}, res.DroppedRows)
	assert.Equal(t, map[string]int{ReasonUniformGroup: 2, ReasonTruncated: 1}, res.DroppedRollouts)
	a := byRollout(res.Rows)
	assert.Len(t, a, 2)
	assert.InDelta(t, 0.707106, a[20], 1e-6)
	assert.Len(t, res.Rows, 2)

	// A grade without segments is counted, in no statistics.
	grades = append(grades, Grade{RolloutID: 99, GroupIndex: 2, TaskID: "task-2", Reward: 1, Failure: records.FailureNone})
	res, err = Compute(segs, grades, grpo())
	require.NoError(t, err)
	assert.Equal(t, 1, res.GradesWithoutTrajectories)
	assert.Equal(t, 3, res.Groups[1].Rollouts)
}

func TestComputeBadInput(t *testing.T) {
	ok := []spec{{1, 10, 1, 2}, {1, 11, 0, 1}}
	cases := []struct {
		name string
		edit func(s []Segment, g []Grade) ([]Segment, []Grade)
		err  string
	}{
		{"rollout without a grade", func(s []Segment, g []Grade) ([]Segment, []Grade) { return s, g[:1] },
			"rollout 11 (group 1) has segments but no grade"},
		{"disagreeing group", func(s []Segment, g []Grade) ([]Segment, []Grade) { s[1].GroupIndex = 2; return s, g },
			"rollout 10: segment 1 has group_index 2"},
		{"disagreeing index", func(s []Segment, g []Grade) ([]Segment, []Grade) { s[1].Index = 5; return s, g },
			"all segments of a rollout must agree"},
		{"grade in another group", func(s []Segment, g []Grade) ([]Segment, []Grade) { g[0].GroupIndex = 4; return s, g },
			"rollout 10: its segments are in group 1 but its grade"},
		{"NaN reward", func(s []Segment, g []Grade) ([]Segment, []Grade) { g[1].Reward = math.NaN(); return s, g },
			"grade of rollout 11 (task \"task-1\"): reward NaN is outside [0, 1]"},
		{"reward out of range", func(s []Segment, g []Grade) ([]Segment, []Grade) { g[0].Reward = 2; return s, g },
			"grade of rollout 10 (task \"task-1\"): reward 2 is outside"},
		{"two grades", func(s []Segment, g []Grade) ([]Segment, []Grade) { return s, append(g, g[0]) },
			"rollout 10 has two grades"},
		{"duplicate segment", func(s []Segment, g []Grade) ([]Segment, []Grade) { return append(s, s[0]), g },
			"rollout 10: segment 0 appears twice"},
		// Adjacent and equal, so only the <= of the arrival-order check
		// marks the rollout for the duplicate scan (a mutation survivor).
		{"adjacent duplicate segment", func(s []Segment, g []Grade) ([]Segment, []Grade) { return slices.Insert(s, 1, s[0]), g },
			"rollout 10: segment 0 appears twice"},
		// The duplicate last, no segment after it to mark the rollout
		// out of order (kills <= negated to >).
		{"adjacent duplicate of a one-segment rollout", func(s []Segment, g []Grade) ([]Segment, []Grade) { return slices.Insert(s, 3, s[2]), g },
			"rollout 11: segment 0 appears twice"},
		{"unknown failure", func(s []Segment, g []Grade) ([]Segment, []Grade) { g[1].Failure = "preempted"; return s, g },
			"unknown failure class \"preempted\""},
		{"baseline grade", func(s []Segment, g []Grade) ([]Segment, []Grade) { g[0].Baseline = true; return s, g },
			"baseline grade"},
	}
	for _, c := range cases {
		s, g := build(ok)
		s, g = c.edit(s, g)
		_, err := Compute(s, g, grpo())
		require.Error(t, err, c.name)
		assert.ErrorContains(t, err, c.err, c.name)
		assert.ErrorAs(t, err, new(BadInput), c.name)
	}
}

// computeFn is a computation under test: per-rollout advantages of a batch.
type computeFn func(segs []Segment, grades []Grade, est Estimator) (map[int64]float64, error)

func stage(segs []Segment, grades []Grade, est Estimator) (map[int64]float64, error) {
	o := grpo()
	o.Estimator = est
	res, err := Compute(segs, grades, o)
	if err != nil {
		return nil, err
	}
	// Every segment of a rollout must carry the same advantage.
	m := map[int64]float64{}
	for _, r := range res.Rows {
		if v, ok := m[r.RolloutID]; ok && v != r.Advantage {
			return nil, fmt.Errorf("rollout %d: segments disagree (%v, %v)", r.RolloutID, v, r.Advantage)
		}
		m[r.RolloutID] = r.Advantage
	}
	return m, nil
}

// perSegment is a mutant: statistics over segments instead of rollouts
// (the reference's superseded per-sample statistics).
func perSegment(segs []Segment, grades []Grade, est Estimator) (map[int64]float64, error) {
	reward := map[int64]float64{}
	for _, g := range grades {
		reward[g.RolloutID] = g.Reward
	}
	groups := map[int64][]int{}
	var order []int64
	for i, s := range segs {
		if _, ok := groups[s.GroupIndex]; !ok {
			order = append(order, s.GroupIndex)
		}
		groups[s.GroupIndex] = append(groups[s.GroupIndex], i)
	}
	m := map[int64]float64{}
	for _, gi := range order {
		var rw []float64
		for _, i := range groups[gi] {
			rw = append(rw, reward[segs[i].RolloutID])
		}
		out := make([]float64, len(rw))
		GroupAdvantages(est, rw, 1e-6, out)
		for k, i := range groups[gi] {
			m[segs[i].RolloutID] = out[k]
		}
	}
	return m, nil
}

// batchWide is a mutant: one group for the whole batch.
func batchWide(segs []Segment, grades []Grade, est Estimator) (map[int64]float64, error) {
	s2 := append([]Segment{}, segs...)
	g2 := append([]Grade{}, grades...)
	for i := range s2 {
		s2[i].GroupIndex = 0
	}
	for i := range g2 {
		g2[i].GroupIndex = 0
	}
	return stage(s2, g2, est)
}

// randomBatch draws groups of 1-6 rollouts with 0/1 (or fractional)
// rewards and 1-20 segments each, interleaved at random.
func randomBatch(rng *rand.Rand, fractional bool) ([]spec, []Segment, []Grade) {
	var specs []spec
	id := int64(rng.IntN(1000))
	for g := range 1 + rng.IntN(5) { // every third group_index: gaps too
		for range 1 + rng.IntN(6) {
			r := float64(rng.IntN(2))
			if fractional && rng.IntN(3) == 0 {
				r = float64(rng.IntN(11)) / 10
			}
			specs = append(specs, spec{group: int64(g * 3), rollout: id, reward: r, segments: 1 + rng.IntN(20)})
			id += 1 + int64(rng.IntN(3))
		}
	}
	segs, grades := build(specs)
	rng.Shuffle(len(segs), func(i, j int) { segs[i], segs[j] = segs[j], segs[i] })
	rng.Shuffle(len(grades), func(i, j int) { grades[i], grades[j] = grades[j], grades[i] })
	return specs, segs, grades
}

// checkProperties holds fn to the invariants of docs/advantages.md §3.3 over
// random batches: invariance to segment order and to segments per rollout,
// and a zero sum within each non-uniform group for the centring estimators.
func checkProperties(fn computeFn, seed uint64, batches int) error {
	rng := rand.New(rand.NewPCG(seed, 1))
	for b := range batches {
		specs, segs, grades := randomBatch(rng, b%2 == 1)
		for _, est := range []Estimator{GRPO, DrGRPO, RLOO} {
			got, err := fn(segs, grades, est)
			if err != nil {
				return err
			}
			// Shuffled segments.
			sh := append([]Segment{}, segs...)
			rng.Shuffle(len(sh), func(i, j int) { sh[i], sh[j] = sh[j], sh[i] })
			got2, err := fn(sh, grades, est)
			if err != nil {
				return err
			}
			// One segment per rollout.
			one := append([]spec{}, specs...)
			for i := range one {
				one[i].segments = 1
			}
			s1, g1 := build(one)
			got3, err := fn(s1, g1, est)
			if err != nil {
				return err
			}
			for id, a := range got {
				if math.Abs(got2[id]-a) > 1e-12 {
					return fmt.Errorf("batch %d %s: rollout %d: %v, %v with the segments shuffled", b, est, id, a, got2[id])
				}
				if math.Abs(got3[id]-a) > 1e-12 {
					return fmt.Errorf("batch %d %s: rollout %d: %v, %v with one segment per rollout", b, est, id, a, got3[id])
				}
			}
			sums, uniform, first := map[int64]float64{}, map[int64]bool{}, map[int64]float64{}
			for _, s := range specs {
				sums[s.group] += got[s.rollout]
				if f, ok := first[s.group]; !ok {
					first[s.group], uniform[s.group] = s.reward, true
				} else if f != s.reward {
					uniform[s.group] = false
				}
			}
			for g, sum := range sums {
				if !uniform[g] && math.Abs(sum) > 1e-9 {
					return fmt.Errorf("batch %d %s: group %d advantages sum to %v", b, est, g, sum)
				}
			}
		}
	}
	return nil
}

func TestProperties(t *testing.T) {
	require.NoError(t, checkProperties(stage, 1, 300))
	// Mutation checks: the properties catch the wrong computations.
	assert.ErrorContains(t, checkProperties(perSegment, 1, 300), "with one segment per rollout")
	assert.ErrorContains(t, checkProperties(batchWide, 1, 300), "advantages sum to")
}

// reference is an independent implementation written from the reference
// formulas (one reward per distinct rollout id in first-appearance order
// per group_index; mean; Bessel std via the sum of squares), not from the
// stage's code.
func reference(segs []Segment, grades []Grade, est Estimator) map[int64]float64 {
	reward := map[int64]float64{}
	for _, g := range grades {
		reward[g.RolloutID] = g.Reward
	}
	type grp struct {
		ids []int64
		has map[int64]bool
	}
	groups := map[int64]*grp{}
	for _, s := range segs {
		g := groups[s.GroupIndex]
		if g == nil {
			g = &grp{has: map[int64]bool{}}
			groups[s.GroupIndex] = g
		}
		if !g.has[s.RolloutID] {
			g.has[s.RolloutID] = true
			g.ids = append(g.ids, s.RolloutID)
		}
	}
	out := map[int64]float64{}
	for _, g := range groups {
		n := float64(len(g.ids))
		var s, s2 float64
		for _, id := range g.ids {
			s += reward[id]
			s2 += reward[id] * reward[id]
		}
		mean := s / n
		for _, id := range g.ids {
			r := reward[id]
			var a float64
			switch est {
			case Raw:
				a = r
			case DrGRPO, ReinforceBaseline:
				a = r - mean
			case RLOO:
				if n > 1 {
					a = r - (s-r)/(n-1)
				}
			case GRPO:
				if n > 1 {
					std := math.Sqrt(math.Max(0, (s2-n*mean*mean)/(n-1)))
					a = (r - mean) / (std + 1e-6)
				}
			}
			out[id] = a
		}
	}
	return out
}

func TestDifferential(t *testing.T) {
	rng := rand.New(rand.NewPCG(2, 3))
	for b := range 1000 {
		_, segs, grades := randomBatch(rng, b%2 == 0)
		for _, est := range Estimators() {
			got, err := stage(segs, grades, est)
			require.NoError(t, err)
			want := reference(segs, grades, est)
			require.Len(t, got, len(want))
			for id, w := range want {
				// 1e-6: the reference's uniform groups are 0/(0+eps) up to rounding.
				require.InDelta(t, w, got[id], 1e-6, "batch %d %s rollout %d", b, est, id)
			}
		}
	}
}

func TestPassAtK(t *testing.T) {
	assert.InDelta(t, 0.5, PassAtK(4, 2, 1), 1e-12)
	assert.InDelta(t, 1-1.0/6, PassAtK(4, 2, 2), 1e-12) // 1 - C(2,2)/C(4,2)
	assert.Equal(t, 1.0, PassAtK(4, 2, 3))
	assert.Equal(t, 0.0, PassAtK(5, 0, 3))
	s := Summarize([]Grade{
		{RolloutID: 1, GroupIndex: 0, TaskID: "a", Reward: 1, Failure: records.FailureNone},
		{RolloutID: 2, GroupIndex: 0, TaskID: "a", Reward: 0, Failure: records.FailureTestsFailed},
		{RolloutID: 3, GroupIndex: 0, TaskID: "a", Reward: 0, Failure: records.FailureInfraError},
		{RolloutID: 4, GroupIndex: 1, TaskID: "b", Reward: 0, Failure: records.FailureTestsFailed},
	})
	assert.InDelta(t, 0.25, s.PassAt1, 1e-12)
	assert.Equal(t, []int{2, 1}, s.TasksAtK)
	assert.InDelta(t, 1.0, s.PassAtK[1], 1e-12)
	assert.Equal(t, TaskStat{GroupIndex: 0, TaskID: "a", Rollouts: 3, Gradeable: 2, Passed: 1, RewardMean: 0.5, PassRate: 0.5}, s.Tasks[0])
	assert.Equal(t, 0.5, s.ZeroAdvantageFraction)
}

// A group with no gradeable grade (all infra_error, aborted or no_grading)
// is listed with zero rates and enters no rate: no 0/0 NaN (mutation
// survivor: t.Gradeable >= 0 in Summarize).
func TestSummarizeNoGradeable(t *testing.T) {
	noPatch := func(id, group int64, failure string) Grade {
		return Grade{RolloutID: id, GroupIndex: group, TaskID: fmt.Sprint("t", group), Failure: failure}
	}
	for _, tc := range []struct {
		name     string
		grades   []Grade
		tasks    []TaskStat
		passAt1  float64
		zeroFrac float64
		tasksAtK []int
	}{
		{"only no-patch group",
			[]Grade{noPatch(1, 0, records.FailureInfraError), noPatch(2, 0, records.FailureAborted), noPatch(3, 0, records.FailureNoGrading)},
			[]TaskStat{{GroupIndex: 0, TaskID: "t0", Rollouts: 3}}, 0, 0, []int{}},
		{"beside a gradeable group",
			[]Grade{noPatch(1, 0, records.FailureInfraError),
				{RolloutID: 2, GroupIndex: 1, TaskID: "t1", Reward: 1, Failure: records.FailureNone},
				{RolloutID: 3, GroupIndex: 1, TaskID: "t1", Failure: records.FailureTestsFailed}},
			[]TaskStat{{GroupIndex: 0, TaskID: "t0", Rollouts: 1}, {GroupIndex: 1, TaskID: "t1", Rollouts: 2, Gradeable: 2, Passed: 1, RewardMean: 0.5, PassRate: 0.5}},
			0.5, 0, []int{1, 1}},
	} {
		s := Summarize(tc.grades)
		assert.Equal(t, tc.tasks, s.Tasks, tc.name)
		for _, ts := range s.Tasks {
			assert.False(t, math.IsNaN(ts.RewardMean) || math.IsNaN(ts.PassRate), "%s: group %d: %+v", tc.name, ts.GroupIndex, ts)
		}
		assert.Equal(t, tc.passAt1, s.PassAt1, tc.name)
		assert.Equal(t, tc.zeroFrac, s.ZeroAdvantageFraction, tc.name)
		assert.Equal(t, tc.tasksAtK, s.TasksAtK, tc.name)
	}
}

// The fan-out metric's buckets at their edges, and every estimator's name
// parsing back to it (mutation survivors: n < 8, hi <= n, and == negated
// in ParseEstimator, which only the CLI tests reached).
func TestFanoutBucketAndParseEstimator(t *testing.T) {
	for n, want := range map[int]string{1: "1", 8: "8", 9: "9-16", 16: "9-16", 17: "17-32"} {
		assert.Equal(t, want, fanoutBucket(n), "n=%d", n)
	}
	for _, e := range Estimators() {
		got, err := ParseEstimator(string(e))
		require.NoError(t, err)
		assert.Equal(t, e, got)
	}
	_, err := ParseEstimator("ppo")
	assert.ErrorContains(t, err, `unknown estimator "ppo"`)
}
