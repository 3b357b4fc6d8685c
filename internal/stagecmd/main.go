package stagecmd

import (
	"context"
	"errors"
	"fmt"
	"io"
	"log/slog"
	"os"
	"os/exec"
	"os/signal"
	"path/filepath"
	"syscall"

	"github.com/urfave/cli/v2"
)

// Env is what a binary's commands share: their output streams and logger.
// Commands receive it from their constructor, never from globals, so tests
// run them in-process with captured output.
type Env struct {
	Stdout, Stderr io.Writer
	Log            *slog.Logger
	// Hook is passed to dataset writers (tests kill writers at its points).
	Hook func(point string)
}

// Main runs app with a context cancelled by SIGINT/SIGTERM, prints a failure
// as one "name: error" line on stderr, and returns the exit status.
func Main(app *cli.App, args []string, stderr io.Writer) int {
	ctx, stop := signal.NotifyContext(context.Background(), os.Interrupt, syscall.SIGTERM)
	defer stop()
	app.ExitErrHandler = func(*cli.Context, error) {} // exit codes are ours
	err := app.RunContext(ctx, args)
	if err == nil {
		return ExitOK
	}
	code := ExitCode(err)
	var ec cli.ExitCoder
	if errors.As(err, &ec) && code == ExitFailure {
		code = ec.ExitCode()
	}
	fmt.Fprintf(stderr, "%s: %v\n", app.Name, err)
	return code
}

// Dispatch finds the binary for a subcommand git-style: "kiln convert ..."
// runs "kiln-convert ...", looked up beside the running binary first, then
// on PATH. It returns "" when there is none.
func Dispatch(umbrella, sub string) string {
	name := umbrella + "-" + sub
	if self, err := os.Executable(); err == nil {
		p := filepath.Join(filepath.Dir(self), name)
		if fi, err := os.Stat(p); err == nil && fi.Mode().IsRegular() && fi.Mode()&0o111 != 0 {
			return p
		}
	}
	if p, err := exec.LookPath(name); err == nil {
		return p
	}
	return ""
}

// Exec replaces the process with path, passing args (args[0] included) and
// the environment; it returns only on failure.
func Exec(path string, args []string) error {
	return syscall.Exec(path, args, os.Environ())
}

// CommonApp fills what every kiln binary's app shares.
func CommonApp(app *cli.App, stdout, stderr io.Writer) *cli.App {
	app.Writer, app.ErrWriter = stdout, stderr
	app.EnableBashCompletion = true
	app.Version = Build()
	app.CustomAppHelpTemplate = cli.AppHelpTemplate + "\n" + ExitStatusHelp + "\n"
	for _, c := range app.Commands {
		setHelp(c)
	}
	return app
}

func setHelp(c *cli.Command) {
	if c.CustomHelpTemplate == "" {
		c.CustomHelpTemplate = cli.CommandHelpTemplate + "\n" + ExitStatusHelp + "\n"
	}
	for _, s := range c.Subcommands {
		setHelp(s)
	}
}
