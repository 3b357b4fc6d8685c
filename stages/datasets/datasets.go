// Package datasets implements the dataset commands of the kiln binary: ls,
// show, log, export, import and gc. Each command is built by a constructor
// that receives the shared Env, so commands hold no global state and tests
// run them in-process with captured output.
package datasets

import (
	"io"
	"log/slog"

	"github.com/urfave/cli/v2"
)

// Env is what commands share: their output streams and logger.
type Env struct {
	Stdout, Stderr io.Writer
	Log            *slog.Logger
	// Hook is passed to dataset writers (tests kill writers at its points).
	Hook func(point string)
}

// Commands returns the dataset commands.
func Commands(env *Env) []*cli.Command {
	return []*cli.Command{
		lsCommand(env),
		showCommand(env),
		logCommand(env),
		exportCommand(env),
		importCommand(env),
		gcCommand(env),
	}
}
