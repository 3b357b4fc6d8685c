// Command kiln-advantages turns trajectories and grades into per-segment
// advantages with per-rollout statistics, selects learnable tasks and
// prints grade statistics (see stages/advantages).
package main

import (
	"os"

	"github.com/urfave/cli/v2"

	"github.com/kilnrl/kiln/internal/stagecmd"
	"github.com/kilnrl/kiln/stages/advantages"
)

func main() {
	env := &stagecmd.Env{Stdout: os.Stdout, Stderr: os.Stderr, Log: stagecmd.NewLogger(os.Stderr, false)}
	app := stagecmd.CommonApp(&cli.App{
		Name:        "kiln-advantages",
		Usage:       "per-segment advantages from per-rollout group statistics",
		Description: advantages.Help,
		Flags:       advantages.Flags(),
		Commands:    advantages.Commands(env),
		Action:      func(c *cli.Context) error { return advantages.Action(c, env) },
	}, os.Stdout, os.Stderr)
	os.Exit(stagecmd.Main(app, os.Args, os.Stderr))
}
