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
	"reflect"
	"strings"
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

// App is CommonApp on env's streams, with the global options wired to
// env: --store on the app (StoreFlag; commands that use a store define it
// too), and --quiet, --verbose and --log-format (GlobalFlags) on the app
// and on every command, which set up env's logger and SetQuiet before the
// command's action runs. Main's Reorder lets every one of them be given
// before or after the subcommand.
func (e *Env) App(app *cli.App) *cli.App {
	logw := e.Stderr // where a --verbose or --log-format logger writes
	app.Flags = withFlags(app.Flags, StoreFlag())
	app.Flags = withFlags(app.Flags, GlobalFlags()...)
	app.Before = e.globalBefore(logw, app.Before)
	for _, c := range app.Commands {
		e.wireCommand(c, logw)
	}
	CommonApp(app, e.Stdout, e.Stderr)
	return app
}

func (e *Env) wireCommand(c *cli.Command, logw io.Writer) {
	if c.Name == "help" {
		return
	}
	c.Flags = withFlags(c.Flags, GlobalFlags()...)
	c.Before = e.globalBefore(logw, c.Before)
	for _, s := range c.Subcommands {
		e.wireCommand(s, logw)
	}
}

// globalBefore applies --verbose, --log-format and --quiet to e, then runs
// next. Main's Reorder puts each flag on the deepest command that defines
// it, so one of the levels sees each; a level applies only what is set.
func (e *Env) globalBefore(logw io.Writer, next cli.BeforeFunc) cli.BeforeFunc {
	return func(c *cli.Context) error {
		if c.IsSet("verbose") || c.IsSet("log-format") {
			format := c.String("log-format")
			if format == "" {
				format = "text" // KILN_LOG_FORMAT set but empty
			}
			if format != "text" && format != "json" {
				return Usagef("--log-format %q: want text or json; see `%s --help`", format, helpName(c))
			}
			e.Log = NewLoggerFormat(logw, c.Bool("verbose"), format)
			if e.Quiet {
				e.Log = slog.New(minLevel{e.Log.Handler(), slog.LevelWarn})
			}
		}
		if c.Bool("quiet") {
			e.SetQuiet()
		}
		if next != nil {
			return next(c)
		}
		return nil
	}
}

// withFlags adds each of add to flags unless a flag of its name is there.
func withFlags(flags []cli.Flag, add ...cli.Flag) []cli.Flag {
	for _, a := range add {
		if lookupFlag(flags, a.Names()[0]) == nil || a.Names()[0] == "help" {
			flags = append(flags, a)
		}
	}
	return flags
}

// Main runs app with a context cancelled by SIGINT/SIGTERM, prints a failure
// as one "name: error" line on stderr, and returns the exit status
// (ExitCode). A command that fails after a signal exits ExitCancelled with
// one uniform line, whatever error the cancellation surfaced as (a closed
// pipe, a killed child, context.Canceled): written shards and committed
// versions stay in the store, and a rerun of the same command resumes from
// them. After the first signal a second one kills the process at once.
func Main(app *cli.App, args []string, stderr io.Writer) int {
	ctx, stop := signal.NotifyContext(context.Background(), os.Interrupt, syscall.SIGTERM)
	defer stop()
	go func() {
		<-ctx.Done()
		stop() // the default action again: a second Ctrl-C is not ignored
	}()
	app.ExitErrHandler = func(*cli.Context, error) {} // exit codes are ours
	err := app.RunContext(ctx, Reorder(app, args))
	if err == nil || errors.Is(err, errVersionShown) {
		return ExitOK
	}
	if ctx.Err() != nil { // only a signal cancels ctx before Main returns
		fmt.Fprintf(stderr, "%s: %s\n", app.Name, InterruptedMessage(context.Cause(ctx)))
		return ExitCancelled
	}
	fmt.Fprintf(stderr, "%s: %v\n", app.Name, err)
	return ExitCode(err)
}

