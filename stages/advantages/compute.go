package advantages

import (
	"fmt"
	"math"

	"github.com/kilnrl/kiln/formats/records"
)

// InfraPolicy says what happens to a rollout whose grade says nothing about
// its patch (docs/advantages.md §4).
type InfraPolicy string

// The policies of --infra-failures.
const (
	InfraZero      InfraPolicy = "zero"       // reward 0, like any failing patch (the reference's behaviour)
	InfraExclude   InfraPolicy = "exclude"    // left out of statistics and training; the rest of its group stays
	InfraDropGroup InfraPolicy = "drop-group" // its whole group is left out
)

// ParseInfraPolicy checks an --infra-failures value.
func ParseInfraPolicy(s string) (InfraPolicy, error) {
	switch p := InfraPolicy(s); p {
	case InfraZero, InfraExclude, InfraDropGroup:
		return p, nil
	}
	return "", fmt.Errorf("unknown --infra-failures %q: want zero, exclude or drop-group", s)
}

// NotAboutPatch reports whether a grade failure class says nothing about the
// patch, so its reward 0 is no outcome of the policy (docs/advantages.md
// §4.1): infra_error (kiln could not grade: sandbox, setup, parser),
// aborted (the rollout itself was aborted: engine, adapter, wall clock) and
// no_grading (the task has no tests). none, patch_failed, tests_failed and
// timeout (the tests ran past their limit on the patched tree) are verdicts
// on the patch. An unknown class is an error (ok false), never a guess.
func NotAboutPatch(failure string) (infra, ok bool) {
	switch failure {
	case records.FailureNone, records.FailurePatchFailed, records.FailureTestsFailed, records.FailureTimeout:
		return false, true
	case records.FailureInfraError, records.FailureAborted, records.FailureNoGrading:
		return true, true
	}
	return false, false
}

// Options are the arguments of one computation.
type Options struct {
	Estimator Estimator
	StdEps    float64
	Infra     InfraPolicy
	// MinGroupSize: a group left with fewer rollouts in its statistics is
	// dropped whole (reason small_group).
	MinGroupSize  int
	DropUniform   bool // drop groups without reward variance (uniform_group)
	DropTruncated bool // drop rollouts with a truncated segment (truncated)
}

// Segment is what Compute needs of one trajectories row.
type Segment records.SegmentTotals

// Grade is what Compute needs of one grades row.
type Grade struct {
	RolloutID  int64
	GroupIndex int64
	TaskID     string
	Reward     float64
	Failure    string
	Baseline   bool
}

// GradeOf reads a grades row.
func GradeOf(g *records.Grade) Grade {
	return Grade{RolloutID: g.RolloutID, GroupIndex: g.GroupIndex, TaskID: g.TaskID, Reward: g.Reward, Failure: g.Failure, Baseline: g.Baseline}
}

// Drop reasons: the keys of the dropped_* metrics (docs/advantages.md §5).
const (
	ReasonInfraFailure      = "infra_failure"       // the rollout's grade is not about its patch (--infra-failures exclude)
	ReasonInfraFailureGroup = "infra_failure_group" // a rollout of the group had one (--infra-failures drop-group)
	ReasonTruncated         = "truncated"           // --drop-truncated
	ReasonSmallGroup        = "small_group"         // fewer than --min-group-size rollouts left
	ReasonUniformGroup      = "uniform_group"       // --drop-uniform: no reward variance
)

// BadInput is an input error naming the offending rollout: the command
// maps it to exit status 5.
type BadInput struct{ Err error }

func (e BadInput) Error() string { return e.Err.Error() }
func (e BadInput) Unwrap() error { return e.Err }

func badf(format string, args ...any) error { return BadInput{fmt.Errorf(format, args...)} }

// rollout is one agent run as Compute sees it.
type rollout struct {
	id, index, group int64
	grade            int32 // index into the grades
	segments         int32
	trained          int64
	lastSeg          int32
	unordered        bool // segment numbers did not arrive increasing: check for duplicates
	truncated        bool
	drop             string // "" = kept
	advantage        float64
}

// GroupStat is one group's line in the metrics.
type GroupStat struct {
	GroupIndex int64   `json:"group_index"`
	TaskID     string  `json:"task_id"`
	Rollouts   int     `json:"rollouts"`    // rollouts with segments
	Segments   int     `json:"segments"`    // their segments
	Gradeable  int     `json:"gradeable"`   // rollouts whose grade is about their patch
	RewardMean float64 `json:"reward_mean"` // over the rollouts in the statistics
	PassRate   float64 `json:"pass_rate"`   // fraction of them with reward 1
	Trained    int     `json:"trained"`     // rollouts written
	Dropped    string  `json:"dropped,omitempty"`
	// ZeroAdvantage: every written advantage of the group is 0.
	ZeroAdvantage bool `json:"zero_advantage"`
}

