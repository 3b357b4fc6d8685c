package slurm

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"os"
	"path/filepath"
	"sort"
	"strconv"
	"strings"
	"text/tabwriter"
	"time"

	"github.com/urfave/cli/v2"

	"github.com/kilnrl/kiln/internal/shlex"
	"github.com/kilnrl/kiln/internal/stagecmd"
)

// Target is what the commands need of one planned target (the pipelines
// package's Target, adapted by pipelinecmd's planner).
type Target struct {
	Name    string
	Deps    []string
	Done    bool
	Why     string
	Service bool
	Health  string

	Shards, Throttle, CPUs, GPUs, Nodes int
	Memory, Time, Partition             string

	// Step is the target's step index (-1: not a step target): kiln status
	// --summary groups targets by it.
	Step int
	// Failure is why the target's last build failed, with the store key
	// of its output ("" when it did not fail); kiln status fills it from
	// Describe.
	Failure string
	// Describe, when not nil, reads what kiln status prints beyond the
	// state; with metrics, the outputs' manifest metrics too.
	Describe func(ctx context.Context, metrics bool) (Details, error)
}

// Details are a target's record in the store, as kiln status prints it
// (pipelines.Summary, adapted).
type Details struct {
	Ref     string   `json:"ref,omitempty"`
	Outputs []Output `json:"outputs,omitempty"`
	// WallSeconds is the recorded build's wall time (0: unknown).
	WallSeconds float64 `json:"wall_s,omitempty"`
	// Failure and FailureLog are the last build's failure and the store
	// key of its output, when it failed.
	Failure    string `json:"failure,omitempty"`
	FailureLog string `json:"failure_log,omitempty"`
}

// Output is one committed output of a target with its manifest's metrics.
type Output struct {
	Ref     string         `json:"ref"`
	Rows    int64          `json:"rows"`
	Metrics map[string]any `json:"metrics,omitempty"`
}

// Planner plans FILE for the goals with the variables, reading done-ness
// from the store --store names; targets come in dependency order.
type Planner func(ctx context.Context, c *cli.Context, file string, goals []string, vars map[string]string) ([]Target, error)

// Options configure the commands.
type Options struct {
	// Plan plans a spec (pipelinecmd's planner in kiln).
	Plan Planner
	// RunLine is the script line that runs one target and records it in
	// the store. Default: KILN --store STORE run FILE --only TARGET VAR=...,
	// the pipelines package's contract for driverless executors; an array
	// task adds --shard "$KILN_SHARD" (run that shard only; the target is
	// done once every shard has committed its part of the one version).
	RunLine func(file, store string, t Target, vars map[string]string) string
	// Kiln is the kiln binary the jobs run (default: this executable).
	Kiln string
}

// Commands returns "kiln slurm" and "kiln status".
func Commands(env *stagecmd.Env, o Options) []*cli.Command {
	return []*cli.Command{slurmCommand(env, o), statusCommand(env, o)}
}

type slurmFlags struct {
	dryRun, dir string
}

