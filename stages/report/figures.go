package report

import (
	"fmt"
	"sort"
	"strconv"
	"strings"
)

// Figures are one step's numbers as the stages record them in their
// manifests' metrics (docs/report.md §3): what kiln status --table prints
// and what the report's charts draw, computed here once so the two agree.
// A figure no target of the step recorded is nil (null in JSON, "-" in
// the table).
type Figures struct {
	// PassRate is kiln-grade's reward_1 / graded; Graded and Passed are
	// those two counts.
	PassRate *float64 `json:"pass_rate"`
	Graded   *float64 `json:"graded"`
	Passed   *float64 `json:"passed"`
	// MeanReward is the mean reward over gradeable samples: the per-group
	// means of kiln-advantages' group_stats weighted by their gradeable
	// counts.
	MeanReward *float64 `json:"mean_reward"`
	// Groups is the number of groups (tasks) in group_stats, GroupSize
	// the largest gradeable count of one, MixedGroups those whose pass rate
	// is strictly between 0 and 1: the groups GRPO learns from.
	Groups      *float64 `json:"groups"`
	GroupSize   *float64 `json:"group_size"`
	MixedGroups *float64 `json:"mixed_groups"`
	// PassAt1 and PassAtK are kiln-advantages' pass_at_1 and pass_at_k
	// (k -> value), where recorded (an eval target's, or the step's own).
	PassAt1 *float64           `json:"pass_at_1"`
	PassAtK map[string]float64 `json:"pass_at_k,omitempty"`
	// Rollouts, Aborted and Segments are kiln-rollout's runs, aborted and
	// segments; Aborts its abort_<reason> counts by reason.
	Rollouts *float64           `json:"rollouts"`
	Aborted  *float64           `json:"aborted"`
	Segments *float64           `json:"segments"`
	Aborts   map[string]float64 `json:"aborts,omitempty"`
	// GradeFailures are kiln-grade's failure_<class> counts of every
	// class but none.
	GradeFailures map[string]float64 `json:"grade_failures,omitempty"`
	// SegmentsPerRollout is kiln-advantages' fan-out histogram (bucket ->
	// rollouts).
	SegmentsPerRollout map[string]float64 `json:"segments_per_rollout,omitempty"`
	// TrainedTokens is kiln-train's trained_tokens.
	TrainedTokens *float64 `json:"trained_tokens"`
	// The trainer's step_metrics reduced over the step's optimizer steps:
	// the mean of loss, pg_clipfrac, grad_norm, entropy, ppo_kl and
	// kl_loss, the max of train_rollout_logprob_max_abs_diff (null values,
	// such as entropy without an entropy term, skipped).
	Loss        *float64 `json:"loss"`
	ClipFrac    *float64 `json:"clipfrac"`
	LogprobDiff *float64 `json:"train_rollout_logprob_max_abs_diff"`
	GradNorm    *float64 `json:"grad_norm"`
	Entropy     *float64 `json:"entropy"`
	PPOKL       *float64 `json:"ppo_kl"`
	KLLoss      *float64 `json:"kl_loss"`
	// WeightsNumber is the weights number the step's rollouts sampled
	// from (kiln-rollout's weights_number).
	WeightsNumber *float64 `json:"weights_number"`
}

// FromMetrics computes a step's figures from its done targets' output
// metrics, in plan order (a rollout before the training that reads it),
// each target's outputs merged (the first output's value of a key wins).
// A key is read from the first target that has it.
func FromMetrics(ms []map[string]any) Figures {
	s := stepMetrics(ms)
	var f Figures
	if m := s.owner("graded"); m != nil {
		g, ok1 := number(m["graded"])
		p, ok2 := number(m["reward_1"])
		if ok1 {
			f.Graded = &g
		}
		if ok2 {
			f.Passed = ptr(p)
		}
		if ok1 && ok2 && g > 0 {
			f.PassRate = ptr(p / g)
		}
		f.GradeFailures = prefixed(m, "failure_", "none")
	}
	if gs, ok := s.get("group_stats").(map[string]any); ok {
		means, _ := gs["reward_mean"].([]any)
		counts, _ := gs["gradeable"].([]any)
		pass, _ := gs["pass_rate"].([]any)
		if len(means) > 0 && len(means) == len(counts) {
			var sum, n, size float64
			for i := range means {
				m, ok1 := number(means[i])
				c, ok2 := number(counts[i])
				if ok1 && ok2 {
					sum += m * c
					n += c
					size = max(size, c)
				}
			}
			if n > 0 {
				f.MeanReward = ptr(sum / n)
			}
			f.Groups, f.GroupSize = ptr(float64(len(means))), ptr(size)
		}
		if len(pass) > 0 {
			mixed := 0.0
			for _, v := range pass {
				if p, ok := number(v); ok && p > 0 && p < 1 {
					mixed++
				}
			}
			f.MixedGroups = &mixed
		}
	}
	f.PassAt1 = s.num("pass_at_1")
	if pk, ok := s.get("pass_at_k").(map[string]any); ok {
		f.PassAtK = map[string]float64{}
		for k, v := range pk {
			if x, ok := number(v); ok {
				f.PassAtK[k] = x
			}
		}
	}
	f.Rollouts, f.Aborted, f.Segments = s.num("runs"), s.num("aborted"), s.num("segments")
	if m := s.owner("runs"); m != nil {
		f.Aborts = prefixed(m, "abort_", "")
	}
	if spr, ok := s.get("segments_per_rollout").(map[string]any); ok {
		f.SegmentsPerRollout = map[string]float64{}
		for k, v := range spr {
			if x, ok := number(v); ok {
				f.SegmentsPerRollout[k] = x
			}
		}
	}
	f.TrainedTokens = s.num("trained_tokens")
	f.Loss = s.stepColumn("loss", false)
	f.ClipFrac = s.stepColumn("pg_clipfrac", false)
	f.LogprobDiff = s.stepColumn("train_rollout_logprob_max_abs_diff", true)
	f.GradNorm = s.stepColumn("grad_norm", false)
	f.Entropy = s.stepColumn("entropy", false)
	f.PPOKL = s.stepColumn("ppo_kl", false)
	f.KLLoss = s.stepColumn("kl_loss", false)
	f.WeightsNumber = s.num("weights_number")
	return f
}

