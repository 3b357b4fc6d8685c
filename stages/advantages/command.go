package advantages

import (
	"context"
	"errors"
	"fmt"
	"io"
	"runtime"
	"sort"
	"strings"
	"time"

	"github.com/urfave/cli/v2"
	"golang.org/x/sync/errgroup"

	"github.com/kilnrl/kiln/formats/dataset"
	"github.com/kilnrl/kiln/formats/records"
	"github.com/kilnrl/kiln/formats/store"
	"github.com/kilnrl/kiln/internal/stagecmd"
)

// codeVersion is the advantages stage's code version (dataset.Identity):
// bump it whenever the rows or metrics written for the same inputs and
// arguments change.
const codeVersion = "1"

// shardRows bounds one advantages shard.
const shardRows = 4 << 20

// Flags is what the flags of kiln-advantages itself (the compute command)
// set: the run's options before parsing, the output name and
// --print-version.
type Flags struct {
	Trajectories, Grades, Out, Estimator, InfraFailures string
	StdEps                                              float64
	MinGroupSize                                        int
	DropUniform, DropTruncated, PrintVersion            bool
}

// Flags are the flags of kiln-advantages itself, bound to the fields of f.
func (f *Flags) Flags() []cli.Flag {
	return []cli.Flag{
		stagecmd.StoreFlag(),
		&cli.StringFlag{Name: "trajectories", Value: "trajectories", Destination: &f.Trajectories, Usage: "trajectories dataset: the segments to train (name or name@version)"},
		&cli.StringFlag{Name: "grades", Value: "grades", Destination: &f.Grades, Usage: "grades dataset of the same rollouts (kiln-grade): the only source of rewards"},
		&cli.StringFlag{Name: "out", Value: "advantages", Destination: &f.Out, Usage: "dataset name to write"},
		&cli.StringFlag{Name: "estimator", Value: string(GRPO), Destination: &f.Estimator, Usage: "grpo, dr-grpo, rloo, reinforce-baseline or raw"},
		&cli.Float64Flag{Name: "std-eps", Value: 1e-6, Destination: &f.StdEps, Usage: "grpo: the epsilon added to the group's std"},
		&cli.StringFlag{Name: "infra-failures", Value: string(InfraExclude), Destination: &f.InfraFailures, Usage: "rollouts whose grade is not about the patch (infra_error, aborted, no_grading): zero, exclude or drop-group"},
		&cli.IntFlag{Name: "min-group-size", Value: 2, Destination: &f.MinGroupSize, Usage: "drop a group left with fewer rollouts in its statistics"},
		&cli.BoolFlag{Name: "drop-uniform", Destination: &f.DropUniform, Usage: "drop groups without reward variance (DAPO dynamic sampling)"},
		&cli.BoolFlag{Name: "drop-truncated", Destination: &f.DropTruncated, Usage: "drop rollouts with a truncated segment (the context or output limit cut them)"},
		stagecmd.PrintVersionFlag(&f.PrintVersion),
	}
}

// Help is kiln-advantages' manual.
const Help = `Joins training segments (trajectories) to their rollouts' grades and writes an
advantages dataset: one row per segment with its rollout's advantage, reward and
loss denominator (docs/advantages.md).

Statistics count every ROLLOUT once, however many segments fan-out (sub-agents,
compaction, token drift) split it into: per group_index, over the distinct
rollout ids, one reward each (from --grades; a reward column in trajectories is
ignored), then each rollout's advantage is broadcast to all its segments:
   grpo                (R - mean) / (std + --std-eps), std with Bessel's correction
   dr-grpo             R - mean
   rloo                R - mean of the group's other rollouts
   reinforce-baseline  R - mean (the trainer whitens afterwards)
   raw                 R
A group whose rewards are all equal, or that has one rollout, gets exactly 0
(raw excepted). rollout_trained_tokens is the loss denominator: the trained
tokens of all the rollout's segments, so a trainer divides each segment's
token-loss sum by its whole rollout's total however segments are batched.

Checks (each an error naming the rollout; nothing is committed): every
rollout with segments has exactly one grade, in the same group; all segments
of a rollout agree on group_index and index; no segment number repeats; a
reward is 0 or 1; the trajectories and grades descend from the same tasks
version. A grade without segments is counted (grades_without_trajectories)
and enters no statistics.

Infrastructure failures are not zero rewards. A grade that says nothing about
the patch (failure infra_error, aborted or no_grading; none, patch_failed,
tests_failed and timeout are verdicts on it) is handled by --infra-failures:
   exclude     (default) the rollout is left out of statistics and training
   drop-group  its whole group is left out
   zero        it counts as reward 0, as the reference does
Then a group with fewer than --min-group-size rollouts left is dropped whole;
--drop-uniform drops groups without reward variance; --drop-truncated drops
rollouts with a truncated segment. Every removed row is counted by reason in
the manifest metrics (dropped_rows, dropped_rollouts, dropped_groups), beside
per-group statistics, pass@k, the zero-advantage fraction and the
segments-per-rollout histogram; kiln show prints them.

Commands:
   kiln-advantages select   tasks whose samples both pass and fail
   kiln-advantages stats    print a grades version's statistics

Examples:
   kiln-advantages --trajectories trajectories/step-3 --grades grades/step-3 \
       --out advantages/step-3 --estimator grpo
   kiln-advantages stats --grades grades/step-3`

