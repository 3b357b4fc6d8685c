package slurm

import (
	"fmt"
	"io"
	"sort"
	"strconv"
	"strings"
	"text/tabwriter"
	"time"
)

// A tableColumn is one metric column of kiln status --table: its header
// and how a step's value is read from the step's done targets' merged
// output metrics (value returns "" when no target of the step has it).
type tableColumn struct {
	header string
	value  func(m stepMetrics) string
}

// stepMetrics are a step's done targets' output metrics, in plan order
// (a rollout before the training that reads it), each target's outputs
// merged as kiln status --summary merges them.
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

// owner is the first target's metrics that hold key, or nil: the columns
// computed from two metrics read both from the same target.
func (s stepMetrics) owner(key string) map[string]any {
	for _, m := range s {
		if _, ok := m[key]; ok {
			return m
		}
	}
	return nil
}

// stepColumn is one of kiln-train's per-optimizer-step columns
// (step_metrics.NAME, a list) reduced to one number: mean or max over
// the optimizer steps, nil values skipped.
func (s stepMetrics) stepColumn(name string, reduce string) (float64, bool) {
	sm, _ := s.get("step_metrics").(map[string]any)
	col, _ := sm[name].([]any)
	var xs []float64
	for _, v := range col {
		if f, ok := number(v); ok {
			xs = append(xs, f)
		}
	}
	if len(xs) == 0 {
		return 0, false
	}
	out := xs[0]
	if reduce == "mean" {
		out = 0
		for _, x := range xs {
			out += x
		}
		out /= float64(len(xs))
	} else {
		for _, x := range xs {
			out = max(out, x)
		}
	}
	return out, true
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

func formatFloat(f float64, ok bool, format string) string {
	if !ok {
		return ""
	}
	return fmt.Sprintf(format, f)
}

func plain(key string) func(stepMetrics) string {
	return func(s stepMetrics) string {
		f, ok := number(s.get(key))
		return formatFloat(f, ok, "%g")
	}
}

// tableColumns are the RL loop's numbers, by the metric names the stages
// record (docs: kiln-grade's graded and reward_1, kiln-advantages'
// group_stats, kiln-rollout's runs, aborted, segments and weights_number,
// kiln-train's trained_tokens and step_metrics).
var tableColumns = []tableColumn{
	{"PASS", func(s stepMetrics) string {
		m := s.owner("graded")
		g, ok1 := number(m["graded"])
		p, ok2 := number(m["reward_1"])
		if !ok1 || !ok2 || g == 0 {
			return ""
		}
		return fmt.Sprintf("%.3f", p/g)
	}},
	// The mean reward over gradeable samples: group_stats' per-group
	// means weighted by their gradeable counts.
	{"REWARD", func(s stepMetrics) string {
		gs, _ := s.get("group_stats").(map[string]any)
		means, _ := gs["reward_mean"].([]any)
		counts, _ := gs["gradeable"].([]any)
		if len(means) == 0 || len(means) != len(counts) {
			return ""
		}
		var sum, n float64
		for i := range means {
			m, ok1 := number(means[i])
			c, ok2 := number(counts[i])
			if ok1 && ok2 {
				sum += m * c
				n += c
			}
		}
		return formatFloat(sum/n, n > 0, "%.3f")
	}},
	{"ROLLOUTS", plain("runs")},
	{"ABORTED", plain("aborted")},
	{"SEGMENTS", plain("segments")},
	{"TRAINED_TOKENS", plain("trained_tokens")},
	{"LOSS", func(s stepMetrics) string { f, ok := s.stepColumn("loss", "mean"); return formatFloat(f, ok, "%.4g") }},
	{"CLIPFRAC", func(s stepMetrics) string {
		f, ok := s.stepColumn("pg_clipfrac", "mean")
		return formatFloat(f, ok, "%.3g")
	}},
	{"LOGPROB_DIFF", func(s stepMetrics) string {
		f, ok := s.stepColumn("train_rollout_logprob_max_abs_diff", "max")
		return formatFloat(f, ok, "%.3g")
	}},
	{"WEIGHTS", plain("weights_number")},
}

// printTable writes kiln status --table: one row per step (steps with no
// target done or failed are left out) with the step's state, the RL
// loop's numbers (tableColumns; "-" where no target of the step recorded
// one) and the wall time of each of the step's targets, a column per
// target name without its step ("rollout" for rollout/3); then the
// datasets: the store, the refs of the targets of no step and of the
// last step with a done target.
func printTable(w io.Writer, storeURI string, targets []Target, rows []Row, details []Details) error {
	type stepRow struct {
		state   string
		metrics stepMetrics
		wall    map[string]float64
		any     bool
	}
	steps := map[int]*stepRow{}
	var stages []string
	seenStage := map[string]bool{}
	for i, t := range targets {
		if t.Step < 0 || t.Service {
			continue
		}
		stage := t.Name
		if j := strings.LastIndex(stage, "/"); j >= 0 {
			stage = stage[:j]
		}
		if !seenStage[stage] {
			seenStage[stage] = true
			stages = append(stages, stage)
		}
		r := steps[t.Step]
		if r == nil {
			r = &stepRow{state: "done", wall: map[string]float64{}}
			steps[t.Step] = r
		}
		switch st := rows[i].State; {
		case st == "done":
			r.any = true
			r.wall[stage] = details[i].WallSeconds
			merged := map[string]any{}
			for _, o := range details[i].Outputs {
				for k, v := range o.Metrics {
					if _, ok := merged[k]; !ok {
						merged[k] = v
					}
				}
			}
			r.metrics = append(r.metrics, merged)
		case st == "failed":
			r.any = true
			r.state = "failed"
		case r.state == "done":
			// missing (a local run), pending, running...: not done yet.
			r.state = "todo"
		}
	}
	idx := make([]int, 0, len(steps))
	for k, r := range steps {
		if r.any {
			idx = append(idx, k)
		}
	}
	sort.Ints(idx)

	tw := tabwriter.NewWriter(w, 0, 4, 2, ' ', tabwriter.AlignRight)
	head := []string{"STEP", "STATE"}
	for _, c := range tableColumns {
		head = append(head, c.header)
	}
	head = append(head, "|")
	for _, s := range stages {
		head = append(head, s)
	}
	fmt.Fprintln(tw, strings.Join(head, "\t")+"\t")
	for _, k := range idx {
		r := steps[k]
		cells := []string{strconv.Itoa(k), r.state}
		for _, c := range tableColumns {
			v := c.value(r.metrics)
			if v == "" {
				v = "-"
			}
			cells = append(cells, v)
		}
		cells = append(cells, "|")
		for _, s := range stages {
			v := "-"
			if sec, ok := r.wall[s]; ok && sec > 0 {
				v = wallString(sec)
			}
			cells = append(cells, v)
		}
		fmt.Fprintln(tw, strings.Join(cells, "\t")+"\t")
	}
	if err := tw.Flush(); err != nil {
		return err
	}
	if len(idx) == 0 {
		fmt.Fprintln(w, "no step has a done target yet")
	}
	fmt.Fprint(w, "PASS: the graded samples' reward-1 fraction; REWARD: their mean reward; LOSS, CLIPFRAC: means over the step's\n"+
		"optimizer steps; LOGPROB_DIFF: the trainer's max |logprob - the engine's|; WEIGHTS: the weights number the\n"+
		"rollouts sampled from; after |, each stage's wall time.\n")

	// Where the datasets are.
	last := -1
	if len(idx) > 0 {
		last = idx[len(idx)-1]
	}
	fmt.Fprintf(w, "\ndatasets in %s (kiln --store %s ls; kiln show NAME@VERSION):\n", storeURI, storeURI)
	dw := tabwriter.NewWriter(w, 0, 4, 2, ' ', 0)
	for i, t := range targets {
		if t.Service || rows[i].State != "done" || (t.Step >= 0 && t.Step != last) {
			continue
		}
		var refs []string
		for _, o := range details[i].Outputs {
			refs = append(refs, o.Ref)
		}
		if len(refs) == 0 && details[i].Ref != "" && !strings.HasPrefix(details[i].Ref, "key:") {
			refs = []string{details[i].Ref}
		}
		if len(refs) == 0 {
			continue
		}
		fmt.Fprintf(dw, "  %s\t%s\n", t.Name, strings.Join(refs, " "))
	}
	return dw.Flush()
}

func wallString(sec float64) string {
	d := time.Duration(sec * float64(time.Second))
	if d < 10*time.Second {
		return d.Round(100 * time.Millisecond).String()
	}
	return d.Round(time.Second).String()
}