func slurmCommand(env *stagecmd.Env, o Options) *cli.Command {
	var f slurmFlags
	return &cli.Command{
		Name:      "slurm",
		Category:  "pipelines",
		Usage:     "submit a pipeline's unfinished targets to Slurm as chained sbatch jobs, then exit",
		ArgsUsage: "FILE [TARGET...] [VAR=value...]",
		Description: `Plans FILE as "kiln plan" does and submits every target that is not done
and not already queued or running in Slurm: one sbatch job per target (a
job array of N tasks for a target with shards=N, throttled by throttle=T),
chained with --dependency=afterok on sbatch --parsable IDs and
--kill-on-invalid-dep=yes, so a failure cancels what depends on it. It
exits as soon as everything is submitted; no process stays to drive the
pipeline. Each job runs "kiln run FILE --only TARGET", which reads its
inputs' versions from the store and records the target as done there only
after its recipe succeeded.

Run it again after a failure (fix the cause first): done targets are
skipped, targets still queued or running are left alone (new jobs wait on
them), and the failed or cancelled tail is resubmitted. "kiln status FILE"
shows each target's state.

Scripts, logs (DIR/logs) and the record of submitted job IDs live in the
run directory, --dir (default .kiln-slurm/NAME beside FILE), which must be
on a filesystem every node sees.

The second example writes the sbatch scripts of train/3 and what it needs
into the directory jobs, with submit.order, and submits nothing.

Examples:
  kiln slurm rl.kiln STEPS=10
  kiln slurm rl.kiln train/3 --dry-run jobs
  kiln status rl.kiln STEPS=10`,
		Flags: []cli.Flag{
			stagecmd.StoreFlag(),
			&cli.StringFlag{Name: "dry-run", Usage: "write the sbatch scripts (and submit.order) into `DIR` instead of submitting", Destination: &f.dryRun},
			&cli.StringFlag{Name: "dir", Usage: "run `DIR` on the shared filesystem (default .kiln-slurm/NAME beside FILE)", Destination: &f.dir},
		},
		Action: func(c *cli.Context) error {
			p, err := o.pending(c, f.dir)
			if err != nil {
				return err
			}
			file, dir, rec, live, jobs := p.file, p.dir, p.rec, p.live, p.jobs
			if len(jobs) == 0 {
				fmt.Fprintf(env.Stderr, "nothing to submit: every target is done or already in Slurm\n")
				return nil
			}
			if f.dryRun != "" {
				scripts, err := WriteScripts(f.dryRun, jobs, CompileOptions{Dir: dir})
				if err != nil {
					return err
				}
				fmt.Fprintf(env.Stderr, "wrote %d sbatch script(s) to %s (submit.order lists them in order)\n", len(scripts), f.dryRun)
				return nil
			}
			ids, err := Submit(c.Context, jobs, SubmitOptions{CompileOptions: CompileOptions{Dir: dir}, Live: live})
			for name, id := range ids {
				rec[name] = id
			}
			if werr := writeRecord(dir, rec); werr != nil && err == nil {
				err = werr
			}
			if err != nil {
				return fmt.Errorf("%w (the jobs submitted so far are recorded in %s; kiln slurm again resubmits the rest)", err, dir)
			}
			for _, j := range jobs {
				fmt.Fprintf(env.Stdout, "%s\t%s\n", j.Name, ids[j.Name])
			}
			fmt.Fprintf(env.Stderr, "submitted %d job(s); %d already in Slurm; kiln status %s shows progress\n", len(jobs), len(live), file)
			return nil
		},
	}
}

