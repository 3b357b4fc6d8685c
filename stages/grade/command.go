package grade

import (
	"bytes"
	"context"
	"fmt"
	"io"
	"os"
	"path/filepath"
	"runtime"
	"sort"
	"strings"
	"time"

	"github.com/urfave/cli/v2"

	"github.com/kilnrl/kiln/formats/dataset"
	"github.com/kilnrl/kiln/formats/records"
	"github.com/kilnrl/kiln/formats/store"
	"github.com/kilnrl/kiln/internal/sandbox"
	"github.com/kilnrl/kiln/internal/stagecmd"
)

// codeVersion is the grade stage's code version (dataset.Identity): bump
// it whenever the grades written for the same inputs and arguments change.
const codeVersion = "1"

// Shards are flushed (and their rows receipted, so a rerun resumes after
// them) every flushRows grades or flushEvery, whichever comes first.
const (
	flushRows  = 64
	flushEvery = 30 * time.Second
)

// Commands returns the kiln-grade commands (the binary's default action
// is the grade command itself).
func Commands(env *stagecmd.Env) []*cli.Command {
	return []*cli.Command{Command(env)}
}

// Flags are kiln-grade's flags, bound to the fields of f.
func (f *Flags) Flags() []cli.Flag {
	o := &f.Options
	return []cli.Flag{
		stagecmd.StoreFlag(),
		&cli.StringFlag{Name: "tasks", Value: "tasks", Destination: &o.Tasks, Usage: "tasks dataset (name or name@version)"},
		&cli.StringFlag{Name: "images", Value: "images", Destination: &o.Images, Usage: "images dataset of the tasks' images (kiln-images)"},
		&cli.StringFlag{Name: "bundles", Destination: &o.Bundles, Usage: "bundle root on this node: the directory kiln-images unpacked the images into (required)"},
		&cli.StringFlag{Name: "rollouts", Destination: &o.Rollouts, Usage: "rollouts dataset whose patches to grade"},
		&cli.StringFlag{Name: "patches", Destination: &o.Patches, Usage: "patches file to grade (local or s3://; .zst ok): JSON lines {task_id, patch, sample?} or SWE-bench predictions {instance_id, model_patch} (JSONL or a JSON array)"},
		&cli.BoolFlag{Name: "baseline", Destination: &o.Baseline, Usage: "grade the empty patch once per task instead, and flag tasks that pass without a fix"},
		&cli.BoolFlag{Name: "solution", Destination: &o.Solution, Usage: "grade each Harbor task's oracle (solution/solve.sh) once instead of a patch"},
		&cli.StringFlag{Name: "split", Destination: &o.Split, Usage: "grade only tasks of this split (the tasks' split column)"},
		&cli.StringFlag{Name: "out", Value: "grades", Destination: &f.Out, Usage: "dataset name to write"},
		&cli.IntFlag{Name: "jobs", Aliases: []string{"j"}, Value: runtime.NumCPU(), Destination: &o.Jobs, Usage: "gradings run at once"},
		&cli.DurationFlag{Name: "timeout", Value: DefaultTimeout, Destination: &o.Timeout, Usage: "limit of each grading command (the tests); a command past it is killed and graded failure timeout"},
		&cli.StringFlag{Name: "sandbox", Value: "bwrap", Destination: &o.Provider, Usage: "sandbox provider: bwrap, or local (no isolation: debugging only)"},
		&cli.IntFlag{Name: "boot-concurrency", Destination: &o.BootConcurrency, Usage: "sandboxes booting at once (default: --jobs)"},
		stagecmd.ShardFlag(),
		stagecmd.PrintVersionFlag(&f.PrintVersion),
	}
}

// Flags is what kiln-grade's flags set: the grading Options, the output
// name and --print-version.
type Flags struct {
	Options
	Out          string
	PrintVersion bool
}

