package rollout

import (
	"github.com/urfave/cli/v2"

	"github.com/kilnrl/kiln/internal/stagecmd"
)

// App is the kiln-rollout binary on env. Its commands are Commands: a new
// subcommand is one more constructor there, and gets the global flags,
// flag reordering, usage errors and help from env.App.
func App(env *stagecmd.Env) *cli.App {
	return env.App(&cli.App{
		Name:     "kiln-rollout",
		Usage:    "turn agent sessions into token-exact training segments",
		Commands: Commands(env),
	})
}