// prefixed is m's numeric keys PREFIX<name> as name -> value, without
// skip; nil when there are none.
func prefixed(m map[string]any, prefix, skip string) map[string]float64 {
	var out map[string]float64
	for k, v := range m {
		name, ok := strings.CutPrefix(k, prefix)
		if !ok || name == skip {
			continue
		}
		if x, ok := number(v); ok {
			if out == nil {
				out = map[string]float64{}
			}
			out[name] = x
		}
	}
	return out
}

// stepMetrics are a step's done targets' merged output metrics, in plan
// order.
type stepMetrics []map[string]any

// get is the first target's value of key, or nil.
func (s stepMetrics) get(key string) any {
	for _, m := range s {
		if v, ok := m[key]; ok {
			return v
		}
	}
	return nil
}

// owner is the first target's metrics that hold key, or nil: figures
// computed from two metrics read both from the same target.
func (s stepMetrics) owner(key string) map[string]any {
	for _, m := range s {
		if _, ok := m[key]; ok {
			return m
		}
	}
	return nil
}

func (s stepMetrics) num(key string) *float64 {
	if f, ok := number(s.get(key)); ok {
		return &f
	}
	return nil
}

// stepColumn is one of kiln-train's per-optimizer-step columns
// (step_metrics.NAME, a list) reduced to one number: the mean, or with
// useMax the max, over the optimizer steps, null values skipped.
func (s stepMetrics) stepColumn(name string, useMax bool) *float64 {
	sm, _ := s.get("step_metrics").(map[string]any)
	col, _ := sm[name].([]any)
	var xs []float64
	for _, v := range col {
		if f, ok := number(v); ok {
			xs = append(xs, f)
		}
	}
	if len(xs) == 0 {
		return nil
	}
	out := xs[0]
	if useMax {
		for _, x := range xs {
			out = max(out, x)
		}
		return &out
	}
	out = 0
	for _, x := range xs {
		out += x
	}
	out /= float64(len(xs))
	return &out
}

// number is v as a float64: a JSON number or its decimal string
// (kiln-rollout records weights_number as a string).
func number(v any) (float64, bool) {
	switch x := v.(type) {
	case float64:
		return x, true
	case int:
		return float64(x), true
	case int64:
		return float64(x), true
	case string:
		f, err := strconv.ParseFloat(x, 64)
		return f, err == nil
	}
	return 0, false
}

func ptr(f float64) *float64 { return &f }

// Column is one metric column of kiln status --table: its header and its
// cell for a step's figures ("" when the step has none; the table prints
// "-").
type Column struct {
	Header string
	Cell   func(Figures) string
}

func cell(p *float64, format string) string {
	if p == nil {
		return ""
	}
	return fmt.Sprintf(format, *p)
}

// TableColumns are kiln status --table's columns, the RL loop's numbers
// (pipelines/README.md §8), read from Figures.
func TableColumns() []Column {
	return []Column{
		{"PASS", func(f Figures) string { return cell(f.PassRate, "%.3f") }},
		{"REWARD", func(f Figures) string { return cell(f.MeanReward, "%.3f") }},
		{"ROLLOUTS", func(f Figures) string { return cell(f.Rollouts, "%g") }},
		{"ABORTED", func(f Figures) string { return cell(f.Aborted, "%g") }},
		{"SEGMENTS", func(f Figures) string { return cell(f.Segments, "%g") }},
		{"TRAINED_TOKENS", func(f Figures) string { return cell(f.TrainedTokens, "%g") }},
		{"LOSS", func(f Figures) string { return cell(f.Loss, "%.4g") }},
		{"CLIPFRAC", func(f Figures) string { return cell(f.ClipFrac, "%.3g") }},
		{"LOGPROB_DIFF", func(f Figures) string { return cell(f.LogprobDiff, "%.3g") }},
		{"WEIGHTS", func(f Figures) string { return cell(f.WeightsNumber, "%g") }},
	}
}

// sortedKeys is m's keys, sorted.
func sortedKeys[V any](m map[string]V) []string {
	out := make([]string, 0, len(m))
	for k := range m {
		out = append(out, k)
	}
	sort.Strings(out)
	return out
}
