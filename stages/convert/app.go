package convert

import (
	"github.com/urfave/cli/v2"

	"github.com/kilnrl/kiln/internal/stagecmd"
)

// App is the kiln-convert binary on env.
func App(env *stagecmd.Env) *cli.App {
	return env.App(&cli.App{
		Name:     "kiln-convert",
		Usage:    "convert coding-RL datasets into versioned tasks",
		Commands: Commands(env),
	})
}