// InterruptedMessage is what every binary prints when a signal stopped it.
func InterruptedMessage(cause error) string {
	return fmt.Sprintf("interrupted (%v): what was finished is kept in the store (committed versions, and the finished rows of stages that keep row receipts); rerun the same command to finish, redoing only what no receipt covers", cause)
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

// CommonApp fills what every kiln binary's app shares: help with the exit
// status table, a "help [COMMAND...]" command, and usage errors (an unknown
// flag or command, a missing required flag) returned as one-line
// UsageErrors pointing to --help instead of printing the manual.
func CommonApp(app *cli.App, stdout, stderr io.Writer) *cli.App {
	app.Writer, app.ErrWriter = stdout, stderr
	app.EnableBashCompletion = true
	app.Version = Build()
	// -v is --verbose on every binary: --version has no short form.
	app.HideVersion = true
	app.Flags = withFlags(app.Flags, &cli.BoolFlag{Name: "version", Usage: "print the version"})
	if app.HelpName == "" {
		app.HelpName = app.Name
	}
	app.CustomAppHelpTemplate = cli.AppHelpTemplate + "\n" + ExitStatusHelp + "\n"
	if len(app.Commands) == 0 {
		// A binary without commands: no "command [command options]" slot,
		// no help command, and its flags are just OPTIONS.
		app.HideHelpCommand = true
		if app.UsageText == "" {
			app.UsageText = app.HelpName + " [options]"
			if app.ArgsUsage != "" {
				app.UsageText += " " + app.ArgsUsage
			}
		}
		app.CustomAppHelpTemplate = strings.ReplaceAll(app.CustomAppHelpTemplate, "GLOBAL OPTIONS:", "OPTIONS:")
	}
	app.OnUsageError = onUsageError
	app.Before = versionBefore(requireFlags(app.Flags, app.Before))
	if len(app.Commands) > 0 {
		if app.Action == nil {
			app.Action = unknownCommand(true)
		}
		if app.Command("help") == nil {
			// The library adds --help only along with its own help command.
			app.Commands = append(app.Commands, helpCommand())
			app.Flags = append(app.Flags, cli.HelpFlag)
		}
	}
	for _, c := range app.Commands {
		setHelp(c)
	}
	return app
}

// errVersionShown stops a run after --version printed the version.
var errVersionShown = errors.New("version shown")

// versionBefore prints the version for --version and stops the run.
func versionBefore(next cli.BeforeFunc) cli.BeforeFunc {
	return func(c *cli.Context) error {
		if c.Bool("version") {
			fmt.Fprintf(c.App.Writer, "%s version %s\n", c.App.Name, c.App.Version)
			return errVersionShown
		}
		if next != nil {
			return next(c)
		}
		return nil
	}
}

func setHelp(c *cli.Command) {
	if c.CustomHelpTemplate == "" {
		tmpl := cli.CommandHelpTemplate
		if len(c.Subcommands) > 0 {
			tmpl = cli.SubcommandHelpTemplate // lists the subcommands
		}
		c.CustomHelpTemplate = tmpl + "\n" + ExitStatusHelp + "\n"
	}
	c.OnUsageError = onUsageError
	c.Before = requireFlags(c.Flags, c.Before)
	if len(c.Subcommands) > 0 && c.Action == nil {
		c.Action = unknownCommand(false)
	}
	for _, s := range c.Subcommands {
		setHelp(s)
	}
}

// helpName is how --help is spelled for the running command.
func helpName(c *cli.Context) string {
	if c.Command != nil && c.Command.HelpName != "" {
		return c.Command.HelpName
	}
	return c.App.HelpName
}

// onUsageError turns a flag parsing error into a one-line UsageError.
func onUsageError(c *cli.Context, err error, _ bool) error {
	return Usagef("%s; see `%s --help`", err, helpName(c))
}

// unknownCommand is the action of an app or command that has subcommands:
// a word that names none of them is a usage error; nothing shows the help.
func unknownCommand(root bool) cli.ActionFunc {
	return func(c *cli.Context) error {
		if c.Args().Present() {
			return Usagef("%q is not a command of %s; see `%s --help`", c.Args().First(), helpName(c), helpName(c))
		}
		if root {
			return cli.ShowAppHelp(c)
		}
		return cli.ShowSubcommandHelp(c)
	}
}

// requireFlags checks the flags marked Required itself, before running
// before: the flag library's check prints the whole manual. It clears
// their Required mark so that check finds nothing to do.
func requireFlags(flags []cli.Flag, before cli.BeforeFunc) cli.BeforeFunc {
	var required []cli.Flag
	for _, f := range flags {
		if rf, ok := f.(cli.RequiredFlag); ok && rf.IsRequired() {
			v := reflect.ValueOf(f)
			if v.Kind() == reflect.Pointer && v.Elem().Kind() == reflect.Struct {
				if fv := v.Elem().FieldByName("Required"); fv.IsValid() && fv.Kind() == reflect.Bool && fv.CanSet() {
					fv.SetBool(false)
					required = append(required, f)
				}
			}
		}
	}
	if len(required) == 0 {
		return before
	}
	return func(c *cli.Context) error {
		var missing []string
		for _, f := range required {
			set := false
			for _, n := range f.Names() {
				set = set || c.IsSet(n)
			}
			if !set {
				missing = append(missing, "--"+f.Names()[0])
			}
		}
		if len(missing) > 0 {
			return Usagef("missing required flag %s; see `%s --help`", strings.Join(missing, ", "), helpName(c))
		}
		if before != nil {
			return before(c)
		}
		return nil
	}
}

// helpCommand is "help [COMMAND [SUBCOMMAND...]]": the same as --help after
// the command; an unknown name is a usage error.
func helpCommand() *cli.Command {
	return &cli.Command{
		Name: "help", Aliases: []string{"h"}, ArgsUsage: "[COMMAND [SUBCOMMAND...]]",
		Usage: "show the help of the binary or of a command",
		Action: func(c *cli.Context) error {
			names := c.Args().Slice()
			if len(names) == 0 {
				return cli.ShowAppHelp(c)
			}
			cmds := c.App.Commands
			for i, n := range names {
				var found *cli.Command
				for _, cmd := range cmds {
					if cmd.HasName(n) && cmd.Name != "help" {
						found = cmd
					}
				}
				if found == nil {
					where := strings.Join(append([]string{c.App.HelpName}, names[:i]...), " ")
					return Usagef("help: %q is not a command of %s; see `%s --help`", n, where, where)
				}
				cmds = found.Subcommands
			}
			return c.App.RunContext(c.Context, append(append([]string{c.App.Name}, names...), "--help"))
		},
	}
}

// Run is a binary's main: the app newApp builds on the process's streams,
// run on os.Args by Main; it returns the exit status.
func Run(newApp func(*Env) *cli.App) int {
	env := &Env{Stdout: os.Stdout, Stderr: os.Stderr, Log: NewLogger(os.Stderr, false)}
	return Main(newApp(env), os.Args, os.Stderr)
}
