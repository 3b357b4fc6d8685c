// Command kiln-rollout runs agents and records their trajectories; today it
// assembles trajectories from saved turn records ("kiln rollout assemble").
package main

import (
	"os"

	"github.com/urfave/cli/v2"

	"github.com/kilnrl/kiln/internal/stagecmd"
	"github.com/kilnrl/kiln/stages/rollout"
)

func main() {
	env := &stagecmd.Env{Stdout: os.Stdout, Stderr: os.Stderr, Log: stagecmd.NewLogger(os.Stderr, false)}
	app := env.App(&cli.App{
		Name:     "kiln-rollout",
		Usage:    "turn agent sessions into token-exact training segments",
		Commands: rollout.Commands(env),
	})
	os.Exit(stagecmd.Main(app, os.Args, os.Stderr))
}
