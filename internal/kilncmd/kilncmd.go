// Package kilncmd assembles the kiln command from each package's commands:
// the dataset commands (stages/datasets), the pipeline and Slurm commands
// (pipelines/pipelinecmd), kiln report (stages/report), the two halves of
// kiln verify, and the stage binaries "kiln NAME" runs (cmd/kiln
// dispatches to them). It holds wiring only.
package kilncmd

import (
	"fmt"
	"strings"

	"github.com/urfave/cli/v2"

	"github.com/kilnrl/kiln/internal/stagecmd"
	"github.com/kilnrl/kiln/pipelines/pipelinecmd"
	"github.com/kilnrl/kiln/stages/datasets"
	"github.com/kilnrl/kiln/stages/report"
)

// Stage is a binary kiln runs git-style: "kiln NAME ..." is "kiln-NAME ...".
type Stage struct{ Name, Usage string }

// Stages are the stage binaries kiln dispatches to, as its help lists them.
func Stages() []Stage {
	return []Stage{
		{"convert", "convert coding-RL datasets (MiMo, SWE-bench, SWE-bench Pro, f2p) into tasks"},
		{"images", "import task images into rootfs bundles on a sandbox node (import, gc)"},
		{"rollout", "run coding agents in sandboxes and record rollouts and token-exact trajectories (run, check, adapter, assemble)"},
		{"grade", "grade patches with the tasks' official tests in fresh sandboxes"},
		{"advantages", "per-segment advantages from grades; select learnable tasks; stats"},
		{"train", "train a Hugging Face model on trajectories and advantages (rollout-atomic batches) and commit a checkpoint"},
		{"sync", "publish trained weights as versioned delta-aware data, pull them onto engine hosts, reload the engines"},
	}
}

// App is the kiln binary's commands on env; cmd/kiln adds the dispatch to
// the stage binaries.
func App(env *stagecmd.Env) *cli.App {
	app := &cli.App{
		Name:  "kiln",
		Usage: "versioned datasets and stages for coding-agent RL",
		Description: `kiln is a batch system on files: stage binaries read and write versioned
Arrow/Parquet datasets in a store (a directory, or s3://bucket/prefix).
"kiln NAME ..." runs the binary kiln-NAME (beside kiln, or on PATH), so
"kiln convert --help" is "kiln-convert --help" and "kiln help convert" too.
Flags and arguments go in any order; the global options may come before or
after the command.`,
		Commands: datasets.Commands(env),
	}
	app.Commands = append(app.Commands, pipelinecmd.Commands(env)...)
	app.Commands = append(app.Commands, report.Command(env))
	for _, c := range app.Commands {
		if c.Name == "verify" {
			pipelineVerify(env, c)
		}
	}
	for _, s := range Stages() {
		app.Commands = append(app.Commands, stageCommand(s))
	}
	return env.App(app)
}

// stageCommand lists a stage binary in kiln's help. cmd/kiln runs the
// binary before the app sees the name; this action runs only when there is
// none to run.
func stageCommand(s Stage) *cli.Command {
	return &cli.Command{
		Name: s.Name, Usage: s.Usage, Category: "stages (kiln NAME runs the binary kiln-NAME)",
		SkipFlagParsing: true, HideHelp: true,
		Action: func(c *cli.Context) error {
			return fmt.Errorf("%s: no kiln-%s binary beside kiln or on PATH: build it (make build puts every binary in bin/) or add its directory to PATH", s.Name, s.Name)
		},
	}
}

// pipelineVerify makes "kiln verify" a pipeline verify when its first
// argument is a *.kiln file or --pipeline FILE is given (pipelinecmd.Verify),
// and the dataset verify otherwise.
func pipelineVerify(env *stagecmd.Env, c *cli.Command) {
	var file string
	c.Flags = append(c.Flags, &cli.StringFlag{Name: "pipeline", Destination: &file, Usage: "verify a pipeline target: --pipeline FILE.kiln TARGET"})
	c.ArgsUsage += " | FILE.kiln TARGET [VAR=value...]"
	c.Description += "\n\n" + pipelinecmd.VerifyHelp
	action := c.Action
	c.Action = func(ctx *cli.Context) error {
		f := file
		if f == "" && ctx.NArg() > 0 && strings.HasSuffix(ctx.Args().First(), ".kiln") {
			f = ctx.Args().First()
		}
		if f != "" {
			return pipelinecmd.Verify(ctx, env, f)
		}
		return action(ctx)
	}
}
