package report

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"math"
	"path/filepath"
	"sort"
	"strings"

	"github.com/kilnrl/kiln/formats/dataset"
	"github.com/kilnrl/kiln/formats/records"
	"github.com/kilnrl/kiln/formats/store"
	"github.com/kilnrl/kiln/internal/stagecmd"
	"github.com/kilnrl/kiln/pipelines"
)

// Format tags the report's JSON (docs/report.md §4).
const Format = "kiln.report/v1"

// Report is the data behind the page and kiln report --json
// (docs/report.md §4): per step the figures, the row-derived numbers, the
// wall times and the rollouts; the per-task matrix; the lineage.
type Report struct {
	Format string `json:"format"`
	Store  string `json:"store"`
	// Pipeline is the spec's path and name (pipeline mode); Refs the refs
	// given (ref mode).
	Pipeline     string   `json:"pipeline,omitempty"`
	PipelineName string   `json:"pipeline_name,omitempty"`
	Refs         []string `json:"refs,omitempty"`
	// Page is the page's absolute path: set by kiln report --json --out,
	// which writes it (docs/report.md §4).
	Page  string  `json:"page,omitempty"`
	Steps []*Step `json:"steps"`
	// LatestWeights is the highest weights number any step sampled from.
	LatestWeights *float64 `json:"latest_weights_number"`
	// Tasks is the per-task × step matrix: each task's pass rate per step
	// (aligned with Steps; null where the step graded none of it).
	Tasks []*TaskRow `json:"tasks"`
	// Lineage is every version the last step's outputs were made from,
	// newest first, down to the tasks and the base model.
	Lineage []LineageNode `json:"lineage"`
	// Notes are what the report could not read (a forgotten version, a
	// missing attachment), each shown in the page too.
	Notes []string `json:"notes,omitempty"`
}

// Step is one RL step.
type Step struct {
	Step int `json:"step"`
	// State is done (every target done), failed (one failed) or todo.
	State   string             `json:"state"`
	Targets []StepTarget       `json:"targets"`
	Figures Figures            `json:"figures"`
	Rows    RowFigures         `json:"rows"`
	Wall    map[string]float64 `json:"wall_s,omitempty"`
	// Staleness is how many training steps behind the weights the rollouts
	// sampled from were: the step of the checkpoint the trainer started
	// from minus the step of the checkpoint the weights were published
	// from (the base model is step 0); null when either is unknown.
	Staleness *float64 `json:"staleness"`
	// Best and Worst are rollout ids, by advantage (then reward), best or
	// worst first, at most BestWorst each.
	Best  []int64 `json:"best"`
	Worst []int64 `json:"worst"`
	// Rollouts are the step's rollouts in id order.
	Rollouts []*Rollout `json:"rollouts"`

	versions map[string]*dataset.Version // by kind: the step's first output of each
}

// StepTarget is one of a step's targets (pipeline mode) or datasets (ref
// mode).
type StepTarget struct {
	Name    string   `json:"name"`
	Stage   string   `json:"stage"`
	State   string   `json:"state"`
	Outputs []string `json:"outputs,omitempty"`
	WallS   float64  `json:"wall_s,omitempty"`
}

// RowFigures are a step's numbers read from its rows, not its manifests.
type RowFigures struct {
	PromptTokens   *float64 `json:"prompt_tokens"`
	ResponseTokens *float64 `json:"response_tokens"`
	// TrainedTokens are the trajectories' loss_mask ones.
	TrainedTokens *float64 `json:"trained_tokens"`
	// SegmentsPerRollout is the mean number of trajectory segments of a
	// rollout that has any.
	SegmentsPerRollout *float64 `json:"segments_per_rollout"`
	// Advantage is the distribution of the rollouts' advantages (one value
	// per rollout, from its first segment's row).
	Advantage *Distribution `json:"advantage"`
}

// Distribution is a histogram with its summary.
type Distribution struct {
	N     int       `json:"n"`
	Min   float64   `json:"min"`
	Max   float64   `json:"max"`
	Mean  float64   `json:"mean"`
	Std   float64   `json:"std"`
	Edges []float64 `json:"edges"`
	Count []int     `json:"counts"`
}

