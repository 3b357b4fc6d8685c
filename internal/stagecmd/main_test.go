package stagecmd

import (
	"bytes"
	"context"
	"errors"
	"strings"
	"syscall"
	"testing"

	"github.com/stretchr/testify/assert"
	"github.com/urfave/cli/v2"
)

// testApp is a binary with a flagged command, a command group and a
// command that runs until a signal cancels it.
func testApp(stdout, stderr *bytes.Buffer) *cli.App {
	return CommonApp(&cli.App{Name: "kiln-x", Commands: []*cli.Command{
		{Name: "run", Flags: []cli.Flag{&cli.StringFlag{Name: "data", Required: true}, &cli.IntFlag{Name: "j"}},
			Action: func(c *cli.Context) error { Fprintln(c, "ran", c.String("data")); return nil }},
		{Name: "grp", Subcommands: []*cli.Command{
			{Name: "leaf", Usage: "the leaf", Action: func(c *cli.Context) error { Fprintln(c, "leaf"); return nil }},
		}},
		{Name: "wait", Action: func(c *cli.Context) error {
			sig := syscall.SIGINT
			if c.Args().First() == "term" {
				sig = syscall.SIGTERM
			}
			syscall.Kill(syscall.Getpid(), sig)
			<-c.Context.Done()
			// Whatever the cancellation surfaced as, not only context.Canceled.
			return errors.New("store stopped reading")
		}},
	}}, stdout, stderr)
}

func TestMainUsageAndHelp(t *testing.T) {
	cases := []struct {
		args   []string
		code   int
		stdout string // a substring of stdout
		stderr string // the one line of stderr ("" = none)
	}{
		{[]string{"run", "--data", "d"}, ExitOK, "ran d", ""},
		{[]string{"run", "--data", "d", "--bogus"}, ExitUsage, "", "kiln-x: flag provided but not defined: -bogus; see `kiln-x run --help`"},
		{[]string{"--bogus"}, ExitUsage, "", "kiln-x: flag provided but not defined: -bogus; see `kiln-x --help`"},
		{[]string{"run", "--j", "x", "--data", "d"}, ExitUsage, "", "see `kiln-x run --help`"},
		{[]string{"run"}, ExitUsage, "", "kiln-x: missing required flag --data; see `kiln-x run --help`"},
		{[]string{"nope"}, ExitUsage, "", "kiln-x: \"nope\" is not a command of kiln-x; see `kiln-x --help`"},
		{[]string{"grp", "nope"}, ExitUsage, "", "kiln-x: \"nope\" is not a command of kiln-x grp; see `kiln-x grp --help`"},
		{[]string{"grp", "leaf"}, ExitOK, "leaf", ""},
		{[]string{"help"}, ExitOK, "COMMANDS:", ""},
		{[]string{"--help"}, ExitOK, "EXIT STATUS:", ""},
		{[]string{"help", "run"}, ExitOK, "--data", ""},
		{[]string{"run", "--help"}, ExitOK, "--data", ""},
		{[]string{"help", "grp", "leaf"}, ExitOK, "the leaf", ""},
		{[]string{"h", "grp"}, ExitOK, "leaf", ""},
		{[]string{"help", "nope"}, ExitUsage, "", "kiln-x: help: \"nope\" is not a command of kiln-x; see `kiln-x --help`"},
		{[]string{"help", "grp", "nope"}, ExitUsage, "", "kiln-x: help: \"nope\" is not a command of kiln-x grp; see `kiln-x grp --help`"},
	}
	for _, c := range cases {
		t.Run(strings.Join(c.args, " "), func(t *testing.T) {
			var out, errb bytes.Buffer
			code := Main(testApp(&out, &errb), append([]string{"kiln-x"}, c.args...), &errb)
			assert.Equal(t, c.code, code, "stderr: %s", errb.String())
			assert.Contains(t, out.String(), c.stdout)
			if c.stderr == "" {
				assert.Empty(t, errb.String())
				return
			}
			assert.Equal(t, 1, strings.Count(errb.String(), "\n"), "one line: %q", errb.String())
			assert.Contains(t, errb.String(), c.stderr)
			assert.NotContains(t, out.String(), "USAGE:", "usage errors do not print the manual")
		})
	}
}

func TestMainSignal(t *testing.T) {
	for _, sig := range []string{"int", "term"} {
		t.Run(sig, func(t *testing.T) {
			var out, errb bytes.Buffer
			code := Main(testApp(&out, &errb), []string{"kiln-x", "wait", sig}, &errb)
			assert.Equal(t, ExitCancelled, code)
			assert.Contains(t, errb.String(), "kiln-x: interrupted (")
			assert.Contains(t, errb.String(), "kept in the store")
			assert.Contains(t, errb.String(), "rerun the same command to finish")
			assert.NotContains(t, errb.String(), "store stopped reading")
		})
	}
}

func TestInterruptedMessage(t *testing.T) {
	ctx, cancel := context.WithCancelCause(context.Background())
	cancel(errors.New("terminated signal received"))
	assert.Contains(t, InterruptedMessage(context.Cause(ctx)), "interrupted (terminated signal received)")
}