// Help is kiln-grade's manual.
const Help = `Grades agent patches with each task's official tests, every patch in a fresh
sandbox booted from the task's image bundle, and writes a grades dataset: one
row per patch with reward 1 (the tests pass) or 0, and why not.

What to grade (exactly one):
   --rollouts REF   the patch of every rollouts row (aborted rollouts get a row
                    with failure "aborted", their abort_reason and abort_detail
                    in its error, and are not graded)
   --patches FILE   JSON lines {"task_id", "patch", "sample"?}, or SWE-bench
                    predictions {"instance_id", "model_patch"} as JSON lines or
                    a JSON array, so external predictions can be graded
   --baseline       the empty patch, once per task: the failing baseline a task
                    must show before its rewards can be trusted. Tasks whose
                    baseline passes are flagged on stderr and in the metrics
                    (rows with baseline=true and reward 1).
   --solution       each Harbor task's oracle, once per task: solution/solve.sh
                    runs where a patch would apply (tasks without one are
                    skipped and counted); with --baseline, the task's own
                    sanity check (oracle 1 or its declared fraction, empty 0).

Per patch (docs/data-and-grading.md §5.1): boot a sandbox from the task's
bundle (--bundles, as kiln-images unpacked it on this node); give the
workspace to the agent user; set up SWE-bench Pro's scripts and run its
before_repo_set_cmd; run pre_commands (the base the agent started from);
apply the patch as agent (an empty patch applies vacuously) with git apply,
then git apply --3way, then patch -p1, first success wins, resetting the
touched files between attempts (the reference does not reset); then exactly
one grading path, by the task's grading kind:
   eval_cmd   cd WORKDIR && EVAL_CMD as the task's eval_user: exit 0 is reward 1
              (MiMo's command resets the official test files and applies the
              test patch itself)
   swebench   as root: reset the test patch's files to the base commit, apply
              the test patch, run test_cmd, parse its output with the task's
              log parser (pytest: -rA summary and -v lines); reward 1 iff every
              FAIL_TO_PASS and PASS_TO_PASS test PASSED (or XFAIL/XPASS) and
              there is at least one. kiln parses logs itself; it does not run
              the SWE-bench harness, and a SKIPPED required test fails.
   swepro     SWE-bench Pro's run script and parser; reward 1 iff the required
              tests are non-empty and all PASSED in result.json
   f2p        the task's pytest file run with python in the workdir as agent
   harbor     tests/ (an attachment of the tasks version, never in the image)
              uploaded to /tests only now; tests/test.sh run in the workdir as
              [verifier].user with [verifier].env under its timeout_sec; the
              reward is /logs/verifier/reward.json's metric (the task's
              reward_metric, else "reward", else its only one) or reward.txt's
              number, in [0, 1]: fractions reach the advantages. No reward file
              is failure no_grading with the verifier's output in the log.

The failure column says why a reward is 0: patch_failed (applied=false, no
test ran), tests_failed, timeout (a grading command ran past --timeout; exit
124), infra_error (kiln could not grade: sandbox, setup, result), no_grading
(the task has no grading payload; no sandbox), aborted. A crash or a timeout
is a row, never a gap. Each row's log column is the store key of its grading
log (every command with its output, JSON lines), saved before the sandbox is
removed, as an attachment of the version (OUT/_v/VERSION/attachments/logs/):
kept with the committed version, collected by kiln gc with one that never
commits.

Resumable: grades are committed in shards with row receipts, so a rerun of the
same command grades only what is missing. --shard i/n grades every n-th row
(inputs must then be pinned, name@version). --split NAME grades only the
tasks of that split (other rows are skipped and counted).

Examples:
   kiln-grade --tasks tasks --images images --bundles /var/lib/kiln/bundles \
       --rollouts rollouts/step-3 --out grades/step-3
   kiln-grade --bundles /var/lib/kiln/bundles --patches preds.jsonl --out grades/preds
   kiln-grade --bundles /var/lib/kiln/bundles --baseline --out grades/baseline`

// Command is the grade command.
func Command(env *stagecmd.Env) *cli.Command {
	f := &Flags{}
	return &cli.Command{
		Name:        "grade",
		Usage:       "grade patches with the tasks' official tests in fresh sandboxes",
		Description: Help,
		Flags:       f.Flags(),
		Action:      func(c *cli.Context) error { return Action(c, env, f) },
	}
}

