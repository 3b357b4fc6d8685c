package rollout

import (
	"context"
	"errors"
	"fmt"
	"io"
	"sort"
	"strings"
	"time"

	"github.com/urfave/cli/v2"

	"github.com/kilnrl/kiln/formats/dataset"
	"github.com/kilnrl/kiln/formats/records"
	"github.com/kilnrl/kiln/formats/store"
	"github.com/kilnrl/kiln/internal/stagecmd"
	"github.com/kilnrl/kiln/stages/grade"
)

const checkHelp = `Rolls out and grades a few tasks with the real agent and grader, the check to
run before spending GPU hours (docs/rollout.md §4): the run command on --tasks
(keep it small: a handful of tasks, or --split), then kiln-grade --rollouts on
its rollouts, committing OUT/rollouts, OUT/turns, OUT/trajectories and
OUT/grades. Prints one line per task with each sample's reward (or abort
reason), and exits 1 unless some sample earns reward 1. Warns when the
settings cannot give a learning signal: one sample per task, or temperature 0
(every sample of a task then gets the same reward).

Takes every flag of run, and --grade-timeout for each grading command.

Example:
   kiln-rollout check --tasks tasks@V --images images@V --bundles /var/lib/kiln/bundles \
       --engine http://gpu1:8000 --tokenizer-dir /models/qwen3 --samples 4 --out check/qwen3`

func checkCommand(env *stagecmd.Env) *cli.Command {
	f := &checkFlagValues{}
	return &cli.Command{
		Name:        "check",
		Usage:       "roll out and grade a few tasks; fail unless some sample earns reward 1",
		Description: checkHelp,
		Flags: append(runFlags(&f.run),
			&cli.DurationFlag{Name: "grade-timeout", Value: grade.DefaultTimeout, Destination: &f.gradeTimeout, Usage: "limit of each grading command"}),
		Action: func(c *cli.Context) error { return checkAction(c, env, f) },
	}
}

// checkFlagValues are what check's flags set: run's, and the grade timeout.
type checkFlagValues struct {
	run          runFlagValues
	gradeTimeout time.Duration
}

func checkAction(c *cli.Context, env *stagecmd.Env, f *checkFlagValues) error {
	if c.NArg() != 0 {
		return stagecmd.Usagef("check: takes no arguments")
	}
	o, err := f.run.options()
	if err != nil {
		return err
	}
	st, err := stagecmd.OpenStore(c)
	if err != nil {
		return err
	}
	if f.run.printVersion {
		return CheckVersions(c.Context, env, st, f.run.out, o, f.gradeTimeout)
	}
	return Check(c.Context, env, st, f.run.out, o, f.gradeTimeout)
}

// CheckVersions is check --print-version: it prints the references a
// check would commit (OUT/rollouts, OUT/turns, OUT/trajectories, then
// OUT/grades) and runs, grades and writes nothing, as every writing
// command's --print-version (kiln's planner probes a recipe with it to
// tell whether the store already holds its outputs). The grades' version
// is named from the rollouts' pinned reference, which need not be
// committed yet.
func CheckVersions(ctx context.Context, env *stagecmd.Env, st store.Store, out string, o RunOptions, gradeTimeout time.Duration) error {
	res, err := Run(ctx, env, st, RunOutput{Name: out, PrintVersion: true}, o)
	if err != nil {
		return err
	}
	_, err = grade.Run(ctx, env, st, stagecmd.Output{Name: out + "/grades", PrintVersion: true}, grade.Options{Tasks: o.Tasks, Images: o.Images,
		Bundles: o.Bundles, Rollouts: res.Rollouts.Ref.String(), Jobs: o.Jobs, Timeout: gradeTimeout})
	return err
}

// ErrNoReward is Check's error when no sample earned reward 1.
var ErrNoReward = errors.New("no sample earned reward 1")

// Check runs o, grades the rollouts into OUT/grades, prints per-task
// outcomes to env.Stderr and fails with ErrNoReward unless some sample
// earned reward 1.
func Check(ctx context.Context, env *stagecmd.Env, st store.Store, out string, o RunOptions, gradeTimeout time.Duration) error {
	if o.Samples < 2 {
		fmt.Fprintf(env.Stderr, "warning: --samples %d: with one sample per task every group has one reward, so no advantage is ever non-zero\n", o.Samples)
	}
	if o.Temperature == 0 {
		fmt.Fprintln(env.Stderr, "warning: --temperature 0: greedy samples of a task are alike, so their rewards are too and give no learning signal")
	}
	res, err := Run(ctx, env, st, RunOutput{Name: out}, o)
	if err != nil {
		return err
	}
	gres, err := grade.Run(ctx, env, st, stagecmd.Output{Name: out + "/grades"}, grade.Options{Tasks: o.Tasks, Images: o.Images,
		Bundles: o.Bundles, Rollouts: res.Rollouts.Ref.String(), Jobs: o.Jobs, Timeout: gradeTimeout})
	if err != nil {
		return err
	}
	return checkReport(ctx, env.Stderr, st, res.Rollouts.Ref, gres.Ref)
}

// checkReport prints a line per task: each sample's reward, or its abort
// reason, in sample order.
func checkReport(ctx context.Context, w io.Writer, st store.Store, rollouts, grades dataset.Ref) error {
	aborts := map[int64]string{}
	rv, err := dataset.Open(ctx, st, rollouts)
	if err != nil {
		return err
	}
	if err := rv.EachShard(ctx, func(_ int, data []byte) error {
		return records.EachRollout(data, func(r records.Rollout) error {
			if r.AbortReason != nil {
				aborts[r.Index] = *r.AbortReason
			}
			return nil
		})
	}); err != nil {
		return err
	}
	gv, err := dataset.Open(ctx, st, grades)
	if err != nil {
		return err
	}
	var rows []records.Grade
	if err := gv.EachShard(ctx, func(_ int, data []byte) error {
		return records.EachGrade(data, func(g records.Grade) error { rows = append(rows, g); return nil })
	}); err != nil {
		return err
	}
	sort.Slice(rows, func(i, j int) bool { return rows[i].Index < rows[j].Index })
	var order []string
	outcomes := map[string][]string{}
	solved := 0
	for _, g := range rows {
		if _, ok := outcomes[g.TaskID]; !ok {
			order = append(order, g.TaskID)
		}
		o := fmt.Sprintf("%g", g.Reward)
		switch {
		case aborts[g.Index] != "":
			o = "aborted:" + aborts[g.Index]
		case g.Reward == 1:
			solved++
		case g.Failure != records.FailureTestsFailed:
			o += "(" + g.Failure + ")"
		}
		outcomes[g.TaskID] = append(outcomes[g.TaskID], o)
	}
	for _, id := range order {
		fmt.Fprintf(w, "check: %s: %s\n", id, strings.Join(outcomes[id], " "))
	}
	fmt.Fprintf(w, "check: %d of %d samples earned reward 1\n", solved, len(rows))
	if solved == 0 {
		return fmt.Errorf("check of %s: %w; see the grades %s", rollouts, ErrNoReward, grades)
	}
	return nil
}