// Rollout is one rollout's summary, joined from its rows.
type Rollout struct {
	ID        int64    `json:"rollout_id"`
	Group     int64    `json:"group_index"`
	Sample    int64    `json:"sample"`
	TaskID    string   `json:"task_id"`
	Turns     int64    `json:"turns"`
	Prompt    int64    `json:"prompt_tokens"`
	Output    int64    `json:"output_tokens"`
	Trained   int64    `json:"trained_tokens"`
	Segments  int      `json:"segments"`
	Abort     string   `json:"abort_reason,omitempty"`
	Reward    *float64 `json:"reward"`
	Failure   string   `json:"failure,omitempty"`
	Advantage *float64 `json:"advantage"`
	// Page is where its view is, once the page is written (WriteHTML):
	// "#r-STEP-ID" in the page, or "OUT_files/step-K.html#r-STEP-ID",
	// relative to the page's directory (docs/report.md §2, §4); empty
	// (absent from the JSON) when no page is written.
	Page string `json:"page,omitempty"`

	row   records.Rollout
	grade *records.Grade
}

// TaskRow is one task's row of the matrix.
type TaskRow struct {
	TaskID string     `json:"task_id"`
	Group  int64      `json:"group_index"`
	Pass   []*float64 `json:"pass_rate"`
	Graded []int      `json:"graded"`
}

// LineageNode is one version of the lineage.
type LineageNode struct {
	Ref      string   `json:"ref"`
	Kind     string   `json:"kind"`
	Stage    string   `json:"stage"`
	Inputs   []string `json:"inputs"`
	External []string `json:"external,omitempty"`
	Missing  bool     `json:"missing,omitempty"`
}

// BestWorst is how many best and worst rollouts of each step the page
// puts one click away.
const BestWorst = 3

// Options say what to gather.
type Options struct {
	Store store.Store
	// Pipeline is a spec file (pipeline mode), with its variables and the
	// environment it is expanded in; else Refs (ref mode).
	Pipeline string
	Vars     map[string]string
	Environ  []string
	Refs     []string
	Log      *slog.Logger
}

// source is one step's outputs before they are read.
type source struct {
	step    int
	state   string
	targets []StepTarget
	outputs [][]string // per target, its output refs
	notes   []string
}

// Gather reads the run from the store.
func Gather(ctx context.Context, o Options) (*Report, error) {
	if o.Log == nil {
		o.Log = slog.New(slog.DiscardHandler)
	}
	r := &Report{Format: Format, Store: o.Store.URI(), Tasks: []*TaskRow{}, Lineage: []LineageNode{}}
	var srcs []source
	var err error
	if o.Pipeline != "" {
		r.Pipeline = o.Pipeline
		srcs, r.PipelineName, err = pipelineSources(ctx, o)
	} else {
		r.Refs = o.Refs
		srcs, err = refSources(ctx, o)
	}
	if err != nil {
		return nil, err
	}
	ckptStep := map[string]int{}
	for _, s := range srcs {
		st := &Step{Step: s.step, State: s.state, Targets: s.targets, versions: map[string]*dataset.Version{}, Best: []int64{}, Worst: []int64{}, Rollouts: []*Rollout{}}
		r.Notes = append(r.Notes, s.notes...)
		var metrics []map[string]any
		for i, outs := range s.outputs {
			merged := map[string]any{}
			for _, ref := range outs {
				v, err := dataset.OpenString(ctx, o.Store, ref)
				if errors.Is(err, dataset.ErrNotFound) {
					r.Notes = append(r.Notes, fmt.Sprintf("step %d: %s's output %s is not in the store (forgotten?): its figures are missing", s.step, s.targets[i].Name, ref))
					continue
				}
				if err != nil {
					return nil, err
				}
				for k, x := range v.Metrics {
					if _, ok := merged[k]; !ok {
						merged[k] = x
					}
				}
				if _, ok := st.versions[v.Kind().Name]; !ok {
					st.versions[v.Kind().Name] = v
				}
			}
			metrics = append(metrics, merged)
		}
		st.Figures = FromMetrics(metrics)
		for _, t := range s.targets {
			if t.WallS > 0 {
				if st.Wall == nil {
					st.Wall = map[string]float64{}
				}
				st.Wall[t.Stage] = t.WallS
			}
		}
		if err := readRows(ctx, o.Store, st, r); err != nil {
			return nil, err
		}
		if v := st.versions["checkpoints"]; v != nil {
			ckptStep[v.Ref().String()] = st.Step
		}
		if w := st.Figures.WeightsNumber; w != nil && (r.LatestWeights == nil || *w > *r.LatestWeights) {
			r.LatestWeights = ptr(*w)
		}
		r.Steps = append(r.Steps, st)
	}
	for _, st := range r.Steps {
		st.Staleness = staleness(ctx, o.Store, st, ckptStep)
	}
	matrix(r)
	lineage(ctx, o.Store, r)
	return r, nil
}