// Action runs kiln-grade from parsed flags.
func Action(c *cli.Context, env *stagecmd.Env, f *Flags) error {
	if c.NArg() != 0 {
		return stagecmd.Usagef("kiln-grade takes no arguments (did you mean --patches %s?)", c.Args().First())
	}
	o := f.Options
	st, err := stagecmd.OpenStore(c)
	if err != nil {
		return err
	}
	part, err := stagecmd.PartFrom(c)
	if err != nil {
		return err
	}
	out := stagecmd.Output{Name: f.Out, Part: part, PrintVersion: f.PrintVersion, Hook: env.Hook}
	_, err = Run(c.Context, env, st, out, o)
	return err
}

// Options describe one kiln-grade run.
type Options struct {
	Tasks, Images string // dataset references
	Bundles       string // bundle root on this node
	// Exactly one of Rollouts, Patches, Baseline and Solution.
	Rollouts string
	Patches  string
	Baseline bool
	Solution bool
	Split    string
	Jobs     int
	Timeout  time.Duration
	// Provider is the sandbox provider ("bwrap" if "").
	Provider        string
	BootConcurrency int
	// Grader, if set, replaces the grader built from the options (tests,
	// benchmarks); Boot then comes from it.
	Grader *Grader
}

// Run grades per o and writes the grades version out names.
func Run(ctx context.Context, env *stagecmd.Env, st store.Store, out stagecmd.Output, o Options) (dataset.Result, error) {
	n := 0
	for _, set := range []bool{o.Rollouts != "", o.Patches != "", o.Baseline, o.Solution} {
		if set {
			n++
		}
	}
	if n != 1 {
		return dataset.Result{}, stagecmd.Usagef("give exactly one of --rollouts REF, --patches FILE, --baseline and --solution")
	}
	if o.Bundles == "" {
		return dataset.Result{}, stagecmd.Usagef("--bundles DIR is required: the bundle root kiln-images unpacked the images into on this node")
	}
	if o.Timeout <= 0 {
		return dataset.Result{}, stagecmd.Usagef("--timeout %s: want a positive duration such as 10m", o.Timeout)
	}
	if err := stagecmd.CheckCount("jobs", o.Jobs, stagecmd.MaxJobs); err != nil {
		return dataset.Result{}, err
	}
	if o.BootConcurrency != 0 {
		if err := stagecmd.CheckCount("boot-concurrency", o.BootConcurrency, stagecmd.MaxJobs); err != nil {
			return dataset.Result{}, err
		}
	}
	if o.Provider == "" {
		o.Provider = "bwrap"
	}
	if o.Provider != "bwrap" && o.Provider != "local" {
		return dataset.Result{}, stagecmd.Usagef("--sandbox %q: want bwrap or local", o.Provider)
	}
	bundles, err := filepath.Abs(o.Bundles)
	if err != nil {
		return dataset.Result{}, stagecmd.UsageError{Err: err}
	}
	refs := []string{o.Tasks, o.Images}
	if o.Rollouts != "" {
		refs = append(refs, o.Rollouts)
	}
	inputs, err := stagecmd.ResolveInputs(ctx, st, refs, out.Part)
	if err != nil {
		return dataset.Result{}, err
	}
	id := dataset.Identity{Stage: "grade", CodeVersion: codeVersion, Inputs: inputs,
		Args: map[string]any{"timeout_s": o.Timeout.Seconds(), "split": o.Split, "baseline": o.Baseline, "sandbox": o.Provider}}
	if o.Solution {
		id.Args["solution"] = true // only when set: earlier versions' ids stay
	}
	var patches stagecmd.Input
	if o.Patches != "" {
		if patches, err = stagecmd.ParseInput(o.Patches); err != nil {
			return dataset.Result{}, stagecmd.UsageError{Err: err}
		}
		ext, err := patches.Identify(ctx, "patches")
		if err != nil {
			return dataset.Result{}, err
		}
		id.External = []dataset.External{ext}
	}
	out.Kind, out.Identity = records.GradesKind(), id
	return stagecmd.Write(ctx, st, out, env.Stdout, env.Log, func(ctx context.Context, w *dataset.Writer) (map[string]any, error) {
		if fi, err := os.Stat(bundles); err != nil || !fi.IsDir() {
			return nil, stagecmd.Usagef("--bundles %q is not a directory: pass the bundle root kiln-images unpacked the images into", o.Bundles)
		}
		jobs, skipped, noSolution, err := planJobs(ctx, st, inputs, bundles, patches, o)
		if err != nil {
			return nil, err
		}
		g := o.Grader
		if g == nil {
			// Sandboxes of an earlier run on this node that was killed
			// (preempted, OOM-killed) still hold overlay mounts and cgroups.
			if o.Provider != "local" {
				if _, err := sandbox.Sweep(ctx, "", env.Log); err != nil {
					env.Log.Warn("could not release every dead sandbox's leftovers", "err", err)
				}
			}
			boots := o.BootConcurrency
			if boots <= 0 {
				boots = o.Jobs
			}
			// Grader boots are not retried (docs/data-and-grading.md §3.6): a failed boot is an
			// infra_error row.
			g = &Grader{Boot: sandbox.Boot, Timeout: o.Timeout,
				Base: sandbox.Options{Provider: o.Provider, BootLimiter: sandbox.NewLimiter(boots), BootAttempts: 1, Log: env.Log}}
		}
		p := &producer{env: env, st: st, w: w, g: g, jobs: o.Jobs, version: w.Ref()}
		metrics, err := p.run(ctx, jobs, out.Part)
		if err != nil {
			return nil, err
		}
		if skipped > 0 {
			metrics["skipped_other_split"] = skipped
		}
		if noSolution > 0 {
			metrics["skipped_no_solution"] = noSolution
		}
		fmt.Fprintln(env.Stderr, tally(metrics))
		if o.Baseline {
			p.baselineSummary(metrics)
		}
		return metrics, nil
	})
}