// Commands are the subcommands of kiln-advantages.
func Commands(env *stagecmd.Env) []*cli.Command {
	return []*cli.Command{SelectCommand(env), StatsCommand(env)}
}

// Action runs the compute command from parsed flags.
func Action(c *cli.Context, env *stagecmd.Env, f *Flags) error {
	if c.NArg() != 0 {
		return stagecmd.Usagef("kiln-advantages takes no arguments, got %q; see --help (subcommands: select, stats)", c.Args().First())
	}
	est, err := ParseEstimator(f.Estimator)
	if err != nil {
		return stagecmd.UsageError{Err: err}
	}
	infra, err := ParseInfraPolicy(f.InfraFailures)
	if err != nil {
		return stagecmd.UsageError{Err: err}
	}
	st, err := stagecmd.OpenStore(c)
	if err != nil {
		return err
	}
	o := RunOptions{Trajectories: f.Trajectories, Grades: f.Grades, Options: Options{
		Estimator: est, StdEps: f.StdEps, Infra: infra, MinGroupSize: f.MinGroupSize,
		DropUniform: f.DropUniform, DropTruncated: f.DropTruncated,
	}}
	out := stagecmd.Output{Name: f.Out, PrintVersion: f.PrintVersion, Hook: env.Hook}
	_, err = Run(c.Context, env, st, out, o)
	return err
}

// RunOptions describe one kiln-advantages run.
type RunOptions struct {
	Trajectories, Grades string // dataset references
	Options
}