// pipelineSources plans the spec as kiln status does and returns its
// steps with a done or failed target.
func pipelineSources(ctx context.Context, o Options) ([]source, string, error) {
	spec, err := pipelines.Load(o.Pipeline, o.Vars, o.Environ)
	if err != nil {
		return nil, "", err
	}
	plan, err := pipelines.NewPlan(ctx, spec, pipelines.PlanOptions{Store: o.Store, Log: o.Log})
	if err != nil {
		return nil, "", err
	}
	byStep := map[int]*source{}
	anyDone := false
	for _, t := range plan.Targets {
		if t.Step < 0 || t.Service {
			continue
		}
		s := byStep[t.Step]
		if s == nil {
			s = &source{step: t.Step, state: "done"}
			byStep[t.Step] = s
		}
		sum, err := plan.Summary(ctx, t, false)
		if err != nil {
			return nil, "", err
		}
		tgt := StepTarget{Name: t.Name, Stage: stageOf(t.Name), State: "todo", WallS: sum.WallSeconds}
		var outs []string
		switch {
		case t.Done:
			tgt.State, outs, anyDone = "done", t.Outputs, true
		case sum.Failure != nil:
			tgt.State, s.state = "failed", "failed"
		case s.state == "done":
			s.state = "todo"
		}
		tgt.Outputs = outs
		s.targets = append(s.targets, tgt)
		s.outputs = append(s.outputs, outs)
	}
	if !anyDone {
		return nil, "", stagecmd.BadInputf("%s: no step of pipeline %q has a done target yet: nothing to report (kiln status %s shows each target's state)",
			o.Pipeline, spec.Name, o.Pipeline)
	}
	var out []source
	for _, s := range byStep {
		if slicesAny(s.targets, func(t StepTarget) bool { return t.State != "todo" }) {
			out = append(out, *s)
		}
	}
	sort.Slice(out, func(i, j int) bool { return out[i].step < out[j].step })
	return out, spec.Name, nil
}

func slicesAny[T any](xs []T, f func(T) bool) bool {
	for _, x := range xs {
		if f(x) {
			return true
		}
	}
	return false
}

// stageOf is a target's name without its step ("rollout" for rollout/3).
func stageOf(name string) string {
	if i := strings.LastIndex(name, "/"); i >= 0 {
		return name[:i]
	}
	return name
}

// runKinds are the kinds a run's step is made of, in the order a step
// makes them; a ref of another kind is not a run's output.
var runKinds = []string{"weights", "rollouts", "turns", "trajectories", "grades", "advantages", "checkpoints"}

