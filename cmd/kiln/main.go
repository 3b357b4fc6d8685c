// Command kiln manages kiln datasets (ls, show, log, export, import, gc,
// verify, cat, forget) and runs the other kiln binaries git-style: "kiln
// convert" is "kiln-convert".
package main

import (
	"fmt"
	"os"

	"github.com/kilnrl/kiln/internal/kilncmd"
	"github.com/kilnrl/kiln/internal/stagecmd"
)

func main() { os.Exit(run()) }

// run is kiln on os.Args: a stage's name (after any global flags) runs its
// binary, with the global flags passed on; anything else is a dataset
// command.
func run() int {
	env := &stagecmd.Env{Stdout: os.Stdout, Stderr: os.Stderr, Log: stagecmd.NewLogger(os.Stderr, false)}
	app := kilncmd.App(env)
	globals, name, rest := stagecmd.SplitCommand(app, os.Args)
	isStage := func(n string) bool {
		for _, s := range kilncmd.Stages() {
			if s.Name == n {
				return true
			}
		}
		return app.Command(n) == nil
	}
	if (name == "help" || name == "h") && len(rest) > 0 && isStage(rest[0]) {
		// "kiln help convert" is "kiln-convert --help", and "kiln help
		// convert mimo" "kiln-convert help mimo".
		if path := stagecmd.Dispatch("kiln", rest[0]); path != "" {
			args := append([]string{path}, globals...)
			if len(rest) == 1 {
				args = append(args, "--help")
			} else {
				args = append(append(args, "help"), rest[1:]...)
			}
			return execStage(path, args)
		}
	}
	if name != "" && name[0] != '-' && isStage(name) {
		if path := stagecmd.Dispatch("kiln", name); path != "" {
			return execStage(path, append(append([]string{path}, globals...), rest...))
		}
		if app.Command(name) == nil {
			fmt.Fprintf(os.Stderr, "kiln: %q is not a kiln command, and no kiln-%s binary is beside kiln or on PATH; see kiln --help\n", name, name)
			return stagecmd.ExitUsage
		}
	}
	return stagecmd.Main(app, os.Args, os.Stderr)
}

func execStage(path string, args []string) int {
	err := stagecmd.Exec(path, args)
	fmt.Fprintf(os.Stderr, "kiln: running %s: %v\n", path, err)
	return stagecmd.ExitFailure
}
