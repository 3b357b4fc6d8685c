package advantages

import (
	"context"
	"fmt"
	"io"

	"github.com/urfave/cli/v2"

	"github.com/kilnrl/kiln/formats/dataset"
	"github.com/kilnrl/kiln/formats/records"
	"github.com/kilnrl/kiln/formats/store"
	"github.com/kilnrl/kiln/internal/stagecmd"
)

// SelectHelp is the manual of kiln-advantages select.
const SelectHelp = `Writes the tasks that still teach something: those whose gradeable samples in
--grades number at least --min-samples and include both a success (reward 1)
and a failure (docs/advantages.md §6). Grades not about the patch
(infra_error, aborted, no_grading) are not samples. The output is a tasks
dataset holding the selected rows of --tasks unchanged, task_index included,
so group_index keeps naming the same task; its manifest names the grades and
tasks versions as inputs and the criterion in its metrics.

--grades must have been graded against --tasks (the tasks version is among the
grades version's inputs); a grade whose task id is not the --tasks row of its
group_index is an error.

Example:
   kiln-advantages select --grades grades/probe --tasks tasks --min-samples 8 --out tasks/learnable`

// SelectCommand is kiln-advantages select.
func SelectCommand(env *stagecmd.Env) *cli.Command {
	var f struct {
		grades, tasks, out string
		minSamples         int
		printVersion       bool
	}
	return &cli.Command{
		Name:        "select",
		Usage:       "write the tasks whose samples both pass and fail",
		Description: SelectHelp,
		Flags: []cli.Flag{
			stagecmd.StoreFlag(),
			&cli.StringFlag{Name: "grades", Value: "grades", Destination: &f.grades, Usage: "grades dataset of samples of the tasks"},
			&cli.StringFlag{Name: "tasks", Value: "tasks", Destination: &f.tasks, Usage: "the tasks dataset the grades were graded against"},
			&cli.IntFlag{Name: "min-samples", Value: 8, Destination: &f.minSamples, Usage: "gradeable samples a task needs to be judged"},
			&cli.StringFlag{Name: "out", Destination: &f.out, Usage: "tasks dataset name to write (required)"},
			stagecmd.PrintVersionFlag(&f.printVersion),
		},
		Action: func(c *cli.Context) error {
			if c.NArg() != 0 {
				return stagecmd.Usagef("kiln-advantages select takes no arguments, got %q", c.Args().First())
			}
			st, err := stagecmd.OpenStore(c)
			if err != nil {
				return err
			}
			out := stagecmd.Output{Name: f.out, PrintVersion: f.printVersion, Hook: env.Hook}
			_, err = Select(c.Context, env, st, out, f.grades, f.tasks, f.minSamples)
			return err
		},
	}
}