func statusCommand(env *stagecmd.Env, o Options) *cli.Command {
	var f struct {
		dir                  string
		summary, json, table bool
	}
	return &cli.Command{
		Name:      "status",
		Category:  "pipelines",
		Usage:     "each target's state, from the store and from Slurm (squeue, sacct); --summary: each step's metrics",
		ArgsUsage: "FILE [TARGET...] [VAR=value...]",
		Description: `Prints one line per target: its name, its state, the Slurm job ID and a
detail. The store decides first: a target whose output the store holds is
"done", whatever Slurm says. A target whose last build failed (kiln run, or
the kiln run --only of its Slurm job) is "failed" with the reason and the
store key of its output (kiln why FILE TARGET prints it). Otherwise the
job "kiln slurm" submitted for it is looked up (squeue --states=all, then
sacct): pending, running, failed, cancelled (a dependency failed:
DependencyNeverSatisfied), timeout, ...; a target never submitted, or
whose job Slurm no longer knows, is "missing". "kiln slurm FILE" again
resubmits the failed, cancelled and missing ones.

--summary then prints each done target grouped by step: its wall time and
the metrics of its committed outputs' manifests (what each stage records:
kiln-rollout's runs and aborts, kiln-grade's rewards, kiln-advantages'
counts, kiln-train's losses and weights version), so a run's progress is
read without exporting a dataset. --json prints the same as one JSON
object per target and line instead: target, step (-1: not a step
target), state, job, detail, ref, outputs (ref, rows, metrics), wall_s,
failure, failure_log.

--table prints, instead of the per-target lines, one row per step with the
RL loop's numbers from those manifests: pass rate (kiln-grade's reward_1
of graded), mean reward (kiln-advantages' group_stats), rollouts, aborted
and segments (kiln-rollout), trained tokens, loss, clip fraction and
train_rollout_logprob_max_abs_diff (kiln-train), the weights number the
rollouts sampled from, and each of the step's targets' wall time; then
where the datasets are (the store, and the refs of the targets of no step
and of the last step). A metric no target of the step recorded is "-".

Examples:
  kiln status rl.kiln
  kiln status rl.kiln STEPS=10 --dir /shared/runs/rl
  kiln status rl.kiln --summary
  kiln status rl.kiln --table`,
		Flags: []cli.Flag{
			stagecmd.StoreFlag(),
			&cli.StringFlag{Name: "dir", Usage: "the run `DIR` kiln slurm used", Destination: &f.dir},
			&cli.BoolFlag{Name: "summary", Usage: "also print each step's targets with their wall time and their outputs' manifest metrics", Destination: &f.summary},
			&cli.BoolFlag{Name: "json", Usage: "print one JSON object per target (state, outputs with their metrics, wall time, failure) instead of the table", Destination: &f.json},
			&cli.BoolFlag{Name: "table", Usage: "print one row per step (pass rate, mean reward, rollouts, aborted, segments, trained tokens, loss, clip fraction, logprob diff, weights, each stage's wall time) and where the datasets are, instead of the per-target lines", Destination: &f.table},
		},
		Action: func(c *cli.Context) error {
			p, err := o.load(c, f.dir)
			if err != nil {
				return err
			}
			details := make([]Details, len(p.targets))
			for i, t := range p.targets {
				if t.Describe == nil {
					continue
				}
				d, err := t.Describe(c.Context, f.summary || f.json || f.table)
				if err != nil {
					return err
				}
				details[i] = d
				if d.Failure != "" {
					p.targets[i].Failure = d.Failure
					if d.FailureLog != "" {
						p.targets[i].Failure += " (log " + d.FailureLog + ")"
					}
				}
			}
			rows, err := Reconcile(c.Context, p.targets, p.rec, QueryOptions{})
			if err != nil {
				return err
			}
			if f.json {
				return printStatusJSON(env.Stdout, p.targets, rows, details)
			}
			if f.table {
				return printTable(env.Stdout, c.String("store"), p.targets, rows, details)
			}
			if err := printStatus(env.Stdout, rows); err != nil {
				return err
			}
			if f.summary {
				return printSummary(env.Stdout, p.targets, rows, details)
			}
			return nil
		},
	}
}

// printStatusJSON writes one JSON object per target (kiln status --json).
func printStatusJSON(w io.Writer, targets []Target, rows []Row, details []Details) error {
	enc := json.NewEncoder(w)
	for i, t := range targets {
		v := struct {
			Target string `json:"target"`
			Step   int    `json:"step"`
			State  string `json:"state"`
			Job    string `json:"job,omitempty"`
			Detail string `json:"detail,omitempty"`
			Details
		}{t.Name, t.Step, rows[i].State, rows[i].Job, rows[i].Detail, details[i]}
		if err := enc.Encode(v); err != nil {
			return err
		}
	}
	return nil
}

