package stagecmd

import (
	"bytes"
	"strings"
	"testing"

	"github.com/stretchr/testify/assert"
	"github.com/urfave/cli/v2"
)

// reorderApp has global flags, a command group and a command that skips
// flag parsing.
func reorderApp() *cli.App {
	leaf := &cli.Command{Name: "show", Aliases: []string{"s"}, Flags: []cli.Flag{
		StoreFlag(), &cli.IntFlag{Name: "rows"}, &cli.BoolFlag{Name: "dry-run", Aliases: []string{"n"}},
		&cli.StringSliceFlag{Name: "ids"},
	}}
	return &cli.App{Name: "kiln", Flags: []cli.Flag{StoreFlag(), QuietFlag(), LogFormatFlag()}, Commands: []*cli.Command{
		leaf,
		{Name: "grp", Flags: []cli.Flag{&cli.StringFlag{Name: "mid"}}, Subcommands: []*cli.Command{
			{Name: "leaf", Flags: []cli.Flag{&cli.StringFlag{Name: "x"}}},
		}},
		{Name: "raw", SkipFlagParsing: true},
	}}
}

func TestReorder(t *testing.T) {
	cases := []struct{ in, want string }{
		// Flags after positional arguments.
		{"show tasks/mimo --rows 2", "show --rows 2 tasks/mimo"},
		{"show tasks/mimo --rows=2 -n", "show --rows=2 -n tasks/mimo"},
		{"s a --ids x b --ids y", "s --ids x --ids y a b"},
		// A global flag before the subcommand reaches the command defining it;
		// one only the app defines goes up to it.
		{"--store S show x", "show --store S x"},
		{"show x -q --log-format json", "-q --log-format json show x"},
		{"-q show --store=S x", "-q show --store=S x"},
		// Nested commands: each flag to the deepest command defining it.
		{"grp leaf a --x 1 --mid 2 --store S", "--store S grp --mid 2 leaf --x 1 a"},
		// A value that looks like a positional argument, or like a flag.
		{"show --rows 2 x", "show --rows 2 x"},
		{"show --store -weird x", "show --store -weird x"},
		// Unknown flags stay where they are (the library reports them) and do
		// not take a value.
		{"show x --bogus y", "show --bogus x y"},
		// "--" ends the flags: what follows stays positional.
		{"show --rows 2 -- --not-a-flag", "show --rows 2 -- --not-a-flag"},
		{"show a -- -b --rows 3", "show -- a -b --rows 3"},
		// Negative numbers and "-" are arguments.
		{"show -1 --rows 2", "show --rows 2 -- -1"},
		{"show - --rows 2", "show --rows 2 -- -"},
		// A word after a positional argument is no subcommand (and --rows,
		// unknown where it is, takes no value).
		{"bogus show --rows 2", "--rows bogus show 2"},
		// A command that parses no flags gets its words as they are.
		{"--store S raw --x y z", "--store S raw --x y z"},
		{"", ""},
	}
	for _, c := range cases {
		t.Run(c.in, func(t *testing.T) {
			in := append([]string{"kiln"}, strings.Fields(c.in)...)
			want := append([]string{"kiln"}, strings.Fields(c.want)...)
			assert.Equal(t, want, Reorder(reorderApp(), in))
		})
	}
}

func TestSplitCommand(t *testing.T) {
	cases := []struct{ in, flags, name, rest string }{
		{"--store S -q convert mimo --data d", "--store S -q", "convert", "mimo --data d"},
		{"--store=S convert", "--store=S", "convert", ""},
		{"convert --help", "", "convert", "--help"},
		{"-q", "-q", "", ""},
		{"-- ls", "", "", "ls"},
	}
	for _, c := range cases {
		t.Run(c.in, func(t *testing.T) {
			flags, name, rest := SplitCommand(reorderApp(), append([]string{"kiln"}, strings.Fields(c.in)...))
			assert.Equal(t, strings.Fields(c.flags), append([]string{}, flags...))
			assert.Equal(t, c.name, name)
			assert.Equal(t, strings.Fields(c.rest), append([]string{}, rest...))
		})
	}
}

// TestGlobalFlagsAnywhere runs an Env.App command with the global flags
// before and after the subcommand and after its argument.
func TestGlobalFlagsAnywhere(t *testing.T) {
	for _, args := range [][]string{
		{"--store", "S", "-q", "-v", "--log-format", "json", "run", "arg"},
		{"run", "arg", "--store", "S", "-q", "-v", "--log-format", "json"},
		{"-q", "run", "--log-format=json", "arg", "-v", "--store=S"},
	} {
		t.Run(strings.Join(args, " "), func(t *testing.T) {
			var out, errb bytes.Buffer
			env := &Env{Stdout: &out, Stderr: &errb, Log: NewLogger(&errb, false)}
			app := env.App(&cli.App{Name: "kiln-x", Commands: []*cli.Command{{
				Name: "run", Flags: []cli.Flag{StoreFlag()},
				Action: func(c *cli.Context) error {
					env.Log.Debug("hidden by --quiet")
					env.Log.Warn("shown", "store", c.String("store"), "arg", c.Args().First())
					Fprintln(c, "quiet", env.Quiet)
					return nil
				},
			}}})
			code := Main(app, append([]string{"kiln-x"}, args...), &errb)
			assert.Equal(t, ExitOK, code, errb.String())
			assert.Equal(t, "quiet true\n", out.String())
			assert.Contains(t, errb.String(), `"level":"WARN","msg":"shown","store":"S","arg":"arg"`)
			assert.NotContains(t, errb.String(), "hidden")
		})
	}
}

func TestVersionAndVerbose(t *testing.T) {
	var out, errb bytes.Buffer
	env := &Env{Stdout: &out, Stderr: &errb, Log: NewLogger(&errb, false)}
	app := env.App(&cli.App{Name: "kiln-x", Action: func(c *cli.Context) error { env.Log.Debug("debug line"); return nil }})
	assert.Equal(t, ExitOK, Main(app, []string{"kiln-x", "--version"}, &errb))
	assert.Contains(t, out.String(), "kiln-x version ")
	assert.Equal(t, ExitOK, Main(app, []string{"kiln-x", "-v"}, &errb))
	assert.Contains(t, errb.String(), "level=DEBUG msg=\"debug line\"")
	assert.Equal(t, ExitUsage, Main(app, []string{"kiln-x", "--log-format", "xml"}, &errb))
	assert.Contains(t, errb.String(), `--log-format "xml": want text or json`)
}