// Result is a computation's output: rows in trajectories order, and what
// happened to the rest.
type Result struct {
	Rows   []records.Advantage
	Groups []GroupStat // in order of first appearance in the trajectories
	// Dropped counts removed segments, rollouts and groups by reason.
	DroppedRows, DroppedRollouts, DroppedGroups map[string]int
	// GradesWithoutTrajectories counts grades of rollouts that have no
	// segment: they are in no statistics (docs/advantages.md §2.3).
	GradesWithoutTrajectories int
	Rollouts                  int
	// SegmentsPerRollout is the fan-out histogram (bucket label -> rollouts).
	SegmentsPerRollout map[string]int
}

// Compute joins segments to grades, filters, and broadcasts each rollout's
// advantage to its segments (docs/advantages.md §2-§4). Every input
// inconsistency is a BadInput naming the rollout; nothing is guessed.
func Compute(segs []Segment, grades []Grade, o Options) (*Result, error) {
	if o.MinGroupSize < 1 {
		o.MinGroupSize = 1
	}
	byID := make(map[int64]int32, len(grades))
	for i := range grades {
		g := &grades[i]
		if g.Baseline {
			return nil, badf("grade of rollout %d (task %q) is a baseline grade of the empty patch, not a rollout's: pass the grades kiln-grade wrote from --rollouts", g.RolloutID, g.TaskID)
		}
		if math.IsNaN(g.Reward) || g.Reward < 0 || g.Reward > 1 {
			return nil, badf("grade of rollout %d (task %q): reward %v is outside [0, 1]: regrade the rollout", g.RolloutID, g.TaskID, g.Reward)
		}
		if _, ok := NotAboutPatch(g.Failure); !ok {
			return nil, badf("grade of rollout %d (task %q): unknown failure class %q: this kiln-advantages does not know whether it is about the patch; upgrade it", g.RolloutID, g.TaskID, g.Failure)
		}
		if _, dup := byID[g.RolloutID]; dup {
			return nil, badf("rollout %d has two grades (tasks %q and %q): one grade per rollout; pass a grades version without duplicates", g.RolloutID, grades[byID[g.RolloutID]].TaskID, g.TaskID)
		}
		byID[g.RolloutID] = int32(i)
	}

	// Rollouts in order of first appearance; seg2r maps each segment to its rollout.
	ridx := make(map[int64]int32, len(grades))
	var rs []rollout
	seg2r := make([]int32, len(segs))
	prev, prevRI := int64(0), int32(-1)
	for i := range segs {
		s := &segs[i]
		// A rollout's segments are nearly always adjacent: skip the map then.
		ri, ok := prevRI, prevRI >= 0 && s.RolloutID == prev
		if !ok {
			ri, ok = ridx[s.RolloutID]
		}
		if !ok {
			gi, graded := byID[s.RolloutID]
			if !graded {
				return nil, badf("rollout %d (group %d) has segments but no grade: grade it (kiln-grade) or pass the grades version of these rollouts", s.RolloutID, s.GroupIndex)
			}
			if g := &grades[gi]; g.GroupIndex != s.GroupIndex {
				return nil, badf("rollout %d: its segments are in group %d but its grade (task %q) is in group %d: the trajectories and grades come from different task versions", s.RolloutID, s.GroupIndex, g.TaskID, g.GroupIndex)
			}
			ri = int32(len(rs))
			ridx[s.RolloutID] = ri
			rs = append(rs, rollout{id: s.RolloutID, index: s.Index, group: s.GroupIndex, grade: gi, lastSeg: s.Segment})
		} else {
			r := &rs[ri]
			if s.GroupIndex != r.group || s.Index != r.index {
				return nil, badf("rollout %d: segment %d has group_index %d and index %d, an earlier segment %d and %d: all segments of a rollout must agree", s.RolloutID, s.Segment, s.GroupIndex, s.Index, r.group, r.index)
			}
			if s.Segment <= r.lastSeg {
				r.unordered = true
			}
			r.lastSeg = max(r.lastSeg, s.Segment)
		}
		r := &rs[ri]
		r.segments++
		r.trained += s.Trained
		r.truncated = r.truncated || s.Truncated
		seg2r[i] = ri
		prev, prevRI = s.RolloutID, ri
	}
	if err := checkDuplicateSegments(segs, seg2r, rs); err != nil {
		return nil, err
	}

	res := &Result{
		DroppedRows: map[string]int{}, DroppedRollouts: map[string]int{}, DroppedGroups: map[string]int{},
		GradesWithoutTrajectories: len(grades) - len(rs), Rollouts: len(rs), SegmentsPerRollout: map[string]int{},
	}

	// Groups in order of first appearance, over DISTINCT rollouts.
	gidx := map[int64]int{}
	var members [][]int32
	for ri := range rs {
		r := &rs[ri]
		res.SegmentsPerRollout[fanoutBucket(int(r.segments))]++
		gi, ok := gidx[r.group]
		if !ok {
			gi = len(res.Groups)
			gidx[r.group] = gi
			res.Groups = append(res.Groups, GroupStat{GroupIndex: r.group, TaskID: grades[r.grade].TaskID})
			members = append(members, nil)
		}
		members[gi] = append(members[gi], int32(ri))
	}

	var rewards, adv []float64
	for gi := range res.Groups {
		gs := &res.Groups[gi]
		var groupDrop string
		for _, ri := range members[gi] {
			r := &rs[ri]
			gs.Rollouts++
			gs.Segments += int(r.segments)
			infra, _ := NotAboutPatch(grades[r.grade].Failure)
			if !infra {
				gs.Gradeable++
			}
			switch {
			case infra && o.Infra == InfraExclude:
				r.drop = ReasonInfraFailure
			case infra && o.Infra == InfraDropGroup:
				groupDrop = ReasonInfraFailureGroup
			case o.DropTruncated && r.truncated:
				r.drop = ReasonTruncated
			}
		}
		rewards, adv = rewards[:0], adv[:0]
		for _, ri := range members[gi] {
			if rs[ri].drop == "" {
				rewards = append(rewards, grades[rs[ri].grade].Reward)
			}
		}
		if len(rewards) > 0 {
			var sum, pass float64
			for _, rw := range rewards {
				sum += rw
				if rw == 1 {
					pass++
				}
			}
			gs.RewardMean, gs.PassRate = sum/float64(len(rewards)), pass/float64(len(rewards))
		}
		switch {
		case groupDrop != "":
		case len(rewards) < o.MinGroupSize:
			groupDrop = ReasonSmallGroup
		case o.DropUniform && isUniform(rewards):
			groupDrop = ReasonUniformGroup
		}
		if groupDrop != "" {
			gs.Dropped = groupDrop
			res.DroppedGroups[groupDrop]++
			for _, ri := range members[gi] {
				if rs[ri].drop == "" {
					rs[ri].drop = groupDrop
				}
			}
		}
		for _, ri := range members[gi] {
			if r := &rs[ri]; r.drop != "" {
				res.DroppedRollouts[r.drop]++
				res.DroppedRows[r.drop] += int(r.segments)
			}
		}
		if groupDrop != "" {
			continue
		}
		adv = append(adv, make([]float64, len(rewards))...)
		GroupAdvantages(o.Estimator, rewards, o.StdEps, adv)
		k, zero := 0, true
		for _, ri := range members[gi] {
			if r := &rs[ri]; r.drop == "" {
				r.advantage = adv[k]
				zero = zero && adv[k] == 0
				k++
			}
		}
		gs.Trained, gs.ZeroAdvantage = k, zero
	}

	kept := 0
	for ri := range rs {
		if rs[ri].drop == "" {
			kept += int(rs[ri].segments)
		}
	}
	res.Rows = make([]records.Advantage, 0, kept)
	for i := range segs {
		r := &rs[seg2r[i]]
		if r.drop != "" {
			continue
		}
		res.Rows = append(res.Rows, records.Advantage{RolloutID: r.id, Segment: segs[i].Segment, GroupIndex: r.group,
			Advantage: r.advantage, RolloutTrainedTokens: r.trained, Reward: grades[r.grade].Reward})
	}
	return res, nil
}

// checkDuplicateSegments finds a segment number repeated within a rollout.
// Segments nearly always arrive in increasing order per rollout, which
// rules duplicates out; only the other rollouts are checked with a set.
func checkDuplicateSegments(segs []Segment, seg2r []int32, rs []rollout) error {
	seen := map[[2]int64]bool{}
	for i := range segs {
		r := &rs[seg2r[i]]
		if !r.unordered {
			continue
		}
		k := [2]int64{r.id, int64(segs[i].Segment)}
		if seen[k] {
			return badf("rollout %d: segment %d appears twice: pass a trajectories version with one row per segment", r.id, segs[i].Segment)
		}
		seen[k] = true
	}
	return nil
}

func isUniform(rewards []float64) bool {
	for _, r := range rewards {
		if r != rewards[0] {
			return false
		}
	}
	return true
}

// fanoutBucket labels a segments-per-rollout count: exact up to 8, then
// powers of two ("9-16", "17-32", ...).
func fanoutBucket(n int) string {
	if n <= 8 {
		return fmt.Sprint(n)
	}
	hi := 16
	for hi < n {
		hi *= 2
	}
	return fmt.Sprintf("%d-%d", hi/2+1, hi)
}