// refSources makes one step of each ref, in the order given: the ref's
// version and what it was made from within the step, found through the
// manifests' inputs (a checkpoint's trajectories and advantages, an
// advantages version's grades, a grades version's rollouts), the sibling
// outputs of kiln-rollout run (OUT/rollouts, OUT/turns, OUT/trajectories
// share a version id) and the weights the rollouts name. Another step's
// checkpoint or weights is not followed.
func refSources(ctx context.Context, o Options) ([]source, error) {
	if len(o.Refs) == 0 {
		return nil, stagecmd.Usagef("report: give a PIPELINE.kiln or at least one REF; see kiln report --help")
	}
	var out []source
	for i, ref := range o.Refs {
		v, err := dataset.OpenString(ctx, o.Store, ref)
		if err != nil {
			return nil, fmt.Errorf("report: %q: %w", ref, err)
		}
		if !contains(runKinds, v.Kind().Name) {
			return nil, stagecmd.BadInputf("report: %q holds %s records: not a run's output; give a rollouts, turns, trajectories, grades, advantages, checkpoints or weights version, or a PIPELINE.kiln (kiln ls lists the datasets)",
				ref, v.Kind().Name)
		}
		found := map[string]*dataset.Version{v.Kind().Name: v}
		var missing []string
		queue := []*dataset.Version{v}
		visit := func(r dataset.Ref) {
			x, err := dataset.Open(ctx, o.Store, r)
			if err != nil {
				missing = append(missing, r.String())
				return
			}
			k := x.Kind().Name
			if _, ok := found[k]; ok || !contains(runKinds, k) {
				return
			}
			found[k] = x
			queue = append(queue, x)
		}
		for len(queue) > 0 {
			x := queue[0]
			queue = queue[1:]
			if x != v && (x.Kind().Name == "checkpoints" || x.Kind().Name == "weights") {
				continue // another step's
			}
			for _, in := range x.Inputs {
				visit(in)
			}
			switch k := x.Kind().Name; k {
			case "rollouts", "turns", "trajectories":
				base := strings.TrimSuffix(x.Dataset, "/"+k)
				for _, sib := range []string{"rollouts", "turns", "trajectories"} {
					if _, ok := found[sib]; !ok && base != x.Dataset {
						visit(dataset.Ref{Name: base + "/" + sib, Version: x.Version})
					}
				}
				if w, ok := x.Metrics["weights"].(string); ok {
					if wr, err := dataset.ParseRef(w); err == nil {
						visit(wr)
					}
				}
			}
		}
		s := source{step: i + 1, state: "done"}
		for _, k := range runKinds {
			x := found[k]
			if x == nil {
				continue
			}
			s.targets = append(s.targets, StepTarget{Name: x.Dataset, Stage: k, State: "done", Outputs: []string{x.Ref().String()}})
			s.outputs = append(s.outputs, []string{x.Ref().String()})
		}
		for _, m := range missing {
			s.notes = append(s.notes, fmt.Sprintf("step %d (%s): its input %s is not in the store (forgotten?)", s.step, ref, m))
		}
		out = append(out, s)
	}
	return out, nil
}

func contains(xs []string, s string) bool {
	for _, x := range xs {
		if x == s {
			return true
		}
	}
	return false
}

