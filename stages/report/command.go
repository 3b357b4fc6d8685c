package report

import (
	"encoding/json"
	"fmt"
	"os"
	"path/filepath"
	"strings"
	"time"

	"github.com/urfave/cli/v2"

	"github.com/kilnrl/kiln/internal/stagecmd"
)

// Help is kiln report's manual (docs/report.md).
const Help = `Reads a training run from the store alone and writes one self-contained
HTML page (inline CSS, JavaScript and SVG charts drawn by kiln; no CDN, no
request leaves the page, it opens from file:// on a login node with no
network). The run is either a pipeline, PIPELINE.kiln [VAR=value...],
whose steps are its targets as "kiln status --table" finds them (with
the wall time of each), or a list of refs, one step each in the order
given: a rollouts, turns, trajectories, grades, advantages, checkpoints
or weights version, with what it was made from within its step (a
checkpoint's trajectories and advantages, their grades and rollouts, the
weights the rollouts sampled from).

The page shows, per step: pass rate and mean reward (pass@1 and pass@k
where kiln-advantages recorded them), groups, group size and groups with
mixed rewards, the advantage distribution, segments per rollout, prompt,
response and trained tokens, the trainer's loss, clip fraction,
train_rollout_logprob_max_abs_diff, grad norm, entropy and KL, the
weights number sampled from against the latest and the staleness, each
stage's wall time, aborts and grade failures by reason; a per-task ×
step matrix of pass rates; the lineage from the tasks and the base model
to the last step's output; and a rollout browser: each rollout's
conversation (messages, reasoning, tool calls and outputs, the sampled
and trained responses marked), its patch, grading log, reward and
advantage, each step's best and worst one click away.

The page embeds at most --embed-bytes of rollout views (default 4 MiB:
half for each step's best and worst, half for the others in step order);
every other rollout is in its step's file, OUT_files/step-K.html beside
the page (OUT without .html), linked from it. Copy the page with that directory.
The figures are the ones "kiln status --table" prints, computed by the
same code. --json prints the data behind the page instead (one JSON
object, docs/report.md §4) and writes no page; with --out given too it
writes the page and prints the JSON with the page's path and each
rollout's "page": where its view is (#r-STEP-ID in the page, or
OUT_files/step-K.html#r-STEP-ID, relative to the page's directory).

The trackers users already watch get the same per-step figures (every
point the page's charts draw, tagged CHART/SERIES: pass/pass_rate,
loss/loss, wall/rollout, ...): --tensorboard DIR writes them as a
TensorBoard event file in DIR (events.out.tfevents.*.kiln-report, step =
the pipeline step; a rerun replaces it), and --wandb DIR as a wandb run in
offline mode, DIR/wandb/offline-run-*, which "wandb sync" uploads later;
nothing is sent. --wandb runs the trackers' Python (--python, default
$KILN_TRACKERS_PYTHON, else the venv scripts/install-tracker-deps.sh
made, else python3), which must have wandb. Their paths are logged on
stderr; both work with --json too.

What cannot be read is said in the page, not hidden: a step output that
is no longer in the store, a grading log whose attachment was removed, a
step without turns. The last stdout line is the page's path (with --json,
the JSON).

Examples:
   kiln report pipelines/demo.kiln DEMO=/var/tmp/kiln-demo --out demo.html
   kiln report demo/checkpoints/step-1 demo/checkpoints/step-2
   kiln report pipelines/demo.kiln --json | jq '.steps[].figures.pass_rate'
   kiln report pipelines/demo.kiln --tensorboard runs/demo --wandb .

EXIT STATUS:
   0    the page (or the JSON) was written; its path is the last stdout line
   2    bad flags or arguments
   3    a ref names no version in the store
   5    bad input: a ref that is not a run's output, a pipeline with no
        step done
   1    any other failure`

