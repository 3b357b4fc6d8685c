package advantages

import (
	"github.com/urfave/cli/v2"

	"github.com/kilnrl/kiln/internal/stagecmd"
)

// App is the kiln-advantages binary on env: the advantages run itself,
// and the select and stats subcommands.
func App(env *stagecmd.Env) *cli.App {
	f := &Flags{}
	return env.App(&cli.App{
		Name:        "kiln-advantages",
		Usage:       "per-segment advantages from per-rollout group statistics",
		Description: Help,
		Flags:       f.Flags(),
		Commands:    Commands(env),
		Action:      func(c *cli.Context) error { return Action(c, env, f) },
	})
}