// readRows reads the step's rollouts, grades, advantages and trajectory
// totals into its rollouts and row figures.
func readRows(ctx context.Context, st store.Store, s *Step, r *Report) error {
	byID := map[int64]*Rollout{}
	get := func(id int64) *Rollout {
		x := byID[id]
		if x == nil {
			x = &Rollout{ID: id}
			byID[id] = x
		}
		return x
	}
	if v := s.versions["rollouts"]; v != nil {
		var prompt, output float64
		if err := v.EachShard(ctx, func(_ int, data []byte) error {
			return records.EachRollout(data, func(row records.Rollout) error {
				x := get(row.RolloutID)
				x.row, x.Group, x.Sample, x.TaskID, x.Turns = row, row.GroupIndex, row.Sample, row.TaskID, row.Turns
				x.Prompt, x.Output = row.PromptTokens, row.OutputTokens
				if row.AbortReason != nil {
					x.Abort = *row.AbortReason
				}
				prompt += float64(row.PromptTokens)
				output += float64(row.OutputTokens)
				return nil
			})
		}); err != nil {
			return fmt.Errorf("reading %s: %w", v.Ref(), err)
		}
		s.Rows.PromptTokens, s.Rows.ResponseTokens = &prompt, &output
	}
	if v := s.versions["grades"]; v != nil {
		if err := v.EachShard(ctx, func(_ int, data []byte) error {
			return records.EachGrade(data, func(g records.Grade) error {
				if g.Baseline {
					return nil
				}
				x := get(g.RolloutID)
				gg := g
				x.grade, x.Reward, x.Failure = &gg, ptr(g.Reward), g.Failure
				if x.TaskID == "" {
					x.TaskID, x.Group, x.Sample = g.TaskID, g.GroupIndex, g.Sample
				}
				return nil
			})
		}); err != nil {
			return fmt.Errorf("reading %s: %w", v.Ref(), err)
		}
	}
	if v := s.versions["advantages"]; v != nil {
		if err := v.EachShard(ctx, func(_ int, data []byte) error {
			return records.EachAdvantage(data, func(a *records.Advantage) error {
				if x := get(a.RolloutID); x.Advantage == nil {
					x.Advantage = ptr(a.Advantage)
				}
				return nil
			})
		}); err != nil {
			return fmt.Errorf("reading %s: %w", v.Ref(), err)
		}
	}
	if v := s.versions["trajectories"]; v != nil {
		var trained float64
		if err := v.EachShard(ctx, func(_ int, data []byte) error {
			return records.EachSegmentTotals(data, func(t records.SegmentTotals) error {
				x := get(t.RolloutID)
				x.Segments++
				x.Trained += t.Trained
				trained += float64(t.Trained)
				return nil
			})
		}); err != nil {
			return fmt.Errorf("reading %s: %w", v.Ref(), err)
		}
		s.Rows.TrainedTokens = &trained
	}
	ids := make([]int64, 0, len(byID))
	for id := range byID {
		ids = append(ids, id)
	}
	sort.Slice(ids, func(i, j int) bool { return ids[i] < ids[j] })
	var segs, withSegs float64
	var advs []float64
	for _, id := range ids {
		x := byID[id]
		s.Rollouts = append(s.Rollouts, x)
		if x.Segments > 0 {
			segs += float64(x.Segments)
			withSegs++
		}
		if x.Advantage != nil {
			advs = append(advs, *x.Advantage)
		}
	}
	if withSegs > 0 {
		s.Rows.SegmentsPerRollout = ptr(segs / withSegs)
	}
	s.Rows.Advantage = distribution(advs)
	// Best and worst: by advantage, then reward, among the rollouts with
	// an advantage (an aborted or filtered one has none); by reward when
	// the step has no advantages.
	ranked := make([]*Rollout, 0, len(s.Rollouts))
	for _, x := range s.Rollouts {
		if x.Advantage != nil || (len(advs) == 0 && x.Reward != nil) {
			ranked = append(ranked, x)
		}
	}
	score := func(x *Rollout) (float64, float64) {
		a, rw := math.Inf(-1), math.Inf(-1)
		if x.Advantage != nil {
			a = *x.Advantage
		}
		if x.Reward != nil {
			rw = *x.Reward
		}
		return a, rw
	}
	sort.SliceStable(ranked, func(i, j int) bool {
		ai, ri := score(ranked[i])
		aj, rj := score(ranked[j])
		if ai != aj {
			return ai > aj
		}
		return ri > rj
	})
	n := min(BestWorst, len(ranked)/2)
	if len(ranked) == 1 {
		n = 1
	}
	for i := 0; i < n; i++ {
		s.Best = append(s.Best, ranked[i].ID)
		if len(ranked) > 1 {
			s.Worst = append(s.Worst, ranked[len(ranked)-1-i].ID)
		}
	}
	return nil
}

// distribution is xs' histogram (20 equal bins over [min, max]), nil for
// none.
func distribution(xs []float64) *Distribution {
	if len(xs) == 0 {
		return nil
	}
	d := &Distribution{N: len(xs), Min: xs[0], Max: xs[0]}
	for _, x := range xs {
		d.Min, d.Max = min(d.Min, x), max(d.Max, x)
		d.Mean += x
	}
	d.Mean /= float64(len(xs))
	for _, x := range xs {
		d.Std += (x - d.Mean) * (x - d.Mean)
	}
	d.Std = math.Sqrt(d.Std / float64(len(xs)))
	const bins = 20
	lo, hi := d.Min, d.Max
	if hi == lo {
		lo, hi = lo-0.5, hi+0.5
	}
	d.Edges, d.Count = make([]float64, bins+1), make([]int, bins)
	for i := range d.Edges {
		d.Edges[i] = lo + (hi-lo)*float64(i)/bins
	}
	for _, x := range xs {
		b := int((x - lo) / (hi - lo) * bins)
		d.Count[min(max(b, 0), bins-1)]++
	}
	return d
}

