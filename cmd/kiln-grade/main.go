// Command kiln-grade grades agent patches with the tasks' official tests in
// fresh sandboxes and writes a grades dataset (see stages/grade).
package main

import (
	"os"

	"github.com/urfave/cli/v2"

	"github.com/kilnrl/kiln/stages/grade"
	"github.com/kilnrl/kiln/stages/stage"
)

func main() {
	env := &stage.Env{Stdout: os.Stdout, Stderr: os.Stderr, Log: stage.NewLogger(os.Stderr, false)}
	app := stage.CommonApp(&cli.App{
		Name:        "kiln-grade",
		Usage:       "grade patches with the tasks' official tests in fresh sandboxes",
		Description: grade.Help,
		Flags:       grade.Flags(),
		Action:      func(c *cli.Context) error { return grade.Action(c, env) },
	}, os.Stdout, os.Stderr)
	os.Exit(stage.Main(app, os.Args, os.Stderr))
}
