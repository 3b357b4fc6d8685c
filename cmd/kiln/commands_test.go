package main

import (
	"bytes"
	"fmt"
	"go/ast"
	"go/parser"
	"go/token"
	"path/filepath"
	"regexp"
	"sort"
	"strconv"
	"strings"
	"testing"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
	"github.com/urfave/cli/v2"

	"github.com/kilnrl/kiln/internal/kilncmd"
	"github.com/kilnrl/kiln/internal/stagecmd"
	"github.com/kilnrl/kiln/stages/advantages"
	"github.com/kilnrl/kiln/stages/convert"
	"github.com/kilnrl/kiln/stages/grade"
	"github.com/kilnrl/kiln/stages/images"
	"github.com/kilnrl/kiln/stages/rollout"
	kilnsync "github.com/kilnrl/kiln/stages/sync"
	"github.com/kilnrl/kiln/stages/train"
)

// binaries are the apps of every kiln binary, by name.
var binaries = map[string]func(*stagecmd.Env) *cli.App{
	"kiln":            kilncmd.App,
	"kiln-convert":    convert.App,
	"kiln-images":     images.App,
	"kiln-grade":      grade.App,
	"kiln-rollout":    rollout.App,
	"kiln-advantages": advantages.App,
	"kiln-train":      train.App,
	"kiln-sync":       kilnsync.App,
}

// parsed is what a command saw: every flag's value and the arguments.
type parsed struct {
	flags map[string]string
	args  []string
}

// recordingApp builds binary's app with every action replaced by one that
// records what it parsed into *got, and returns it with the command paths
// of its leaves ("" for the app's own action).
func recordingApp(binary string, got *parsed) (*cli.App, map[string]*cli.Command) {
	var out, errb bytes.Buffer
	env := &stagecmd.Env{Stdout: &out, Stderr: &errb, Log: stagecmd.NewLogger(&errb, false)}
	app := binaries[binary](env)
	record := func(flags []cli.Flag) cli.ActionFunc {
		return func(c *cli.Context) error {
			got.flags, got.args = map[string]string{}, c.Args().Slice()
			for _, f := range flags {
				n := f.Names()[0]
				if c.IsSet(n) {
					got.flags[n] = fmt.Sprint(c.Value(n))
				}
			}
			return nil
		}
	}
	leaves := map[string]*cli.Command{}
	if app.Action != nil && len(app.Commands) == 0 || binary == "kiln-advantages" || binary == "kiln-sync" {
		app.Action = record(app.Flags)
		leaves[""] = &cli.Command{Flags: app.Flags}
	}
	var walk func(prefix string, cmds []*cli.Command)
	walk = func(prefix string, cmds []*cli.Command) {
		for _, c := range cmds {
			if c.Name == "help" || c.SkipFlagParsing {
				continue
			}
			if len(c.Subcommands) > 0 {
				walk(prefix+c.Name+" ", c.Subcommands)
				continue
			}
			c.Action = record(c.Flags)
			leaves[prefix+c.Name] = c
		}
	}
	walk("", app.Commands)
	return app, leaves
}

// value is a valid value for a flag of f's type.
func value(f cli.Flag) []string {
	name := "--" + f.Names()[0]
	switch f.(type) {
	case *cli.BoolFlag:
		return []string{name}
	case *cli.IntFlag, *cli.Int64Flag, *cli.UintFlag, *cli.Uint64Flag:
		return []string{name, "3"}
	case *cli.Float64Flag:
		return []string{name, "0.5"}
	case *cli.DurationFlag:
		return []string{name, "90s"}
	}
	if f.Names()[0] == "log-format" {
		return []string{name, "json"}
	}
	return []string{name, "v-" + f.Names()[0]}
}

