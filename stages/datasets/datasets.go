// Package datasets implements the dataset commands of the kiln binary: ls,
// show, log, export, import, gc, verify, cat and forget. Each command is built by a constructor
// that receives the shared Env, so commands hold no global state and tests
// run them in-process with captured output.
package datasets

import (
	"github.com/urfave/cli/v2"

	"github.com/kilnrl/kiln/internal/stagecmd"
)

// Env is what commands share.
type Env = stagecmd.Env

// Commands returns the dataset commands.
func Commands(env *Env) []*cli.Command {
	return []*cli.Command{
		lsCommand(env),
		showCommand(env),
		logCommand(env),
		exportCommand(env),
		importCommand(env),
		gcCommand(env),
		verifyCommand(env),
		catCommand(env),
		forgetCommand(env),
	}
}
