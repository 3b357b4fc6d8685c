// Package pipelinecmd is kiln's pipeline commands over the pipelines
// engine and its Slurm back end: run, plan (--slurm), why, slurm, status,
// and the pipeline half of kiln verify (docs/design.md §6,
// pipelines/README.md). The engine itself is a library with no CLI.
package pipelinecmd

import (
	"context"
	"errors"
	"fmt"
	"io"
	"os"
	"strings"
	"time"

	"github.com/urfave/cli/v2"

	"github.com/kilnrl/kiln/formats/store"
	"github.com/kilnrl/kiln/internal/stagecmd"
	"github.com/kilnrl/kiln/pipelines"
	"github.com/kilnrl/kiln/pipelines/slurm"
)

// splitArgs separates FILE, TARGETs and VAR=value arguments.
func splitArgs(c *cli.Context) (file string, targets []string, vars map[string]string, err error) {
	args := c.Args().Slice()
	if len(args) == 0 {
		return "", nil, nil, stagecmd.Usagef("%s: want a pipeline FILE (*.kiln); see --help", c.Command.Name)
	}
	targets, vars = pipelines.SplitArgs(args[1:])
	return args[0], targets, vars, nil
}

func loadPlan(c *cli.Context, env *stagecmd.Env) (*pipelines.Plan, []string, error) {
	file, targets, vars, err := splitArgs(c)
	if err != nil {
		return nil, nil, err
	}
	spec, err := pipelines.Load(file, vars, os.Environ())
	if err != nil {
		if _, ok := err.(*pipelines.Error); ok {
			return nil, nil, stagecmd.UsageError{Err: err}
		}
		return nil, nil, err
	}
	st, err := stagecmd.OpenStore(c)
	if err != nil {
		return nil, nil, err
	}
	plan, err := pipelines.NewPlan(c.Context, spec, pipelines.PlanOptions{Store: st, Targets: targets, Log: env.Log})
	if err != nil {
		if _, ok := err.(*pipelines.Error); ok {
			return nil, nil, stagecmd.UsageError{Err: err}
		}
		return nil, nil, err
	}
	return plan, targets, nil
}

const specHelp = `The spec language is pipelines/README.md: variables (NAME = value,
NAME ?= default; VAR=value arguments win, then the environment for ?=),
targets "name: [attrs] prerequisites" with tab-indented recipe lines, step
targets ("rollout/$(step): train/$(step-1)") expanded for step 1..$(STEPS),
$(ref TARGET) for a prerequisite's committed ref, $(ref TARGET NAME) for
its output NAME (kiln-rollout run writes OUT/rollouts, OUT/turns and
OUT/trajectories: $(ref rollout/3 rollouts)). kiln verify FILE.kiln
TARGET reruns a done target into a scratch dataset and compares content
hashes (kiln verify REF is the dataset check).`

// Commands are kiln's pipeline commands: run, plan (with --slurm), why,
// and Slurm's slurm and status.
func Commands(env *stagecmd.Env) []*cli.Command {
	cmds := engineCommands(env)
	o := slurm.Options{Plan: planner(env)}
	for _, c := range cmds {
		if c.Name == "plan" {
			slurm.PlanWithSlurm(env, c, o)
		}
	}
	return append(cmds, slurm.Commands(env, o)...)
}

