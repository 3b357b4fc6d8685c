// Package stagetest runs kiln commands in-process for tests, with captured
// output and the exit status the binary would return.
package stagetest

import (
	"bytes"
	"strings"
	"testing"

	"github.com/urfave/cli/v2"

	"github.com/kilnrl/kiln/internal/stagecmd"
)

// Result is one finished invocation.
type Result struct {
	Stdout, Stderr string
	Code           int
}

// LastLine is the last line of stdout: a writing command's reference.
func (r Result) LastLine() string {
	lines := strings.Split(strings.TrimRight(r.Stdout, "\n"), "\n")
	return lines[len(lines)-1]
}

// Run builds an app from the commands newCommands returns for a fresh Env
// and runs it on args as the binary's main would.
func Run(t testing.TB, newCommands func(*stagecmd.Env) []*cli.Command, args ...string) Result {
	t.Helper()
	var out, errb bytes.Buffer
	env := &stagecmd.Env{Stdout: &out, Stderr: &errb, Log: stagecmd.NewLogger(&errb, false)}
	app := env.App(&cli.App{Name: "kiln", Commands: newCommands(env)})
	code := stagecmd.Main(app, append([]string{"kiln"}, args...), &errb)
	return Result{out.String(), errb.String(), code}
}