// TestEveryCommandFlagsAnyOrder gives every flag of every command of every
// binary a value, and checks that the command parses the same whether the
// flags come before the argument, after it, or (the global ones) before
// the command.
func TestEveryCommandFlagsAnyOrder(t *testing.T) {
	global := map[string]bool{"store": true, "quiet": true, "verbose": true, "log-format": true}
	n := 0
	for _, binary := range sortedKeys(binaries) {
		var got parsed
		_, leaves := recordingApp(binary, &got)
		for _, path := range sortedKeys(leaves) {
			cmd := leaves[path]
			t.Run(strings.TrimSpace(binary+" "+path), func(t *testing.T) {
				n++
				var flags, globals, rest, half []string
				for _, f := range cmd.Flags {
					if name := f.Names()[0]; name != "help" && name != "version" {
						flags = append(flags, value(f)...)
						if len(half) < len(flags)/2 {
							half = flags // a whole number of flags
						}
						if global[name] {
							globals = append(globals, value(f)...)
						} else {
							rest = append(rest, value(f)...)
						}
					}
				}
				words := strings.Fields(path)
				orders := map[string][]string{
					"flags first":          concat(words, flags, []string{"ARG"}),
					"flags after the arg":  concat(words, []string{"ARG"}, flags),
					"globals before":       concat(globals, words, rest, []string{"ARG"}),
					"globals after":        concat(words, rest, []string{"ARG"}, globals),
					"flags around the arg": concat(words, half, []string{"ARG"}, flags[len(half):]),
				}
				var first *parsed
				for _, name := range sortedKeys(orders) {
					args := orders[name]
					// A fresh app per run, as a process has: bound flag
					// fields (a slice's above all) keep what a run set.
					got = parsed{}
					app, _ := recordingApp(binary, &got)
					var errb bytes.Buffer
					code := stagecmd.Main(app, append([]string{binary}, args...), &errb)
					require.Equal(t, 0, code, "%s: %q: %s", name, args, errb.String())
					assert.Equal(t, []string{"ARG"}, got.args, name)
					if first == nil {
						first = &parsed{got.flags, got.args}
						for _, f := range cmd.Flags {
							if n := f.Names()[0]; n != "help" && n != "version" {
								assert.Contains(t, got.flags, n, "%s: --%s is set", name, n)
							}
						}
						continue
					}
					assert.Equal(t, first.flags, got.flags, "%s: %q", name, args)
				}
			})
		}
	}
	assert.Greater(t, n, 20, "every command of every binary")
}

// TestHelpExamples parses every example in every command's help (lines
// under "Example:" or "Examples:" that run a kiln binary) with the
// binary's own flags: each names commands and flags that exist, and gives
// every required flag.
func TestHelpExamples(t *testing.T) {
	n := 0
	for _, binary := range sortedKeys(binaries) {
		var got parsed
		app, _ := recordingApp(binary, &got)
		descs := []string{app.Description}
		var walk func(cmds []*cli.Command)
		walk = func(cmds []*cli.Command) {
			for _, c := range cmds {
				descs = append(descs, c.Description)
				walk(c.Subcommands)
			}
		}
		walk(app.Commands)
		for _, d := range descs {
			for _, ex := range examples(d) {
				words := shellWords(ex)
				target := words[0]
				if target == "kiln" && len(words) > 1 {
					if _, ok := binaries["kiln-"+words[1]]; ok {
						target, words = "kiln-"+words[1], words[1:]
					}
				}
				if target != binary {
					continue // parsed with its own binary
				}
				n++
				t.Run(ex, func(t *testing.T) {
					var errb bytes.Buffer
					code := stagecmd.Main(app, append([]string{binary}, words[1:]...), &errb)
					assert.Equal(t, 0, code, "%s", errb.String())
				})
			}
		}
	}
	assert.Greater(t, n, 10, "examples found")
}

var exampleRun = regexp.MustCompile(`^kiln(-[a-z]+)? `)

