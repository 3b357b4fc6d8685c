// Command kiln-rollout runs agents and records their trajectories; today it
// assembles trajectories from saved turn records ("kiln rollout assemble").
package main

import (
	"os"

	"github.com/urfave/cli/v2"

	"github.com/kilnrl/kiln/stages/rollout"
	"github.com/kilnrl/kiln/stages/stage"
)

func main() {
	env := &stage.Env{Stdout: os.Stdout, Stderr: os.Stderr, Log: stage.NewLogger(os.Stderr, false)}
	app := stage.CommonApp(&cli.App{
		Name:     "kiln-rollout",
		Usage:    "turn agent sessions into token-exact training segments",
		Commands: rollout.Commands(env),
	}, os.Stdout, os.Stderr)
	os.Exit(stage.Main(app, os.Args, os.Stderr))
}