// engineCommands are run, plan and why.
func engineCommands(env *stagecmd.Env) []*cli.Command {
	var whyLog bool
	var ro struct {
		jobs      int
		keepGoing bool
		stale     time.Duration
		only      string
		shard     int
	}
	return []*cli.Command{
		{
			Name: "run", Usage: "run a pipeline's targets that are not done (local execution, -j N)",
			Category:  "pipelines",
			ArgsUsage: "FILE.kiln [TARGET...] [VAR=value...]",
			Description: `Plans like kiln plan, then runs every target that is not done, in
dependency order, up to -j at a time. Each recipe runs as one "sh -e"
script in the spec's directory with KILN_STORE, KILN_TARGET, KILN_STEP,
KILN_SHARD/KILN_SHARDS and KILN_TMPDIR (a fresh directory) set. Output lines
go to stderr prefixed "[target] " and are kept in the store under
_pipelines/NAME/logs/. A target whose recipe fails is retried (retries=N);
otherwise its failure (reason and output) is recorded for kiln why and
kiln status, the run stops starting targets and exits 1, whatever status
the stage exited with (--keep-going runs the independent ones). A service
starts once its own prerequisites are done, before its first user. A run
holds the pipeline's lock in the store; a second run fails with a message
naming the holder. A run that loses its lock (stopped past --lock-stale
while another took it over) kills its targets and exits 1. After a crash
or Ctrl-C, run again: done targets are recorded and are not rerun.

--only TARGET runs that one target, without the lock, once its
prerequisites are done: what each job of kiln slurm runs. With --shard N
it runs only shard N of a sharded target (an array task); the target is
done once every shard has committed its part of the one version. A
service target with --only runs in the foreground until SIGTERM and is
never recorded done; a user of a service whose health check already
passes does not start it again.

` + specHelp + `

Examples:
   kiln run rl.kiln -j 2 STEPS=10
   kiln run rl.kiln train/3 STALENESS=0

The last stdout line is the ref of the last target (its dataset ref, or
key:KEY for a target without an output dataset).`,
			Flags: []cli.Flag{
				stagecmd.StoreFlag(),
				&cli.IntFlag{Name: "jobs", Aliases: []string{"j"}, Value: 1, Destination: &ro.jobs, Usage: "targets to run at the same time"},
				&cli.BoolFlag{Name: "keep-going", Aliases: []string{"k"}, Destination: &ro.keepGoing, Usage: "after a failure, still run targets that do not depend on it"},
				&cli.StringFlag{Name: "only", Destination: &ro.only, Usage: "run exactly this target (its prerequisites must be done): what a Slurm job runs; a service target runs in the foreground until stopped"},
				&cli.IntFlag{Name: "shard", Value: -1, DefaultText: "every shard", Destination: &ro.shard, Usage: "with --only, run only shard `N` (0-based) of a sharded target: what a Slurm array task runs; the target is done when every shard is"},
				&cli.DurationFlag{Name: "lock-stale", Value: 2 * time.Minute, Destination: &ro.stale, Usage: "take over a lock not refreshed for this long"},
			},
			Action: func(c *cli.Context) error {
				plan, _, err := loadPlan(c, env)
				if err != nil {
					return err
				}
				var shards []int
				if ro.shard >= 0 {
					if ro.only == "" {
						return stagecmd.Usagef("run: --shard N needs --only TARGET (the sharded target)")
					}
					shards = []int{ro.shard}
				}
				if ro.only != "" {
					if err := plan.Only(ro.only); err != nil {
						return stagecmd.Usagef("run: %v", err)
					}
					t := plan.Target(ro.only)
					if shards != nil && ro.shard >= max(t.Attrs.Shards, 1) {
						return stagecmd.Usagef("run: --shard %d: %s has %d shard(s), 0..%d", ro.shard, t.Name, max(t.Attrs.Shards, 1), max(t.Attrs.Shards, 1)-1)
					}
					if t.Service {
						// A service's own job (Slurm's companion job):
						// run it until stopped; it is never recorded done.
						return plan.Serve(c.Context, t.Name, env.Stderr)
					}
				}
				todo := 0
				for _, t := range plan.Targets {
					if !t.Done && !t.Service {
						todo++
					}
				}
				if todo == 0 {
					env.Log.Info("nothing to run: every target is done", "pipeline", plan.Spec.Name, "targets", len(plan.Targets))
				}
				prog := stagecmd.NewProgress(env.Stderr, env.Log, "pipeline "+plan.Spec.Name, "targets", int64(todo))
				res, err := plan.Run(c.Context, pipelines.RunOptions{Jobs: ro.jobs, KeepGoing: ro.keepGoing, Output: env.Stderr, LockStale: ro.stale, NoLock: ro.only != "", Shards: shards,
					OnEvent: func(t *pipelines.Target, ev string) {
						switch ev {
						case "start":
							env.Log.Info("start", "target", t.Name)
						case "done", "failed", "skipped":
							env.Log.Info(ev, "target", t.Name, "ref", t.Ref)
							prog.Add(1)
						}
					}})
				if res != nil {
					env.Log.Info("pipeline", "ran", len(res.Ran), "failed", len(res.Failed), "skipped", len(res.Skipped))
				}
				if err != nil {
					return err
				}
				if res.Final != "" {
					fmt.Fprintln(env.Stdout, res.Final)
				}
				return nil
			},
		},
		{
			Name: "plan", Usage: "print what kiln run would run, and why",
			Category:  "pipelines",
			ArgsUsage: "FILE.kiln [TARGET...] [VAR=value...]",
			Description: `Prints one line per target in dependency order: "run" or "done", the
target, and why: the first difference from its last recorded build (a
variable, an input's version, a recipe line, an attribute), "never built",
or the prerequisite it waits for; done targets say what proves it. It is
the planning code of kiln run, without running anything.

` + specHelp + `

Examples:
   kiln plan rl.kiln
   kiln plan rl.kiln STALENESS=0 train/2`,
			Flags: []cli.Flag{stagecmd.StoreFlag()},
			Action: func(c *cli.Context) error {
				plan, _, err := loadPlan(c, env)
				if err != nil {
					return err
				}
				for _, t := range plan.Targets {
					state := "run "
					if t.Done {
						state = "done"
					}
					fmt.Fprintf(env.Stdout, "%s %s: %s\n", state, t.Name, t.Why)
				}
				return nil
			},
		},
		{
			Name: "why", Usage: "explain one pipeline target: its key, inputs, state and last build",
			Category:  "pipelines",
			ArgsUsage: "FILE.kiln TARGET [VAR=value...]",
			Description: `Prints the target's state and reason (as kiln plan does), its key, the
refs of its prerequisites, its expanded recipe, its last recorded build
(ref, every output, start and end times) and, when its last build failed,
the failure: the reason, the store key of its output, and the output's
last lines (--log prints all of it).

Example:
   kiln why rl.kiln rollout/3 STALENESS=1`,
			Flags: []cli.Flag{stagecmd.StoreFlag(),
				&cli.BoolFlag{Name: "log", Destination: &whyLog, Usage: "print the whole output of the failed build, not its last lines"}},
			Action: func(c *cli.Context) error {
				plan, targets, err := loadPlan(c, env)
				if err != nil {
					return err
				}
				if len(targets) != 1 {
					return stagecmd.Usagef("why: want FILE and one TARGET")
				}
				t := plan.Target(targets[0])
				state := "must run"
				if t.Done {
					state = "done"
				}
				w := env.Stdout
				fmt.Fprintf(w, "%s: %s (%s)\n", t.Name, state, t.Why)
				fmt.Fprintf(w, "defined at %s:%d\n", t.Pos.File, t.Pos.Line)
				if t.Key != "" {
					fmt.Fprintf(w, "key %s\n", t.Key)
				}
				for _, d := range t.Deps {
					dt := plan.Target(d)
					fmt.Fprintf(w, "input %s %s\n", d, dt.Identity())
				}
				for _, l := range t.Recipe {
					fmt.Fprintf(w, "recipe %s\n", l)
				}
				last, err := plan.Last(c.Context, t.Name)
				if err != nil {
					return err
				}
				if last != nil {
					fmt.Fprintf(w, "last build %s key %s start %s end %s\n", last.Ref, last.Key[:12],
						last.Start.UTC().Format(time.RFC3339Nano), last.End.UTC().Format(time.RFC3339Nano))
					if len(last.Outputs) > 1 {
						fmt.Fprintf(w, "outputs %s\n", strings.Join(last.Outputs, " "))
					}
				}
				return printFailure(c.Context, w, plan, t.Name, whyLog)
			},
		},
	}
}

