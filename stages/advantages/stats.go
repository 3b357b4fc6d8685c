package advantages

import (
	"fmt"
	"io"
	"sort"
	"strconv"
)

// TaskStat is one group's reward statistics over a grades version.
type TaskStat struct {
	GroupIndex int64   `json:"group_index"`
	TaskID     string  `json:"task_id"`
	Rollouts   int     `json:"rollouts"`
	Gradeable  int     `json:"gradeable"` // grades about the patch (docs/advantages.md §4.1)
	Passed     int     `json:"passed"`    // gradeable with reward 1
	RewardMean float64 `json:"reward_mean"`
	PassRate   float64 `json:"pass_rate"`
}

// Summary is the reward statistics of a grades version (docs/advantages.md §5).
type Summary struct {
	Tasks     []TaskStat // by group_index
	Grades    int
	Gradeable int
	// PassAt1 is the mean pass rate over tasks with a gradeable sample.
	PassAt1 float64
	// PassAtK[k-1] is the unbiased pass@k averaged over the tasks with at
	// least k gradeable samples; TasksAtK[k-1] is how many those are.
	PassAtK  []float64
	TasksAtK []int
	// ZeroAdvantageFraction is the fraction of tasks with a gradeable sample
	// whose centred advantages are all 0 (one sample, or all equal).
	ZeroAdvantageFraction float64
}

// Summarize computes the statistics of grades; grades not about the patch
// are counted but enter no rate.
func Summarize(grades []Grade) Summary {
	byGroup := map[int64]*TaskStat{}
	var sum Summary
	sum.Grades = len(grades)
	for i := range grades {
		g := &grades[i]
		t := byGroup[g.GroupIndex]
		if t == nil {
			t = &TaskStat{GroupIndex: g.GroupIndex, TaskID: g.TaskID}
			byGroup[g.GroupIndex] = t
		}
		t.Rollouts++
		if infra, _ := NotAboutPatch(g.Failure); infra {
			continue
		}
		t.Gradeable++
		t.RewardMean += g.Reward
		if g.Reward == 1 {
			t.Passed++
		}
	}
	maxN, withSample, zero := 0, 0, 0
	for _, t := range byGroup {
		if t.Gradeable > 0 {
			t.RewardMean /= float64(t.Gradeable)
			t.PassRate = float64(t.Passed) / float64(t.Gradeable)
			sum.PassAt1 += t.PassRate
			withSample++
			if t.Gradeable < 2 || t.Passed == 0 || t.Passed == t.Gradeable {
				zero++
			}
		}
		sum.Gradeable += t.Gradeable
		maxN = max(maxN, t.Gradeable)
		sum.Tasks = append(sum.Tasks, *t)
	}
	sort.Slice(sum.Tasks, func(i, j int) bool { return sum.Tasks[i].GroupIndex < sum.Tasks[j].GroupIndex })
	if withSample > 0 {
		sum.PassAt1 /= float64(withSample)
		sum.ZeroAdvantageFraction = float64(zero) / float64(withSample)
	}
	sum.PassAtK, sum.TasksAtK = make([]float64, maxN), make([]int, maxN)
	for _, t := range sum.Tasks {
		for k := 1; k <= t.Gradeable; k++ {
			sum.PassAtK[k-1] += PassAtK(t.Gradeable, t.Passed, k)
			sum.TasksAtK[k-1]++
		}
	}
	for k := range sum.PassAtK {
		sum.PassAtK[k] /= float64(sum.TasksAtK[k])
	}
	return sum
}

// PassAtK is the unbiased estimator of pass@k from n samples with c
// successes: 1 − C(n−c, k) / C(n, k), computed as a product so large n
// does not overflow.
func PassAtK(n, c, k int) float64 {
	if n-c < k {
		return 1
	}
	p := 1.0
	for i := n - c + 1; i <= n; i++ {
		p *= 1 - float64(k)/float64(i)
	}
	return 1 - p
}

// Metrics is the summary as manifest metrics.
func (s Summary) Metrics(m map[string]any) {
	m["grades"] = s.Grades
	m["gradeable"] = s.Gradeable
	m["tasks"] = len(s.Tasks)
	m["pass_at_1"] = s.PassAt1
	pk := map[string]float64{}
	for k, v := range s.PassAtK {
		pk[strconv.Itoa(k+1)] = v
	}
	m["pass_at_k"] = pk
	m["task_zero_advantage_fraction"] = s.ZeroAdvantageFraction
}

// Print writes the summary as text: totals, pass@k, then one line per task.
func (s Summary) Print(w io.Writer) {
	fmt.Fprintf(w, "grades %d, gradeable %d, tasks %d\n", s.Grades, s.Gradeable, len(s.Tasks))
	for k, v := range s.PassAtK {
		fmt.Fprintf(w, "pass@%d %.6f (%d tasks)\n", k+1, v, s.TasksAtK[k])
	}
	fmt.Fprintf(w, "zero-advantage tasks %.6f\n", s.ZeroAdvantageFraction)
	fmt.Fprintf(w, "%-12s %-40s %8s %9s %6s %11s %9s\n", "GROUP", "TASK", "ROLLOUTS", "GRADEABLE", "PASSED", "REWARD_MEAN", "PASS_RATE")
	for _, t := range s.Tasks {
		fmt.Fprintf(w, "%-12d %-40s %8d %9d %6d %11.6f %9.6f\n", t.GroupIndex, t.TaskID, t.Rollouts, t.Gradeable, t.Passed, t.RewardMean, t.PassRate)
	}
}
