// Command kiln-grade grades agent patches with the tasks' official tests in
// fresh sandboxes and writes a grades dataset (see stages/grade).
package main

import (
	"os"

	"github.com/urfave/cli/v2"

	"github.com/kilnrl/kiln/internal/stagecmd"
	"github.com/kilnrl/kiln/stages/grade"
)

func main() {
	env := &stagecmd.Env{Stdout: os.Stdout, Stderr: os.Stderr, Log: stagecmd.NewLogger(os.Stderr, false)}
	app := env.App(&cli.App{
		Name:        "kiln-grade",
		Usage:       "grade patches with the tasks' official tests in fresh sandboxes",
		Description: grade.Help,
		Flags:       grade.Flags(),
		Action:      func(c *cli.Context) error { return grade.Action(c, env) },
	})
	os.Exit(stagecmd.Main(app, os.Args, os.Stderr))
}