// Run computes advantages per o and writes the version out names. The
// computation needs every segment of every group, so it is one part.
func Run(ctx context.Context, env *stagecmd.Env, st store.Store, out stagecmd.Output, o RunOptions) (dataset.Result, error) {
	if _, err := ParseEstimator(string(o.Estimator)); err != nil {
		return dataset.Result{}, stagecmd.UsageError{Err: err}
	}
	if _, err := ParseInfraPolicy(string(o.Infra)); err != nil {
		return dataset.Result{}, stagecmd.UsageError{Err: err}
	}
	if !(o.StdEps > 0) {
		return dataset.Result{}, stagecmd.Usagef("--std-eps %v: want a positive number such as 1e-6", o.StdEps)
	}
	if o.MinGroupSize < 1 {
		return dataset.Result{}, stagecmd.Usagef("--min-group-size %d: want at least 1", o.MinGroupSize)
	}
	inputs, err := stagecmd.ResolveInputs(ctx, st, []string{o.Trajectories, o.Grades}, out.Part)
	if err != nil {
		return dataset.Result{}, err
	}
	out.Kind = records.AdvantagesKind()
	out.Identity = dataset.Identity{Stage: "advantages", CodeVersion: codeVersion, Inputs: inputs, Args: map[string]any{
		"estimator": string(o.Estimator), "std_eps": o.StdEps, "infra_failures": string(o.Infra),
		"min_group_size": o.MinGroupSize, "drop_uniform": o.DropUniform, "drop_truncated": o.DropTruncated,
	}}
	return stagecmd.Write(ctx, st, out, env.Stdout, env.Log, func(ctx context.Context, w *dataset.Writer) (map[string]any, error) {
		tv, err := dataset.OpenKind(ctx, st, inputs[0], records.TrajectoriesKind(), "--trajectories")
		if err != nil {
			return nil, err
		}
		gv, err := dataset.OpenKind(ctx, st, inputs[1], records.GradesKind(), "--grades")
		if err != nil {
			return nil, err
		}
		if err := sameTasks(ctx, st, tv, gv); err != nil {
			return nil, err
		}
		// The two reads overlap: grades are decoded while segments are.
		t0 := time.Now()
		var grades []Grade
		var gradesErr error
		done := make(chan struct{})
		go func() {
			defer close(done)
			grades, gradesErr = ReadGrades(ctx, gv)
		}()
		segs, err := ReadSegments(ctx, tv)
		<-done
		if gradesErr != nil {
			return nil, gradesErr
		}
		if err != nil {
			return nil, err
		}
		t1 := time.Now()
		res, err := Compute(segs, grades, o.Options)
		if err != nil {
			var bad BadInput
			if errors.As(err, &bad) {
				return nil, stagecmd.BadInputError{Err: fmt.Errorf("trajectories %s, grades %s: %w", tv.Ref(), gv.Ref(), err)}
			}
			return nil, err
		}
		var wrote time.Duration
		for lo := 0; lo < len(res.Rows) || lo == 0; lo += shardRows {
			tw := time.Now()
			rows := res.Rows[lo:min(lo+shardRows, len(res.Rows))]
			if _, err := w.WriteShard(ctx, int64(len(rows)), nil, func(wr io.Writer) error {
				enc, err := records.NewAdvantageEncoder(wr, records.ArrowOptions{})
				if err != nil {
					return err
				}
				if err := enc.Write(rows...); err != nil {
					return err
				}
				return enc.Close()
			}); err != nil {
				return nil, err
			}
			wrote += time.Since(tw)
		}
		t2 := time.Now()
		m := res.Metrics(len(segs))
		Summarize(grades).Metrics(m)
		env.Log.Info("advantages", "segments", len(segs), "rollouts", res.Rollouts, "rows", len(res.Rows),
			"dropped_rows", res.DroppedRows, "grades_without_trajectories", res.GradesWithoutTrajectories,
			"read_s", t1.Sub(t0).Seconds(), "compute_s", t2.Sub(t1).Seconds()-wrote.Seconds(), "write_s", wrote.Seconds())
		if res.AllZero() {
			env.Log.Warn("every advantage is 0: training on them teaches nothing (every group's rollouts got the same reward?)",
				"trajectories", tv.Ref().String(), "grades", gv.Ref().String(), "rows", len(res.Rows), "groups", len(res.Groups))
		}
		for _, l := range res.SummaryLines() {
			fmt.Fprintln(env.Stderr, l)
		}
		return m, nil
	})
}

// Metrics are the result's manifest metrics (docs/advantages.md §5).
func (r *Result) Metrics(segments int) map[string]any {
	trainedGroups, zero, rollouts := 0, 0, 0
	for _, g := range r.Groups {
		if g.Dropped == "" {
			trainedGroups++
			rollouts += g.Trained
			if g.ZeroAdvantage {
				zero++
			}
		}
	}
	frac := 0.0
	if trainedGroups > 0 {
		frac = float64(zero) / float64(trainedGroups)
	}
	return map[string]any{
		"segments_in": segments, "rollouts_in": r.Rollouts, "groups_in": len(r.Groups),
		"rows": len(r.Rows), "rollouts_trained": rollouts, "groups_trained": trainedGroups,
		"grades_without_trajectories": r.GradesWithoutTrajectories,
		"dropped_rows":                r.DroppedRows, "dropped_rollouts": r.DroppedRollouts, "dropped_groups": r.DroppedGroups,
		"zero_advantage_groups_fraction": frac,
		"segments_per_rollout":           r.SegmentsPerRollout,
		"group_stats":                    groupColumns(r.Groups),
	}
}

// groupColumns is the per-group statistics as columns (one array per
// field, groups in order of first appearance): a tenth of the size of one
// object per group, which matters at 10k groups in a manifest.
func groupColumns(gs []GroupStat) map[string]any {
	n := len(gs)
	gi, task := make([]int64, n), make([]string, n)
	rollouts, segments, gradeable, trained := make([]int, n), make([]int, n), make([]int, n), make([]int, n)
	mean, pass := make([]float64, n), make([]float64, n)
	dropped, zero := make([]string, n), make([]bool, n)
	for i, g := range gs {
		gi[i], task[i], rollouts[i], segments[i], gradeable[i], trained[i] = g.GroupIndex, g.TaskID, g.Rollouts, g.Segments, g.Gradeable, g.Trained
		mean[i], pass[i], dropped[i], zero[i] = g.RewardMean, g.PassRate, g.Dropped, g.ZeroAdvantage
	}
	return map[string]any{"group_index": gi, "task_id": task, "rollouts": rollouts, "segments": segments, "gradeable": gradeable,
		"reward_mean": mean, "pass_rate": pass, "trained": trained, "dropped": dropped, "zero_advantage": zero}
}

