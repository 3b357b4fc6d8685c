package slurm

import (
	"fmt"
	"io"
	"sort"
	"strconv"
	"strings"
	"text/tabwriter"
	"time"

	"github.com/kilnrl/kiln/stages/report"
)

// printTable writes kiln status --table: one row per step (steps with no
// target done or failed are left out) with the step's state, the RL
// loop's numbers (report.TableColumns of report.FromMetrics, the figures
// kiln report draws; "-" where no target of the step recorded
// one) and the wall time of each of the step's targets, a column per
// target name without its step ("rollout" for rollout/3); then the
// datasets: the store, the refs of the targets of no step and of the
// last step with a done target.
func printTable(w io.Writer, storeURI string, targets []Target, rows []Row, details []Details) error {
	type stepRow struct {
		state   string
		metrics []map[string]any
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
	columns := report.TableColumns()
	for _, c := range columns {
		head = append(head, c.Header)
	}
	head = append(head, "|")
	for _, s := range stages {
		head = append(head, s)
	}
	fmt.Fprintln(tw, strings.Join(head, "\t")+"\t")
	for _, k := range idx {
		r := steps[k]
		cells := []string{strconv.Itoa(k), r.state}
		fig := report.FromMetrics(r.metrics)
		for _, c := range columns {
			v := c.Cell(fig)
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