// planJobs reads the inputs and lists the gradings, in input order. Every
// input problem (an unknown task id, an image that was not imported) is
// found here, before anything is graded.
// The second count is the tasks --solution skipped for want of a Harbor
// solution.
func planJobs(ctx context.Context, st store.Store, inputs []dataset.Ref, bundles string, patches stagecmd.Input, o Options) ([]*job, int, int, error) {
	tv, err := dataset.Open(ctx, st, inputs[0])
	if err != nil {
		return nil, 0, 0, err
	}
	tasks, err := loadTasks(ctx, tv)
	if err != nil {
		return nil, 0, 0, err
	}
	iv, err := dataset.Open(ctx, st, inputs[1])
	if err != nil {
		return nil, 0, 0, err
	}
	images, err := loadImages(ctx, iv)
	if err != nil {
		return nil, 0, 0, err
	}
	ts := &targets{tasks: tasks, images: images, imgRef: iv.Ref(), bundles: bundles, cache: map[string]*Target{}}
	inSplit := func(t *records.Task) bool { return o.Split == "" || (t.Split != nil && *t.Split == o.Split) }
	var jobs []*job
	skipped, noSolution := 0, 0
	add := func(j *job, t *records.Task) error {
		if !inSplit(t) {
			skipped++
			return nil
		}
		j.row.TaskID, j.row.GroupIndex = t.TaskID, t.TaskIndex
		if j.target, err = ts.get(ctx, t); err != nil {
			return err
		}
		jobs = append(jobs, j)
		return nil
	}
	switch {
	case o.Solution:
		for _, t := range tasks.order {
			if g, _ := ParseGrading(t.Grading); g == nil || g.Harbor == nil || g.Harbor.Solution == "" {
				noSolution++
				continue
			}
			j := &job{key: fmt.Sprintf("solution-%d", t.TaskIndex), solution: true}
			j.row.RolloutID, j.row.Index = t.TaskIndex, t.TaskIndex
			if err := add(j, t); err != nil {
				return nil, 0, 0, err
			}
		}
		if len(jobs) == 0 {
			return nil, 0, 0, stagecmd.BadInputError{Err: fmt.Errorf("tasks %s has no Harbor task with a solution/solve.sh (of split %q) to grade with --solution", tasks.ref, o.Split)}
		}
	case o.Baseline:
		for _, t := range tasks.order {
			j := &job{key: fmt.Sprintf("baseline-%d", t.TaskIndex)}
			j.row.RolloutID, j.row.Index, j.row.Baseline = t.TaskIndex, t.TaskIndex, true
			if err := add(j, t); err != nil {
				return nil, 0, 0, err
			}
		}
		if o.Split != "" && len(jobs) == 0 {
			return nil, 0, 0, stagecmd.BadInputError{Err: fmt.Errorf("tasks %s has no task of split %q", tasks.ref, o.Split)}
		}
	case o.Patches != "":
		rc, err := patches.Open(ctx)
		if err != nil {
			return nil, 0, 0, fmt.Errorf("patches %q: %w", o.Patches, err)
		}
		defer rc.Close()
		samples := map[string]int64{}
		err = readPatches(rc, o.Patches, func(n, ord int, taskID, patch string, sample *int64) error {
			t := tasks.byID[taskID]
			if t == nil {
				return stagecmd.BadInputError{Err: fmt.Errorf("patches %q row %d: task %q is not in tasks %s", o.Patches, n, taskID, tasks.ref)}
			}
			j := &job{key: fmt.Sprintf("patch-%d", ord), patch: patch}
			j.row.RolloutID, j.row.Index = int64(ord), int64(ord)
			if sample != nil {
				j.row.Sample = *sample
			} else {
				j.row.Sample = samples[taskID]
			}
			samples[taskID]++
			return add(j, t)
		})
		if err != nil {
			return nil, 0, 0, err
		}
	default:
		rv, err := dataset.Open(ctx, st, inputs[2])
		if err != nil {
			return nil, 0, 0, err
		}
		if rv.Kind().Name != records.RolloutsKind().Name {
			return nil, 0, 0, stagecmd.Usagef("--rollouts %s holds %s records, not rollouts", rv.Ref(), rv.Kind().Name)
		}
		seen := map[int64]bool{}
		err = rv.EachShard(ctx, func(_ int, data []byte) error {
			return records.EachRollout(data, func(r records.Rollout) error {
				t := tasks.byID[r.TaskID]
				if t == nil {
					return stagecmd.BadInputError{Err: fmt.Errorf("rollouts %s: rollout %d: task %q is not in tasks %s", rv.Ref(), r.Index, r.TaskID, tasks.ref)}
				}
				if seen[r.Index] {
					return stagecmd.BadInputError{Err: fmt.Errorf("rollouts %s: index %d appears twice; one row per agent run", rv.Ref(), r.Index)}
				}
				seen[r.Index] = true
				j := &job{key: fmt.Sprintf("rollout-%d", r.Index), patch: r.Patch}
				if r.AbortReason != nil {
					j.abort = *r.AbortReason
					if r.AbortDetail != nil {
						j.abortDetail = *r.AbortDetail
					}
				}
				j.row.RolloutID, j.row.Index, j.row.Sample = r.RolloutID, r.Index, r.Sample
				if err := add(j, t); err != nil {
					return err
				}
				// The rollout's group is the task (docs/records.md §1): keep its ids.
				j.row.GroupIndex = r.GroupIndex
				return nil
			})
		})
		if err != nil {
			return nil, 0, 0, err
		}
	}
	return jobs, skipped, noSolution, nil
}

