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
	// Stdout carries a command's result (a writing command: the committed
	// reference, its last line). Stderr carries what a person watches:
	// progress reports and end-of-run summaries, and nothing else a script
	// needs, since --quiet discards it (failures are printed by Main on its
	// own stream, warnings go through Log).
	Stdout, Stderr io.Writer
	Log            *slog.Logger
	// Hook is passed to dataset writers (tests kill writers at its points).
	Hook func(point string)
	// Quiet is --quiet (see SetQuiet).
	Quiet bool
}

// SetQuiet makes the commands print only their result on stdout and what
// goes wrong: Stderr discards (no progress, no summaries) and Log passes
// only warnings and errors. Env.App calls it for --quiet, before the
// command runs.
func (e *Env) SetQuiet() {
	if e.Quiet {
		return
	}
	e.Quiet = true
	e.Stderr = io.Discard
	if e.Log != nil {
		e.Log = slog.New(minLevel{e.Log.Handler(), slog.LevelWarn})
	}
}

// minLevel passes the records of h at or above min.
type minLevel struct {
	h   slog.Handler
	min slog.Level
}

func (m minLevel) Enabled(ctx context.Context, l slog.Level) bool {
	return l >= m.min && m.h.Enabled(ctx, l)
}
func (m minLevel) Handle(ctx context.Context, r slog.Record) error { return m.h.Handle(ctx, r) }
func (m minLevel) WithAttrs(as []slog.Attr) slog.Handler           { return minLevel{m.h.WithAttrs(as), m.min} }
func (m minLevel) WithGroup(name string) slog.Handler              { return minLevel{m.h.WithGroup(name), m.min} }

// App is CommonApp on env's streams, with the options every command shares
// wired to env: --quiet (QuietFlag), on the app and on every command, sets
// SetQuiet before the command's action runs.
func (e *Env) App(app *cli.App) *cli.App {
	CommonApp(app, e.Stdout, e.Stderr)
	app.Flags = withQuiet(app.Flags)
	app.Before = e.quietBefore(app.Before)
	for _, c := range app.Commands {
		e.wireCommand(c)
	}
	return app
}

func (e *Env) wireCommand(c *cli.Command) {
	c.Flags = withQuiet(c.Flags)
	c.Before = e.quietBefore(c.Before)
	for _, s := range c.Subcommands {
		e.wireCommand(s)
	}
}

func (e *Env) quietBefore(next cli.BeforeFunc) cli.BeforeFunc {
	return func(c *cli.Context) error {
		if c.Bool("quiet") {
			e.SetQuiet()
		}
		if next != nil {
			return next(c)
		}
		return nil
	}
}

// withQuiet adds QuietFlag to flags unless a flag of that name is there.
func withQuiet(flags []cli.Flag) []cli.Flag {
	for _, f := range flags {
		for _, n := range f.Names() {
			if n == "quiet" {
				return flags
			}
		}
	}
	return append(flags, QuietFlag())
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