// Select writes the tasks of tasksRef whose gradeable samples in gradesRef
// are at least minSamples and both pass and fail.
func Select(ctx context.Context, env *stagecmd.Env, st store.Store, out stagecmd.Output, gradesRef, tasksRef string, minSamples int) (dataset.Result, error) {
	if out.Name == "" {
		return dataset.Result{}, stagecmd.Usagef("--out NAME is required: the tasks dataset to write")
	}
	if minSamples < 2 {
		return dataset.Result{}, stagecmd.Usagef("--min-samples %d: want at least 2 (one success and one failure)", minSamples)
	}
	inputs, err := stagecmd.ResolveInputs(ctx, st, []string{gradesRef, tasksRef}, out.Part)
	if err != nil {
		return dataset.Result{}, err
	}
	criterion := map[string]any{"min_samples": minSamples,
		"rule": "gradeable samples >= min_samples, at least one with reward 1 and one with reward 0; gradeable: failure none, patch_failed, tests_failed or timeout"}
	out.Kind = records.TasksKind()
	out.Identity = dataset.Identity{Stage: "advantages-select", CodeVersion: codeVersion, Inputs: inputs, Args: map[string]any{"min_samples": minSamples}}
	return stagecmd.Write(ctx, st, out, env.Stdout, env.Log, func(ctx context.Context, w *dataset.Writer) (map[string]any, error) {
		gv, err := dataset.OpenKind(ctx, st, inputs[0], records.GradesKind(), "--grades")
		if err != nil {
			return nil, err
		}
		tv, err := dataset.OpenKind(ctx, st, inputs[1], records.TasksKind(), "--tasks")
		if err != nil {
			return nil, err
		}
		lineage, err := tasksLineage(ctx, st, gv)
		if err != nil {
			return nil, err
		}
		if !lineage[tv.Ref().String()] {
			if len(lineage) == 0 {
				return nil, stagecmd.BadInputError{Err: fmt.Errorf("grades %s name no tasks version among their inputs, so nothing says they grade tasks %s: pass grades written by kiln-grade --tasks %s", gv.Ref(), tv.Ref(), tv.Ref())}
			}
			return nil, stagecmd.BadInputError{Err: fmt.Errorf("grades %s were graded against tasks %s, not %s: pass --tasks %s", gv.Ref(), keys(lineage), tv.Ref(), keys(lineage))}
		}
		grades, err := ReadGrades(ctx, gv)
		if err != nil {
			return nil, err
		}
		var tasks []records.Task
		err = tv.EachShard(ctx, func(_ int, data []byte) error {
			return records.EachTask(data, func(t records.Task) error { tasks = append(tasks, t); return nil })
		})
		if err != nil {
			return nil, err
		}
		byIndex := make(map[int64]int, len(tasks))
		for i, t := range tasks {
			byIndex[t.TaskIndex] = i
		}
		for i := range grades {
			g := &grades[i]
			ti, ok := byIndex[g.GroupIndex]
			if !ok || tasks[ti].TaskID != g.TaskID {
				return nil, stagecmd.BadInputError{Err: fmt.Errorf("grades %s: rollout %d names task %q at group_index %d, which is not that row of tasks %s: pass the tasks version it was graded against", gv.Ref(), g.RolloutID, g.TaskID, g.GroupIndex, tv.Ref())}
			}
		}
		var nonBaseline []Grade
		for _, g := range grades {
			if !g.Baseline {
				nonBaseline = append(nonBaseline, g)
			}
		}
		stats := map[int64]TaskStat{}
		for _, t := range Summarize(nonBaseline).Tasks {
			stats[t.GroupIndex] = t
		}
		counts := map[string]int{}
		var selected []records.Task
		for _, t := range tasks {
			s, ok := stats[t.TaskIndex]
			switch {
			case !ok:
				counts["ungraded"]++
			case s.Gradeable < minSamples:
				counts["too_few_samples"]++
			case s.Passed == 0:
				counts["all_fail"]++
			case s.Passed == s.Gradeable:
				counts["all_pass"]++
			default:
				counts["selected"]++
				selected = append(selected, t)
			}
		}
		if _, err := w.WriteShard(ctx, int64(len(selected)), nil, func(wr io.Writer) error {
			enc := records.NewTaskEncoder(wr)
			if err := enc.Write(selected...); err != nil {
				return err
			}
			return enc.Close()
		}); err != nil {
			return nil, err
		}
		env.Log.Info("selected", "tasks", len(tasks), "selected", len(selected), "counts", counts)
		return map[string]any{"criterion": criterion, "tasks_in": len(tasks), "tasks": counts,
			"baseline_grades_ignored": len(grades) - len(nonBaseline)}, nil
	})
}

// StatsHelp is the manual of kiln-advantages stats.
const StatsHelp = `Prints the reward statistics of a grades version without writing anything:
totals, pass@1 and the unbiased pass@k for k up to the samples per task, the
fraction of tasks whose group advantages are all 0, and one line per task
(group_index) with its rollouts, gradeable samples, passes, reward mean and
pass rate (docs/advantages.md §5). Grades not about the patch (infra_error,
aborted, no_grading) are counted as rollouts and enter no rate; baseline
grades are statistics of the empty patch, shown like any other.

Example:
   kiln-advantages stats --grades grades/step-3`

// StatsCommand is kiln-advantages stats.
func StatsCommand(env *stagecmd.Env) *cli.Command {
	var grades string
	return &cli.Command{
		Name:        "stats",
		Usage:       "print a grades version's reward statistics and pass@k",
		Description: StatsHelp,
		Flags: []cli.Flag{
			stagecmd.StoreFlag(),
			&cli.StringFlag{Name: "grades", Value: "grades", Destination: &grades, Usage: "grades dataset (name or name@version)"},
		},
		Action: func(c *cli.Context) error {
			if c.NArg() != 0 {
				return stagecmd.Usagef("kiln-advantages stats takes no arguments, got %q", c.Args().First())
			}
			st, err := stagecmd.OpenStore(c)
			if err != nil {
				return err
			}
			return Stats(c.Context, env.Stdout, st, grades)
		},
	}
}

// Stats prints the statistics of the grades version ref names.
func Stats(ctx context.Context, w io.Writer, st store.Store, ref string) error {
	refs, err := stagecmd.ResolveInputs(ctx, st, []string{ref}, dataset.Part{})
	if err != nil {
		return err
	}
	gv, err := dataset.OpenKind(ctx, st, refs[0], records.GradesKind(), "--grades")
	if err != nil {
		return err
	}
	grades, err := ReadGrades(ctx, gv)
	if err != nil {
		return err
	}
	fmt.Fprintf(w, "grades %s\n", gv.Ref())
	Summarize(grades).Print(w)
	return nil
}