// examples returns the commands of a help text's Example(s) sections,
// continuation lines joined; pipelines and command substitutions are left
// out.
func examples(desc string) []string {
	var out []string
	in := false
	lines := strings.Split(desc, "\n")
	for i := 0; i < len(lines); i++ {
		l := strings.TrimSpace(lines[i])
		switch {
		case strings.HasPrefix(l, "Example"):
			in = true
			continue
		case l == "":
			in = false
		}
		if !in || !exampleRun.MatchString(l) {
			continue
		}
		for strings.HasSuffix(l, `\`) && i+1 < len(lines) {
			i++
			l = strings.TrimSuffix(l, `\`) + " " + strings.TrimSpace(lines[i])
		}
		if !strings.ContainsAny(l, "|$") {
			out = append(out, l)
		}
	}
	return out
}

// shellWords splits a command line on blanks, honouring single and double
// quotes.
func shellWords(s string) []string {
	var words []string
	var w strings.Builder
	quote, inWord := rune(0), false
	for _, r := range s {
		switch {
		case quote != 0 && r == quote:
			quote = 0
		case quote != 0:
			w.WriteRune(r)
		case r == '\'' || r == '"':
			quote, inWord = r, true
		case r == ' ' || r == '\t':
			if inWord {
				words, inWord = append(words, w.String()), false
				w.Reset()
			}
		default:
			w.WriteRune(r)
			inWord = true
		}
	}
	if inWord {
		words = append(words, w.String())
	}
	return words
}

func concat(parts ...[]string) []string {
	var out []string
	for _, p := range parts {
		out = append(out, p...)
	}
	return out
}

func sortedKeys[V any](m map[string]V) []string {
	keys := make([]string, 0, len(m))
	for k := range m {
		keys = append(keys, k)
	}
	sort.Strings(keys)
	return keys
}

// TestFlagLookupsNamed checks every flag read by name (c.String("x"),
// c.IsSet("x"), ... on a *cli.Context called c) in the stages and the
// shared plumbing against the flags the binaries define: the library
// returns the zero value for a name no flag has, so a misspelt lookup
// would read "" or 0 without a word. Most commands bind their flags to
// fields instead; this keeps the rest honest.
func TestFlagLookupsNamed(t *testing.T) {
	defined := map[string]bool{}
	for _, binary := range sortedKeys(binaries) {
		var got parsed
		app, _ := recordingApp(binary, &got)
		var walk func(flags []cli.Flag, cmds []*cli.Command)
		walk = func(flags []cli.Flag, cmds []*cli.Command) {
			for _, f := range flags {
				for _, n := range f.Names() {
					defined[n] = true
				}
			}
			for _, c := range cmds {
				walk(c.Flags, c.Subcommands)
			}
		}
		walk(app.Flags, app.Commands)
	}
	getters := map[string]bool{"String": true, "Bool": true, "Int": true, "Int64": true, "Uint": true, "Uint64": true,
		"Float64": true, "Duration": true, "StringSlice": true, "IntSlice": true, "IsSet": true, "Value": true, "Generic": true}
	files, err := filepath.Glob("../../stages/*/*.go")
	require.NoError(t, err)
	more, err := filepath.Glob("../../internal/stagecmd/*.go")
	require.NoError(t, err)
	n := 0
	for _, path := range append(files, more...) {
		if strings.HasSuffix(path, "_test.go") {
			continue
		}
		f, err := parser.ParseFile(token.NewFileSet(), path, nil, 0)
		require.NoError(t, err)
		ast.Inspect(f, func(node ast.Node) bool {
			call, ok := node.(*ast.CallExpr)
			if !ok || len(call.Args) != 1 {
				return true
			}
			sel, ok := call.Fun.(*ast.SelectorExpr)
			if !ok || !getters[sel.Sel.Name] {
				return true
			}
			if id, ok := sel.X.(*ast.Ident); !ok || id.Name != "c" {
				return true
			}
			lit, ok := call.Args[0].(*ast.BasicLit)
			if !ok || lit.Kind != token.STRING {
				return true
			}
			name, _ := strconv.Unquote(lit.Value)
			n++
			assert.True(t, defined[name], "%s: c.%s(%q) names no flag of any binary", path, sel.Sel.Name, name)
			return true
		})
	}
	t.Logf("%d flag lookups by name checked", n)
}
