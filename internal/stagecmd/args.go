package stagecmd

import (
	"strings"
	"unicode"
	"unicode/utf8"

	"github.com/urfave/cli/v2"
)

// Reorder rewrites a command line so that the flag library (which stops
// at the first positional argument) accepts flags and arguments in any
// order, and global flags before or after the subcommand: every flag moves
// to the deepest command of the command path that defines it (a global
// flag given before the subcommand reaches a subcommand that defines it
// too), and the positional arguments go last. It knows which flags take a
// value (the next word, unless written --flag=value) from their
// definitions; an unknown flag stays where it is, for the library to
// report. Everything after "--" is positional, and stays so. args[0] is
// the program name.
//
//	kiln show tasks/mimo --rows 2          -> kiln show --rows 2 tasks/mimo
//	kiln --store S ls                      -> kiln ls --store S
//	kiln forget NAME --keep-last 3 -n      -> kiln forget --keep-last 3 -n NAME
func Reorder(app *cli.App, args []string) []string {
	if len(args) == 0 {
		return args
	}
	type level struct {
		name  string // "" for the app
		flags []cli.Flag
		cmds  []*cli.Command
		skip  bool // SkipFlagParsing: everything after the name is positional
		words []string
	}
	path := []*level{{flags: app.Flags, cmds: app.Commands}}
	var flags []flagWords
	var positional, rest []string
	dashdash := false
	for i := 1; i < len(args); i++ {
		a := args[i]
		leaf := path[len(path)-1]
		if leaf.skip {
			positional = append(positional, args[i:]...)
			break
		}
		if a == "--" {
			dashdash, rest = true, args[i+1:]
			break
		}
		if name, inline, ok := flagName(a); ok {
			var f cli.Flag
			for j := len(path) - 1; j >= 0 && f == nil; j-- {
				f = lookupFlag(path[j].flags, name)
			}
			fl := flagWords{name: name, seen: len(path) - 1, words: []string{a}}
			if f != nil && !inline && takesValue(f) && i+1 < len(args) {
				i++
				fl.words = append(fl.words, args[i])
			}
			flags = append(flags, fl)
			continue
		}
		if len(positional) == 0 {
			if c := findCommand(leaf.cmds, a); c != nil {
				path = append(path, &level{name: a, flags: c.Flags, cmds: c.Subcommands, skip: c.SkipFlagParsing})
				continue
			}
		}
		positional = append(positional, a)
	}
	// Each flag goes to the deepest command of the whole path defining it;
	// an unknown one stays where it was given.
	for _, fl := range flags {
		at := path[fl.seen]
		for j := len(path) - 1; j >= 0; j-- {
			if lookupFlag(path[j].flags, fl.name) != nil {
				at = path[j]
				break
			}
		}
		at.words = append(at.words, fl.words...)
	}
	out := []string{args[0]}
	for _, l := range path {
		if l.name != "" {
			out = append(out, l.name)
		}
		out = append(out, l.words...)
	}
	if path[len(path)-1].skip {
		return append(out, positional...)
	}
	needDashDash := dashdash
	for _, p := range positional {
		needDashDash = needDashDash || strings.HasPrefix(p, "-")
	}
	if needDashDash {
		out = append(out, "--")
	}
	out = append(out, positional...)
	return append(out, rest...)
}

// flagWords is a flag as given (with its value word, if separate) and the
// depth of the command path where it was given.
type flagWords struct {
	name  string
	seen  int
	words []string
}

// SplitCommand finds the first word of args (args[0] is the program)
// that is not a flag of app or a flag's value: the subcommand (or the
// stage kiln dispatches to). It returns the flags before it and the words
// after it; name is "" when there is none.
func SplitCommand(app *cli.App, args []string) (flags []string, name string, rest []string) {
	for i := 1; i < len(args); i++ {
		a := args[i]
		if a == "--" {
			return args[1:i], "", args[i+1:]
		}
		if n, inline, ok := flagName(a); ok {
			if f := lookupFlag(app.Flags, n); f != nil && !inline && takesValue(f) {
				i++
			}
			continue
		}
		return args[1:i], a, args[i+1:]
	}
	return args[1:], "", nil
}

// flagName returns the name of a word that is a flag (-x, --name,
// --name=value); a lone "-", or "-" before a digit (a negative number),
// is not one.
func flagName(a string) (name string, inline, ok bool) {
	if len(a) < 2 || a[0] != '-' {
		return "", false, false
	}
	s := strings.TrimPrefix(strings.TrimPrefix(a, "-"), "-")
	if r, _ := utf8.DecodeRuneInString(s); !unicode.IsLetter(r) {
		return "", false, false
	}
	name, _, inline = strings.Cut(s, "=")
	return name, inline, true
}

// lookupFlag finds the flag named name (or its alias) among flags, and the
// help flag the library adds to every command.
func lookupFlag(flags []cli.Flag, name string) cli.Flag {
	for _, f := range flags {
		for _, n := range f.Names() {
			if n == name {
				return f
			}
		}
	}
	if name == "help" || name == "h" {
		return cli.HelpFlag
	}
	return nil
}

// takesValue reports whether a flag reads the next word as its value
// (every kind but a bool).
func takesValue(f cli.Flag) bool {
	if d, ok := f.(cli.DocGenerationFlag); ok {
		return d.TakesValue()
	}
	return false
}

func findCommand(cmds []*cli.Command, name string) *cli.Command {
	for _, c := range cmds {
		if c.HasName(name) {
			return c
		}
	}
	return nil
}
