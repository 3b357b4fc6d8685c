package grade

import (
	"github.com/urfave/cli/v2"

	"github.com/kilnrl/kiln/internal/stagecmd"
)

// App is the kiln-grade binary on env: one command, no subcommands.
func App(env *stagecmd.Env) *cli.App {
	f := &Flags{}
	return env.App(&cli.App{
		Name:        "kiln-grade",
		Usage:       "grade patches with the tasks' official tests in fresh sandboxes",
		Description: Help,
		Flags:       f.Flags(),
		Action:      func(c *cli.Context) error { return Action(c, env, f) },
	})
}