// printSummary writes the done targets grouped by step, in step order
// (targets of no step first): wall time and the outputs' metrics, merged
// across a target's outputs (one stage invocation writes them all; the
// first output's value of a metric wins), as key=value sorted by key.
func printSummary(w io.Writer, targets []Target, rows []Row, details []Details) error {
	idx := make([]int, 0, len(targets))
	for i := range targets {
		if rows[i].State == "done" && !targets[i].Service {
			idx = append(idx, i)
		}
	}
	sort.SliceStable(idx, func(a, b int) bool { return targets[idx[a]].Step < targets[idx[b]].Step })
	tw := tabwriter.NewWriter(w, 0, 4, 2, ' ', 0)
	fmt.Fprintln(tw, "\nSTEP\tTARGET\tWALL\tREF\tMETRICS")
	for _, i := range idx {
		t, d := targets[i], details[i]
		step := "-"
		if t.Step >= 0 {
			step = strconv.Itoa(t.Step)
		}
		wall := "-"
		if d.WallSeconds > 0 {
			wall = (time.Duration(d.WallSeconds * float64(time.Second))).Round(100 * time.Millisecond).String()
		}
		merged := map[string]any{}
		for _, o := range d.Outputs {
			for k, v := range o.Metrics {
				if _, ok := merged[k]; !ok {
					merged[k] = v
				}
			}
		}
		var kv []string
		for _, k := range sortedKeys(merged) {
			b, _ := json.Marshal(merged[k])
			v := string(b)
			if s, ok := merged[k].(string); ok && !strings.ContainsAny(s, " \t\"") {
				v = s
			}
			kv = append(kv, k+"="+v)
		}
		ref := d.Ref
		if ref == "" {
			ref = "-"
		}
		fmt.Fprintf(tw, "%s\t%s\t%s\t%s\t%s\n", step, t.Name, wall, ref, strings.Join(kv, " "))
	}
	return tw.Flush()
}

// pipelineState is what a Slurm command knows of a pipeline before it
// acts: the spec's targets, the run directory and its job record, and
// (pending) the jobs Slurm still holds and those left to submit.
type pipelineState struct {
	file, dir string
	vars      map[string]string
	targets   []Target
	rec       map[string]string
	live      map[string]string
	jobs      []Job
}

// load plans the pipeline the arguments name and reads its run directory's
// job record.
func (o Options) load(c *cli.Context, dirFlag string) (*pipelineState, error) {
	file, goals, vars, err := parseArgs(c)
	if err != nil {
		return nil, err
	}
	p := &pipelineState{file: file, vars: vars}
	if p.dir, err = runDir(file, dirFlag); err != nil {
		return nil, err
	}
	if p.targets, err = o.Plan(c.Context, c, file, goals, vars); err != nil {
		return nil, err
	}
	if p.rec, err = readRecord(p.dir); err != nil {
		return nil, err
	}
	return p, nil
}

// pending is load plus the jobs still live in Slurm and the ones to submit:
// every target neither done nor live (kiln slurm and kiln plan --slurm).
func (o Options) pending(c *cli.Context, dirFlag string) (*pipelineState, error) {
	p, err := o.load(c, dirFlag)
	if err != nil {
		return nil, err
	}
	if p.live, err = liveJobs(c.Context, p.targets, p.rec); err != nil {
		return nil, err
	}
	if p.jobs, err = o.jobs(c, p.file, p.targets, p.vars, p.live); err != nil {
		return nil, err
	}
	return p, nil
}

// Row is one target's reconciled state.
type Row struct {
	Target, State, Job, Detail string
}