// producer grades jobs with a pool of workers and writes the rows in
// receipted shards from one goroutine (the dataset writer is not safe for
// concurrent use).
type producer struct {
	env     *stagecmd.Env
	st      store.Store
	w       *dataset.Writer
	g       *Grader
	jobs    int
	version dataset.Ref // the grading logs are its attachments

	pending  []records.Grade
	keys     []string
	baseline []records.Grade // every baseline row, for the summary
	metrics  map[string]any
}

type result struct {
	job *job
	row records.Grade
	err error
}

func (p *producer) run(ctx context.Context, all []*job, part dataset.Part) (map[string]any, error) {
	p.metrics = map[string]any{"graded": 0, "reward_1": 0, "applied": 0, "resumed": 0}
	var todo []*job
	for i, j := range all {
		if !part.Owns(i) {
			continue
		}
		if p.w.Done(j.key) {
			p.count("resumed", 1)
			continue
		}
		todo = append(todo, j)
	}
	prog := stagecmd.NewProgress(p.env.Stderr, p.env.Log, "grade", "patches", int64(len(todo)))
	defer p.g.Wait() // sandboxes close in the background
	ctx, cancel := context.WithCancel(ctx)
	defer cancel()
	results := stagecmd.Each(ctx, p.jobs, todo, func(j *job) result {
		row, err := p.gradeOne(ctx, j)
		return result{j, row, err}
	})

	var durations []time.Duration
	var firstErr error
	last := time.Now()
	for res := range results {
		if res.err != nil {
			if firstErr == nil {
				firstErr = res.err
				cancel()
			}
			continue
		}
		prog.Add(1)
		p.add(res.job, res.row)
		durations = append(durations, time.Duration(res.row.DurationMS)*time.Millisecond)
		if len(p.pending) >= flushRows || time.Since(last) >= flushEvery {
			if err := p.flush(ctx); err != nil && firstErr == nil {
				firstErr = err
				cancel()
			}
			last = time.Now()
		}
	}
	// Grades finished before an interruption are kept: a rerun resumes
	// after them.
	if err := p.flush(context.WithoutCancel(ctx)); err != nil && firstErr == nil {
		firstErr = err
	}
	if firstErr != nil {
		return nil, firstErr
	}
	if err := ctx.Err(); err != nil {
		return nil, err
	}
	prog.Done()
	if len(durations) > 0 {
		sort.Slice(durations, func(i, j int) bool { return durations[i] < durations[j] })
		p.metrics["duration_ms_p50"] = durations[len(durations)/2].Milliseconds()
		p.metrics["duration_ms_max"] = durations[len(durations)-1].Milliseconds()
	}
	return p.metrics, nil
}