// Command is "kiln report".
func Command(env *stagecmd.Env) *cli.Command {
	var o struct {
		out         string
		json        bool
		embed, logs int
		tensorboard string
		wandb       string
		project     string
		python      string
	}
	return &cli.Command{
		Name:        "report",
		Category:    "pipelines",
		Usage:       "one self-contained HTML page of a training run: curves, a task × step matrix, lineage, a rollout browser",
		ArgsUsage:   "PIPELINE.kiln [VAR=value...] | REF...",
		Description: Help,
		Flags: []cli.Flag{
			stagecmd.StoreFlag(),
			&cli.StringFlag{Name: "out", Value: "report.html", Usage: "the page's `PATH` (the rollouts not in it go to PATH without .html plus _files/, one file a step)", Destination: &o.out},
			&cli.BoolFlag{Name: "json", Usage: "print the data behind the page as one JSON object instead of writing it (with --out: as well, each rollout's page filled)", Destination: &o.json},
			&cli.IntFlag{Name: "embed-bytes", Value: DefaultEmbedBytes, Usage: "at most `N` bytes of rollout views in the page; the rest are files beside it", Destination: &o.embed},
			&cli.IntFlag{Name: "log-bytes", Value: DefaultLogBytes, Usage: "show at most `N` bytes of a grading log (its head and tail)", Destination: &o.logs},
			&cli.StringFlag{Name: "tensorboard", Usage: "also write the per-step figures as a TensorBoard event file in `DIR`", Destination: &o.tensorboard},
			&cli.StringFlag{Name: "wandb", Usage: "also write the per-step figures as an offline wandb run in `DIR`/wandb/ (upload it with wandb sync)", Destination: &o.wandb},
			&cli.StringFlag{Name: "wandb-project", Usage: "the wandb run's `PROJECT` (default: the pipeline's name, else kiln)", Destination: &o.project},
			&cli.StringFlag{Name: "python", Usage: "the `PYTHON` with wandb that --wandb runs (default $KILN_TRACKERS_PYTHON, else the venv of scripts/install-tracker-deps.sh, else python3)", Destination: &o.python},
		},
		Action: func(c *cli.Context) error {
			args := c.Args().Slice()
			if len(args) == 0 {
				return stagecmd.Usagef("report: give a PIPELINE.kiln or refs; see kiln report --help")
			}
			if o.embed < 0 || o.logs <= 0 {
				return stagecmd.Usagef("report: --embed-bytes must be 0 or more and --log-bytes more than 0")
			}
			st, err := stagecmd.OpenExistingStore(c)
			if err != nil {
				return err
			}
			opts := Options{Store: st, Log: env.Log, Environ: os.Environ()}
			if strings.HasSuffix(args[0], ".kiln") {
				opts.Pipeline, opts.Vars = args[0], map[string]string{}
				for _, a := range args[1:] {
					k, v, ok := strings.Cut(a, "=")
					if !ok || k == "" {
						return stagecmd.Usagef("report: %q: after PIPELINE.kiln give only VAR=value arguments", a)
					}
					opts.Vars[k] = v
				}
			} else {
				for _, a := range args {
					if strings.HasSuffix(a, ".kiln") {
						return stagecmd.Usagef("report: %q: give one PIPELINE.kiln, first, or refs only", a)
					}
				}
				opts.Refs = args
			}
			r, err := Gather(c.Context, opts)
			if err != nil {
				return err
			}
			// The trackers first: a failure there leaves no page or JSON
			// that looks like the whole job was done.
			if o.tensorboard != "" {
				p, err := WriteTensorBoard(r, o.tensorboard, time.Now())
				if err != nil {
					return fmt.Errorf("report: --tensorboard %q: %w", o.tensorboard, err)
				}
				env.Log.Info("tensorboard event file written", "path", p, "view", "tensorboard --logdir "+filepath.Dir(p))
			}
			if o.wandb != "" {
				project := o.project
				if project == "" {
					project = r.PipelineName
				}
				if project == "" {
					project = "kiln"
				}
				run, err := WriteWandb(c.Context, r, WandbOptions{Dir: o.wandb, Project: project, Name: runName(r), Python: o.python, Environ: os.Environ()})
				if err != nil {
					return fmt.Errorf("report: %w", err)
				}
				env.Log.Info("wandb offline run written", "path", run, "upload", "wandb sync "+run)
			}
			if o.json && !c.IsSet("out") {
				return printJSON(env, r)
			}
			out, err := filepath.Abs(o.out)
			if err != nil {
				return err
			}
			if err := WriteHTML(c.Context, st, r, HTMLOptions{Out: out, EmbedBytes: o.embed, LogBytes: o.logs}); err != nil {
				return fmt.Errorf("report: writing %q: %w", o.out, err)
			}
			for _, n := range r.Notes {
				env.Log.Warn(n)
			}
			if o.json {
				// With --out the JSON says where the page and each
				// rollout's view are; it holds the page's path.
				r.Page = out
				return printJSON(env, r)
			}
			fmt.Fprintln(env.Stdout, out)
			return nil
		},
	}
}

// runName is a wandb run's display name: the pipeline's name, else the
// report's first and last ref.
func runName(r *Report) string {
	switch {
	case r.PipelineName != "":
		return r.PipelineName
	case len(r.Refs) == 1:
		return r.Refs[0]
	case len(r.Refs) > 1:
		return r.Refs[0] + " .. " + r.Refs[len(r.Refs)-1]
	}
	return "kiln report"
}

// printJSON prints the report as one line of JSON (docs/report.md §4).
func printJSON(env *stagecmd.Env, r *Report) error {
	b, err := json.Marshal(r)
	if err != nil {
		return err
	}
	_, err = fmt.Fprintf(env.Stdout, "%s\n", b)
	return err
}