// Reconcile says each target's state: "done" from the store, else the
// lower-cased Slurm state of its recorded job, else "missing".
func Reconcile(ctx context.Context, targets []Target, rec map[string]string, o QueryOptions) ([]Row, error) {
	var ids []string
	for _, t := range targets {
		if id := rec[t.Name]; id != "" && !t.Done {
			ids = append(ids, id)
		}
	}
	st, err := Query(ctx, ids, o)
	if err != nil {
		return nil, err
	}
	var rows []Row
	for _, t := range targets {
		r := Row{Target: t.Name, Job: rec[t.Name]}
		switch s, ok := st[r.Job]; {
		case t.Done:
			r.State, r.Detail = "done", t.Why
		case (r.Job == "" || !ok || s.State == "UNKNOWN") && t.Failure != "":
			// Not in Slurm, and its last build failed (a local kiln run,
			// or a job Slurm no longer knows): the store says why.
			r.State, r.Detail = "failed", t.Failure
		case r.Job == "" || !ok || s.State == "UNKNOWN":
			r.State, r.Detail = "missing", t.Why
		case s.State == "COMPLETED":
			// Slurm says it ended well but the store lacks it.
			r.State, r.Detail = "missing", "job completed but the store does not hold its output"
			if t.Service {
				r.State, r.Detail = "done", "service stopped after its users"
			}
		default:
			r.State, r.Detail = strings.ToLower(s.State), s.Reason
			if len(s.Tasks) > 0 {
				r.Detail = strings.TrimSpace(r.Detail + " " + taskSummary(s.Tasks))
			}
			if !s.Active() && t.Failure != "" {
				r.Detail = strings.TrimSpace(strings.TrimSuffix(r.Detail, "None") + " " + t.Failure)
			}
		}
		if r.Detail == "None" {
			r.Detail = ""
		}
		rows = append(rows, r)
	}
	return rows, nil
}

func taskSummary(tasks map[int]string) string {
	count := map[string]int{}
	for _, s := range tasks {
		count[strings.ToLower(s)]++
	}
	var parts []string
	for _, k := range sortedKeys(count) {
		parts = append(parts, fmt.Sprintf("%d %s", count[k], k))
	}
	return "(tasks: " + strings.Join(parts, ", ") + ")"
}

func printStatus(w io.Writer, rows []Row) error {
	tw := tabwriter.NewWriter(w, 0, 4, 2, ' ', 0)
	fmt.Fprintln(tw, "TARGET\tSTATE\tJOB\tDETAIL")
	for _, r := range rows {
		fmt.Fprintf(tw, "%s\t%s\t%s\t%s\n", r.Target, r.State, r.Job, r.Detail)
	}
	return tw.Flush()
}

// liveJobs are the recorded jobs of not-done targets that Slurm may still
// run: kiln slurm leaves them alone and chains new jobs after them.
func liveJobs(ctx context.Context, targets []Target, rec map[string]string) (map[string]string, error) {
	var ids []string
	for _, t := range targets {
		if id := rec[t.Name]; id != "" && !t.Done {
			ids = append(ids, id)
		}
	}
	st, err := Query(ctx, ids, QueryOptions{})
	if err != nil {
		return nil, err
	}
	live := map[string]string{}
	for _, t := range targets {
		if id := rec[t.Name]; id != "" && !t.Done && st[id].Active() {
			live[t.Name] = id
		}
	}
	return live, nil
}