// gradeOne grades a job and saves its log. The error is non-nil only when
// the run must stop (the log cannot be stored, ctx cancelled): a grading
// that fails is a row.
// abortedError is the error of an aborted rollout's grade: its reason and,
// when the rollouts row has one, its abort_detail on the same line (the
// error column is one line; docs/records.md §7).
func abortedError(reason, detail string) string {
	s := "the rollout was aborted: " + reason
	if detail = strings.Join(strings.Fields(detail), " "); detail != "" {
		s += ": " + detail
	}
	return s
}

func (p *producer) gradeOne(ctx context.Context, j *job) (records.Grade, error) {
	row := j.row
	t := j.target
	if t.Grading != nil {
		row.GradingKind = &t.Grading.Kind
	}
	if t.ImageDigest != "" {
		row.ImageDigest = &t.ImageDigest
	}
	if j.abort != "" {
		row.ExitCode, row.Failure = -1, records.FailureAborted
		row.Error = optional(abortedError(j.abort, j.abortDetail))
		return row, nil
	}
	var o Outcome
	if j.solution {
		o = p.g.GradeSolution(ctx, t)
	} else {
		o = p.g.Grade(ctx, t, j.patch)
	}
	if err := ctx.Err(); err != nil {
		return row, err // interrupted: no verdict; a rerun grades it
	}
	o.Fill(&row)
	key := dataset.AttachmentKey(p.version, "logs/"+j.key+".jsonl")
	if _, err := p.st.Put(ctx, key, bytes.NewReader(o.Log), int64(len(o.Log))); err != nil {
		return row, fmt.Errorf("saving the grading log of %s (task %q) to %q: %w", j.key, t.TaskID, key, err)
	}
	row.Log = &key
	return row, nil
}

func (p *producer) count(key string, n int) {
	v, _ := p.metrics[key].(int)
	p.metrics[key] = v + n
}