// ReadGrades reads a grades version, checking every row as its writer did
// (a NaN or out-of-range reward is an error naming the rollout).
func ReadGrades(ctx context.Context, v *dataset.Version) ([]Grade, error) {
	var out []Grade
	err := v.EachShard(ctx, func(i int, data []byte) error {
		return records.EachGrade(data, func(g records.Grade) error {
			if err := g.Validate(); err != nil {
				return stagecmd.BadInputError{Err: fmt.Errorf("grades %s: %w: regrade the rollout", v.Ref(), err)}
			}
			out = append(out, GradeOf(&g))
			return nil
		})
	})
	return out, err
}

// ReadSegments reads a trajectories version, only the columns advantages
// rest on (records.EachSegmentTotals checks them), decoding up to GOMAXPROCS shards at once; the segments come
// back in the version's order.
func ReadSegments(ctx context.Context, v *dataset.Version) ([]Segment, error) {
	parts := make([][]Segment, len(v.Shards))
	g, ctx := errgroup.WithContext(ctx)
	g.SetLimit(min(runtime.GOMAXPROCS(0), 4))
	for i := range v.Shards {
		g.Go(func() error {
			data, err := v.ReadShard(ctx, i)
			if err != nil {
				return err
			}
			out := make([]Segment, 0, v.Shards[i].Rows)
			err = records.EachSegmentTotals(data, func(t records.SegmentTotals) error {
				out = append(out, Segment(t))
				return nil
			})
			if err != nil {
				return fmt.Errorf("trajectories %s shard %q: %w: %w", v.Ref(), v.Shards[i].Key, err, dataset.ErrCorrupt)
			}
			parts[i] = out
			return nil
		})
	}
	if err := g.Wait(); err != nil {
		return nil, err
	}
	out := make([]Segment, 0, v.Rows)
	for _, p := range parts {
		out = append(out, p...)
	}
	return out, nil
}

// lineageDepth bounds the walk up a version's inputs looking for tasks:
// trajectories <- turns <- rollouts <- tasks is three steps.
const lineageDepth = 4

// tasksLineage lists the tasks versions among v's inputs, transitively.
// An input that is gone (collected) ends its branch quietly.
func tasksLineage(ctx context.Context, st store.Store, v *dataset.Version) (map[string]bool, error) {
	found, seen := map[string]bool{}, map[string]bool{}
	level := v.Inputs
	for d := 0; d < lineageDepth && len(level) > 0; d++ {
		var next []dataset.Ref
		for _, in := range level {
			if seen[in.String()] || !in.Pinned() {
				continue
			}
			seen[in.String()] = true
			iv, err := dataset.Open(ctx, st, in)
			if errors.Is(err, dataset.ErrNotFound) || errors.Is(err, store.ErrNotExist) {
				continue
			}
			if err != nil {
				return nil, fmt.Errorf("reading the lineage of %s: %w", v.Ref(), err)
			}
			if iv.Kind().Name == records.TasksKind().Name {
				found[in.String()] = true
				continue
			}
			next = append(next, iv.Inputs...)
		}
		level = next
	}
	return found, nil
}

// sameTasks refuses trajectories and grades that descend from different
// tasks versions: their group_index values would name different tasks.
func sameTasks(ctx context.Context, st store.Store, tv, gv *dataset.Version) error {
	ta, err := tasksLineage(ctx, st, tv)
	if err != nil {
		return err
	}
	ga, err := tasksLineage(ctx, st, gv)
	if err != nil {
		return err
	}
	if len(ta) == 0 || len(ga) == 0 {
		return nil // imported data without lineage: the per-rollout group check still holds
	}
	for r := range ta {
		if ga[r] {
			return nil
		}
	}
	return stagecmd.BadInputError{Err: fmt.Errorf("grades %s were graded against tasks %s but trajectories %s come from tasks %s: pass the grades of these rollouts",
		gv.Ref(), keys(ga), tv.Ref(), keys(ta))}
}

func keys(m map[string]bool) string {
	var ks []string
	for k := range m {
		ks = append(ks, k)
	}
	sort.Strings(ks)
	return strings.Join(ks, ", ")
}