// jobs are the targets to submit: not done, not live, and for a service,
// used by a job submitted now.
func (o Options) jobs(c *cli.Context, file string, targets []Target, vars map[string]string, live map[string]string) ([]Job, error) {
	storeURI := c.String("store")
	if !strings.Contains(storeURI, "://") {
		abs, err := filepath.Abs(storeURI)
		if err != nil {
			return nil, err
		}
		storeURI = abs
	}
	absFile, err := filepath.Abs(file)
	if err != nil {
		return nil, err
	}
	runLine := o.RunLine
	if runLine == nil {
		kiln := o.Kiln
		if kiln == "" {
			if kiln, err = os.Executable(); err != nil {
				return nil, fmt.Errorf("finding the kiln binary for the jobs: %w", err)
			}
		}
		runLine = func(file, store string, t Target, vars map[string]string) string {
			args := []string{shlex.Quote(kiln), "--store", shlex.Quote(store), "run", shlex.Quote(file), "--only", shlex.Quote(t.Name)}
			if t.Shards > 0 {
				// Each array task runs its own shard (the task ID).
				args = append(args, "--shard", `"$KILN_SHARD"`)
			}
			for _, k := range sortedKeys(vars) {
				args = append(args, shlex.Quote(k+"="+vars[k]))
			}
			return strings.Join(args, " ")
		}
	}
	byName := map[string]Target{}
	for _, t := range targets {
		byName[t.Name] = t
	}
	submit := map[string]bool{}
	for _, t := range targets {
		if !t.Done && live[t.Name] == "" && !t.Service {
			submit[t.Name] = true
		}
	}
	for _, t := range targets {
		if !submit[t.Name] {
			continue
		}
		for _, d := range t.Deps {
			if s := byName[d]; s.Service && live[d] == "" {
				submit[d] = true
			}
		}
	}
	var jobs []Job
	for _, t := range targets {
		if !submit[t.Name] {
			continue
		}
		var after []string
		for _, d := range t.Deps {
			if submit[d] || live[d] != "" {
				after = append(after, d)
			}
		}
		jobs = append(jobs, Job{
			Name: t.Name, Script: runLine(absFile, storeURI, t, vars) + "\n", After: after,
			Shards: t.Shards, Throttle: t.Throttle, CPUs: t.CPUs, GPUs: t.GPUs, Nodes: t.Nodes,
			Memory: t.Memory, Time: t.Time, Partition: t.Partition, Service: t.Service, Health: t.Health,
		})
	}
	return jobs, nil
}

// parseArgs splits FILE [TARGET...] [VAR=value...].
func parseArgs(c *cli.Context) (file string, goals []string, vars map[string]string, err error) {
	args := c.Args().Slice()
	if len(args) == 0 {
		return "", nil, nil, stagecmd.Usagef("%s: give the pipeline FILE; see `kiln %s --help`", c.Command.Name, c.Command.Name)
	}
	vars = map[string]string{}
	for _, a := range args[1:] {
		if k, v, ok := strings.Cut(a, "="); ok && k != "" && !strings.Contains(k, "/") {
			vars[k] = v
		} else {
			goals = append(goals, a)
		}
	}
	return args[0], goals, vars, nil
}

func runDir(file, dir string) (string, error) {
	if dir == "" {
		base := strings.TrimSuffix(filepath.Base(file), ".kiln")
		dir = filepath.Join(filepath.Dir(file), ".kiln-slurm", base)
	}
	return filepath.Abs(dir)
}

const recordFile = "jobs.json"

// readRecord reads the run directory's target -> job ID record.
func readRecord(dir string) (map[string]string, error) {
	data, err := os.ReadFile(filepath.Join(dir, recordFile))
	if errors.Is(err, os.ErrNotExist) {
		return map[string]string{}, nil
	}
	if err != nil {
		return nil, fmt.Errorf("reading the job record: %w", err)
	}
	rec := map[string]string{}
	if err := json.Unmarshal(data, &rec); err != nil {
		return nil, fmt.Errorf("the job record %q is damaged (%w): delete it, and kiln slurm resubmits what the store lacks", filepath.Join(dir, recordFile), err)
	}
	return rec, nil
}

// writeRecord replaces the record atomically (rename).
func writeRecord(dir string, rec map[string]string) error {
	if err := os.MkdirAll(dir, 0o755); err != nil {
		return err
	}
	data, _ := json.MarshalIndent(rec, "", "  ")
	tmp := filepath.Join(dir, recordFile+".tmp")
	if err := os.WriteFile(tmp, append(data, '\n'), 0o644); err != nil {
		return fmt.Errorf("writing the job record: %w", err)
	}
	return os.Rename(tmp, filepath.Join(dir, recordFile))
}