func (p *producer) add(j *job, row records.Grade) {
	p.pending = append(p.pending, row)
	p.keys = append(p.keys, j.key)
	p.count("graded", 1)
	p.count("failure_"+row.Failure, 1)
	if row.Reward == 1 {
		p.count("reward_1", 1)
	}
	if row.Applied {
		p.count("applied", 1)
	}
	if row.Baseline {
		p.baseline = append(p.baseline, row)
	}
}

func (p *producer) flush(ctx context.Context) error {
	if len(p.pending) == 0 {
		return nil
	}
	// Rows finish in any order; a shard holds its rows by index.
	rows := p.pending
	sort.SliceStable(rows, func(i, j int) bool { return rows[i].Index < rows[j].Index })
	_, err := p.w.WriteShard(ctx, int64(len(rows)), p.keys, func(out io.Writer) error {
		enc := records.NewGradeEncoder(out)
		if err := enc.Write(rows...); err != nil {
			return err
		}
		return enc.Close()
	})
	p.pending, p.keys = nil, nil
	return err
}

// tally is the end-of-run summary of a run's metrics, one line: how many
// gradings gave reward 1, how many reward 0 and by which failure class,
// then what the run did not grade (rows resumed from an earlier attempt,
// tasks of another split). For example
//
//	grade: 6 graded: reward 1: 3, reward 0: 3 (tests_failed 2, patch_failed 1); 2 resumed from an earlier attempt
func tally(metrics map[string]any) string {
	n := func(k string) int { v, _ := metrics[k].(int); return v }
	// The failure classes in order: the patch's fault first, then the
	// tests', then kiln's; a class not listed (none today) follows by name.
	failureOrder := []string{records.FailurePatchFailed, records.FailureTestsFailed, records.FailureTimeout,
		records.FailureInfraError, records.FailureNoGrading, records.FailureAborted}
	graded, passed := n("graded"), n("reward_1")
	var b strings.Builder
	fmt.Fprintf(&b, "grade: %d graded: reward 1: %d, reward 0: %d", graded, passed, graded-passed)
	var classes []string
	seen := map[string]bool{records.FailureNone: true}
	for _, f := range failureOrder {
		seen[f] = true
		if c := n("failure_" + f); c > 0 {
			classes = append(classes, fmt.Sprintf("%s %d", f, c))
		}
	}
	var other []string
	for k := range metrics {
		if f, ok := strings.CutPrefix(k, "failure_"); ok && !seen[f] && n(k) > 0 {
			other = append(other, f)
		}
	}
	sort.Strings(other)
	for _, f := range other {
		classes = append(classes, fmt.Sprintf("%s %d", f, n("failure_"+f)))
	}
	if len(classes) > 0 {
		fmt.Fprintf(&b, " (%s)", strings.Join(classes, ", "))
	}
	if r := n("resumed"); r > 0 {
		fmt.Fprintf(&b, "; %d resumed from an earlier attempt", r)
	}
	if s := n("skipped_other_split"); s > 0 {
		fmt.Fprintf(&b, "; %d of another split skipped", s)
	}
	return b.String()
}

// baselineSummary reports the tasks whose empty patch passes: their tests
// do not detect the bug, so a reward on them means nothing. Rows resumed
// from an earlier attempt are not in this run's summary.
func (p *producer) baselineSummary(metrics map[string]any) {
	var passing []string
	for _, r := range p.baseline {
		if r.Reward == 1 {
			passing = append(passing, r.TaskID)
		}
	}
	sort.Strings(passing)
	metrics["baseline_passing"] = len(passing)
	if len(passing) == 0 {
		fmt.Fprintf(p.env.Stderr, "baseline: all %d graded tasks fail with the empty patch, as they should\n", len(p.baseline))
		return
	}
	metrics["baseline_passing_tasks"] = strings.Join(passing, ",")
	fmt.Fprintf(p.env.Stderr, "baseline: %d of %d tasks PASS with the empty patch; their tests do not detect the bug, so their rewards cannot be trusted: %s\n",
		len(passing), len(p.baseline), strings.Join(passing, ", "))
}