// staleness is the step of the checkpoint the trainer started from (the
// step before, without a checkpoint) minus the step of the checkpoint the
// sampled weights were published from (kiln-sync's source metric; 0 for
// a base model directory).
func staleness(ctx context.Context, st store.Store, s *Step, ckptStep map[string]int) *float64 {
	stepOf := func(v any) (int, bool) {
		ref, ok := v.(string)
		if !ok || ref == "" {
			return 0, false
		}
		if k, ok := ckptStep[ref]; ok {
			return k, true
		}
		if r, err := dataset.ParseRef(ref); err == nil && r.Version != "" {
			return 0, false // a checkpoint of no step the report holds
		}
		return 0, true // a model directory: the base
	}
	w := s.versions["weights"]
	if w == nil {
		ro := s.versions["rollouts"]
		if ro == nil {
			return nil
		}
		ref, _ := ro.Metrics["weights"].(string)
		if ref == "" {
			return nil
		}
		v, err := dataset.OpenString(ctx, st, ref)
		if err != nil {
			return nil
		}
		w = v
	}
	from, ok := stepOf(w.Metrics["source"])
	if !ok {
		return nil
	}
	base := s.Step - 1
	if c := s.versions["checkpoints"]; c != nil {
		b := c.Metrics["resume_from"]
		if b == nil {
			b = c.Metrics["base_model"]
		}
		if k, ok := stepOf(b); ok {
			base = k
		}
	}
	return ptr(float64(base - from))
}

// matrix fills the per-task × step pass rates from the steps' grades.
func matrix(r *Report) {
	byTask := map[string]*TaskRow{}
	for i, s := range r.Steps {
		passed, graded := map[string]float64{}, map[string]int{}
		for _, x := range s.Rollouts {
			if x.grade == nil {
				continue
			}
			t := byTask[x.TaskID]
			if t == nil {
				t = &TaskRow{TaskID: x.TaskID, Group: x.Group}
				byTask[x.TaskID] = t
				r.Tasks = append(r.Tasks, t)
			}
			passed[x.TaskID] += x.grade.Reward
			graded[x.TaskID]++
		}
		for _, t := range r.Tasks {
			for len(t.Pass) < i {
				t.Pass, t.Graded = append(t.Pass, nil), append(t.Graded, 0)
			}
			if n := graded[t.TaskID]; n > 0 {
				t.Pass, t.Graded = append(t.Pass, ptr(passed[t.TaskID]/float64(n))), append(t.Graded, n)
			} else {
				t.Pass, t.Graded = append(t.Pass, nil), append(t.Graded, 0)
			}
		}
	}
	sort.Slice(r.Tasks, func(i, j int) bool {
		if r.Tasks[i].Group != r.Tasks[j].Group {
			return r.Tasks[i].Group < r.Tasks[j].Group
		}
		return r.Tasks[i].TaskID < r.Tasks[j].TaskID
	})
}

// lineage walks the inputs of the last step's most downstream output
// (checkpoints, else advantages, grades, trajectories, rollouts, weights)
// to the roots, breadth first, each version once.
func lineage(ctx context.Context, st store.Store, r *Report) {
	if len(r.Steps) == 0 {
		return
	}
	last := r.Steps[len(r.Steps)-1]
	var start *dataset.Version
	for i := len(runKinds) - 1; i >= 0 && start == nil; i-- {
		start = last.versions[runKinds[i]]
	}
	if start == nil {
		return
	}
	seen := map[string]bool{start.Ref().String(): true}
	queue := []dataset.Ref{start.Ref()}
	for len(queue) > 0 {
		ref := queue[0]
		queue = queue[1:]
		n := LineageNode{Ref: ref.String(), Inputs: []string{}}
		v, err := dataset.Open(ctx, st, ref)
		if err != nil {
			n.Missing = true
			r.Lineage = append(r.Lineage, n)
			continue
		}
		n.Kind, n.Stage = v.Kind().Name, v.Producer.Stage
		for _, in := range v.Inputs {
			n.Inputs = append(n.Inputs, in.String())
			if !seen[in.String()] {
				seen[in.String()] = true
				queue = append(queue, in)
			}
		}
		for _, e := range v.External {
			n.External = append(n.External, e.Role+": "+filepath.ToSlash(e.URI))
		}
		r.Lineage = append(r.Lineage, n)
	}
}