// PlanWithSlurm adds --slurm to kiln plan (the pipelines package's plan
// command, which cannot import this package): after the plan's lines it
// prints the sbatch jobs kiln slurm would submit now, in submission order,
// one line each, compiled by the same code as kiln slurm (targets done or
// still live in Slurm are left out, as kiln slurm leaves them).
func PlanWithSlurm(env *stagecmd.Env, plan *cli.Command, o Options) {
	var on bool
	var dirFlag string
	plan.Flags = append(plan.Flags,
		&cli.BoolFlag{Name: "slurm", Destination: &on, Usage: "also print the sbatch jobs kiln slurm would submit (array, afterok and after dependencies)"},
		&cli.StringFlag{Name: "slurm-dir", Destination: &dirFlag, Usage: "with --slurm, the run `DIR` kiln slurm uses (default .kiln-slurm/NAME beside FILE)"})
	// The paragraph goes before the examples, the example after them.
	para := `With --slurm it then prints the jobs kiln slurm would submit, in order:
"sbatch FILE.sbatch" with array=0-(N-1)%T for a sharded target,
afterok=PREREQS, after=SERVICES, and the resources asked for.`
	if before, after, ok := strings.Cut(plan.Description, "\n\nExamples:"); ok {
		plan.Description = before + "\n\n" + para + "\n\nExamples:" + after + "\n   kiln plan rl.kiln STEPS=10 --slurm"
	} else {
		plan.Description += "\n\n" + para
	}
	inner := plan.Action
	plan.Action = func(c *cli.Context) error {
		if err := inner(c); err != nil || !on {
			return err
		}
		p, err := o.pending(c, dirFlag)
		if err != nil {
			return err
		}
		scripts, err := compile(p.jobs, CompileOptions{Dir: p.dir}, func(n string) bool { return p.live[n] != "" })
		if err != nil {
			return err
		}
		return printJobs(env.Stdout, scripts, p.jobs, p.live)
	}
}

// printJobs writes one line per compiled job (kiln plan --slurm).
func printJobs(w io.Writer, scripts []Script, jobs []Job, live map[string]string) error {
	byName := map[string]Job{}
	for _, j := range jobs {
		byName[j.Name] = j
	}
	if len(scripts) == 0 {
		_, err := fmt.Fprintf(w, "slurm: nothing to submit (%d target(s) already in Slurm)\n", len(live))
		return err
	}
	for _, s := range scripts {
		j := byName[s.Name]
		var b strings.Builder
		fmt.Fprintf(&b, "sbatch %s", s.File)
		if j.Shards > 0 {
			fmt.Fprintf(&b, " array=0-%d", j.Shards-1)
			if j.Throttle > 0 {
				fmt.Fprintf(&b, "%%%d", j.Throttle)
			}
		}
		if j.Service {
			b.WriteString(" service")
		}
		if len(s.After) > 0 {
			fmt.Fprintf(&b, " afterok=%s", strings.Join(s.After, ","))
		}
		if len(s.Started) > 0 {
			fmt.Fprintf(&b, " after=%s", strings.Join(s.Started, ","))
		}
		if len(s.AfterAny) > 0 {
			fmt.Fprintf(&b, " afterany=%s", strings.Join(s.AfterAny, ","))
		}
		for _, r := range []struct {
			k string
			v int
		}{{"cpus", j.CPUs}, {"gpus", j.GPUs}, {"nodes", j.Nodes}} {
			if r.v > 0 {
				fmt.Fprintf(&b, " %s=%d", r.k, r.v)
			}
		}
		for _, r := range [][2]string{{"memory", j.Memory}, {"time", j.Time}, {"partition", j.Partition}} {
			if r[1] != "" {
				fmt.Fprintf(&b, " %s=%s", r[0], r[1])
			}
		}
		if _, err := fmt.Fprintln(w, b.String()); err != nil {
			return err
		}
	}
	_, err := fmt.Fprintf(w, "slurm: %d job(s) to submit; %d target(s) already in Slurm\n", len(scripts), len(live))
	return err
}