// VerifyHelp is the pipeline half of kiln verify's help.
const VerifyHelp = `With a pipeline: kiln verify FILE.kiln TARGET [VAR=value...] (or
--pipeline FILE TARGET) reruns a done target whose output is a dataset
into a scratch dataset (NAME-verify) and compares the two versions'
shard content hashes; a difference means the stage is not deterministic
(exit 4). The scratch dataset is removed before the rerun (so a leftover
one cannot stand in for it) and after a match; after a difference it is
kept for inspection (kiln forget, or the next verify, removes it).`

// Verify is kiln verify FILE.kiln TARGET [VAR=value...] (file is the
// pipeline, given first or with --pipeline): Plan.Verify, a difference
// exit 4.
func Verify(c *cli.Context, env *stagecmd.Env, file string) error {
	args := c.Args().Slice()
	if len(args) > 0 && args[0] == file {
		args = args[1:]
	}
	targets, vars := pipelines.SplitArgs(args)
	if len(targets) != 1 {
		return stagecmd.Usagef("verify: want FILE.kiln and one TARGET")
	}
	spec, err := pipelines.Load(file, vars, os.Environ())
	if err != nil {
		return stagecmd.UsageError{Err: err}
	}
	st, err := stagecmd.OpenStore(c)
	if err != nil {
		return err
	}
	plan, err := pipelines.NewPlan(c.Context, spec, pipelines.PlanOptions{Store: st, Targets: targets, Log: env.Log})
	if err != nil {
		return err
	}
	outs, err := plan.Verify(c.Context, targets[0], env.Stderr)
	if errors.Is(err, pipelines.ErrNotDeterministic) {
		return stagecmd.CorruptError{Err: err}
	}
	if err != nil {
		return err
	}
	t := plan.Target(targets[0])
	fmt.Fprintf(env.Stderr, "verify %s: ok, the rerun %s had the same content as %s (removed)\n", t.Name, strings.Join(outs, " "), strings.Join(t.Outputs, " "))
	fmt.Fprintln(env.Stdout, t.Ref)
	return nil
}

// whyLogLines is how many of a failed build's last output lines kiln why
// prints without --log.
const whyLogLines = 20

// printFailure prints target's failure record, if any: the reason, the
// log's store key and its last lines (all of it with all).
func printFailure(ctx context.Context, w io.Writer, plan *pipelines.Plan, target string, all bool) error {
	f, err := plan.LastFailure(ctx, target)
	if err != nil || f == nil {
		return err
	}
	fmt.Fprintf(w, "last failure %s: %s\n", f.End.UTC().Format(time.RFC3339), f.Reason)
	if f.Log == "" {
		return nil
	}
	b, _, err := store.ReadAll(ctx, plan.Store(), f.Log)
	if err != nil {
		fmt.Fprintf(w, "log %s (unreadable: %v)\n", f.Log, err)
		return nil
	}
	lines := strings.Split(strings.TrimRight(string(b), "\n"), "\n")
	if !all && len(lines) > whyLogLines {
		fmt.Fprintf(w, "log %s (last %d of %d lines; --log prints all)\n", f.Log, whyLogLines, len(lines))
		lines = lines[len(lines)-whyLogLines:]
	} else {
		fmt.Fprintf(w, "log %s\n", f.Log)
	}
	for _, l := range lines {
		fmt.Fprintf(w, "  %s\n", l)
	}
	return nil
}
