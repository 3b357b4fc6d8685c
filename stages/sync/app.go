package sync

import (
	"github.com/urfave/cli/v2"

	"github.com/kilnrl/kiln/internal/stagecmd"
)

// App is the kiln-sync binary on env: the combined publish, pull and
// reload (docs/sync.md §4) as its own action, and each step as a
// subcommand.
func App(env *stagecmd.Env) *cli.App {
	f := &SyncFlags{}
	return env.App(&cli.App{
		Name:        "kiln-sync",
		Usage:       "publish trained weights as versioned delta-aware data, pull them onto engine hosts, reload the engines",
		UsageText:   "kiln-sync --checkpoint REF|DIR --out NAME --to DIR --engine URL... [options]\nkiln-sync command [command options]",
		Description: Help,
		Flags:       f.Flags(),
		Commands:    Commands(env),
		Action:      func(c *cli.Context) error { return SyncAction(c, env, f) },
	})
}

// Commands are the subcommands of kiln-sync.
func Commands(env *stagecmd.Env) []*cli.Command {
	return []*cli.Command{PublishCommand(env), PullCommand(env), ReloadCommand(env)}
}
