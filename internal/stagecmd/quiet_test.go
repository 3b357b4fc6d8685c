package stagecmd_test

import (
	"errors"
	"fmt"
	"testing"

	"github.com/stretchr/testify/assert"
	"github.com/urfave/cli/v2"

	"github.com/kilnrl/kiln/internal/stagecmd"
	"github.com/kilnrl/kiln/internal/stagecmd/stagetest"
)

// TestQuiet: --quiet (or KILN_QUIET) leaves a writing command's reference
// on stdout and warnings and errors on stderr, and drops progress,
// summaries and info logs, whether it is given before or after the command.
func TestQuiet(t *testing.T) {
	commands := func(env *stagecmd.Env) []*cli.Command {
		return []*cli.Command{{
			Name:  "make",
			Flags: []cli.Flag{&cli.BoolFlag{Name: "fail"}},
			Action: func(c *cli.Context) error {
				prog := stagecmd.NewProgress(env.Stderr, env.Log, "make", "rows", 2)
				prog.Add(2)
				prog.Done()
				fmt.Fprintln(env.Stderr, "summary: 2 rows")
				env.Log.Info("committed", "ref", "out@v1")
				env.Log.Warn("a warning")
				if c.Bool("fail") {
					return errors.New("boom")
				}
				fmt.Fprintln(env.Stdout, "out@v1")
				return nil
			},
		}}
	}
	cases := []struct {
		name   string
		env    string // KILN_QUIET
		args   []string
		quiet  bool
		code   int
		stderr []string // lines stderr must contain, besides the warning
	}{
		{"loud", "", []string{"make"}, false, 0, []string{"summary: 2 rows", "msg=done", "msg=committed"}},
		{"after the command", "", []string{"make", "--quiet"}, true, 0, nil},
		{"before the command", "", []string{"--quiet", "make"}, true, 0, nil},
		{"from the environment", "1", []string{"make"}, true, 0, nil},
		{"an error still shows", "", []string{"make", "--quiet", "--fail"}, true, 1, []string{"kiln: boom"}},
	}
	for _, c := range cases {
		t.Run(c.name, func(t *testing.T) {
			t.Setenv("KILN_QUIET", c.env)
			r := stagetest.Run(t, commands, c.args...)
			assert.Equal(t, c.code, r.Code, "stderr: %s", r.Stderr)
			if c.code == 0 {
				assert.Equal(t, "out@v1\n", r.Stdout)
			} else {
				assert.Empty(t, r.Stdout)
			}
			assert.Contains(t, r.Stderr, `msg="a warning"`)
			for _, s := range c.stderr {
				assert.Contains(t, r.Stderr, s)
			}
			if c.quiet {
				assert.NotContains(t, r.Stderr, "summary")
				assert.NotContains(t, r.Stderr, "level=INFO")
			}
		})
	}
}
