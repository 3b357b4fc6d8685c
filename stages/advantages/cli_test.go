package advantages

import (
	"bytes"
	"context"
	"math"
	"strings"
	"testing"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
	"github.com/urfave/cli/v2"

	"github.com/kilnrl/kiln/formats/dataset"
	"github.com/kilnrl/kiln/internal/stagecmd"
	"github.com/kilnrl/kiln/stages/datasets"
)

// app is kiln-advantages as cmd/kiln-advantages builds it, on buffers.
func app(stdout, stderr *bytes.Buffer) *cli.App {
	env := &stagecmd.Env{Stdout: stdout, Stderr: stderr, Log: stagecmd.NewLogger(stderr, false)}
	return App(env)
}

func TestCLI(t *testing.T) {
	w := newWorld(t)
	store := w.st.(interface{ Root() string })
	run := func(args ...string) (string, error) {
		var stdout, stderr bytes.Buffer
		a := app(&stdout, &stderr)
		a.ExitErrHandler = func(*cli.Context, error) {}
		err := a.RunContext(context.Background(), append([]string{"kiln-advantages"}, args...))
		return stdout.String(), err
	}
	out, err := run("--help")
	require.NoError(t, err)
	for _, want := range []string{"Statistics count every ROLLOUT once", "--infra-failures", "EXIT STATUS", "select", "stats"} {
		assert.Contains(t, out, want)
	}
	out, err = run("--store", store.Root(), "--trajectories", w.trajectories.String(), "--grades", w.grades.String(),
		"--out", "adv", "--estimator", "rloo", "--drop-uniform")
	require.NoError(t, err)
	assert.True(t, strings.HasPrefix(lastLine(out), "adv@"), out)
	printed, err := run("--store", store.Root(), "--trajectories", w.trajectories.String(), "--grades", w.grades.String(),
		"--out", "adv", "--estimator", "rloo", "--drop-uniform", "--print-version")
	require.NoError(t, err)
	assert.Equal(t, lastLine(out), lastLine(printed))

	// kiln show prints the metrics and the rows.
	var showOut, showErr bytes.Buffer
	env := &stagecmd.Env{Stdout: &showOut, Stderr: &showErr, Log: stagecmd.NewLogger(&showErr, false)}
	kiln := stagecmd.CommonApp(&cli.App{Name: "kiln", Commands: datasets.Commands(env)}, &showOut, &showErr)
	require.NoError(t, kiln.RunContext(context.Background(), []string{"kiln", "show", "--store", store.Root(), "--rows", "1", lastLine(out)}), showErr.String())
	for _, want := range []string{"kind       advantages", `"segments_per_rollout":{"1":3,"2":3,"3":2}`, `"pass_at_k":{"1":0.375`,
		`"group_stats":{`, `{"rollout_id":0,"segment":0,"group_index":0,"advantage":0.6666666666666667,"rollout_trained_tokens":1,"reward":1}`} {
		assert.Contains(t, showOut.String(), want)
	}

	out, err = run("stats", "--store", store.Root(), "--grades", w.grades.String())
	require.NoError(t, err)
	assert.Contains(t, out, "pass@4 1.000000 (2 tasks)")

	_, err = run("--store", store.Root(), "--estimator", "ppo")
	assert.Equal(t, stagecmd.ExitUsage, stagecmd.ExitCode(err))
	_, err = run("--store", store.Root(), "--infra-failures", "ignore")
	assert.Equal(t, stagecmd.ExitUsage, stagecmd.ExitCode(err))
	_, err = run("stray")
	assert.Equal(t, stagecmd.ExitUsage, stagecmd.ExitCode(err))
}

// TestCLIStdEps: --std-eps reaches grpo's denominator, (R - mean) /
// (std + eps), and the version. Before, every test ran with the default,
// and a kiln-advantages that ignored the flag passed them all. Task 0's
// rewards are [1,0,1,0]: mean 0.5, std sqrt(1/3).
func TestCLIStdEps(t *testing.T) {
	w := newWorld(t)
	root := w.st.(interface{ Root() string }).Root()
	std := math.Sqrt(1.0 / 3)
	refs := map[string]string{}
	for _, c := range []struct {
		eps  []string // the flag, none for the default
		want float64  // rollout 0's advantage
	}{
		{nil, 0.5 / (std + 1e-6)},
		{[]string{"--std-eps", "1"}, 0.5 / (std + 1)},
		{[]string{"--std-eps", "0.25"}, 0.5 / (std + 0.25)},
	} {
		var stdout, stderr bytes.Buffer
		a := app(&stdout, &stderr)
		a.ExitErrHandler = func(*cli.Context, error) {}
		args := append([]string{"kiln-advantages", "--store", root, "--trajectories", w.trajectories.String(), "--grades", w.grades.String(), "--out", "adv"}, c.eps...)
		require.NoError(t, a.RunContext(context.Background(), args), "%v: %s", c.eps, stderr.String())
		ref, err := dataset.ParseRef(lastLine(stdout.String()))
		require.NoError(t, err, "%v", c.eps)
		_, rows := readAdvantages(t, w.st, ref)
		assert.InDelta(t, c.want, byRollout(rows)[0], 1e-9, "kiln-advantages %v: rollout 0's advantage", c.eps)
		refs[ref.String()] = strings.Join(c.eps, " ")
	}
	assert.Len(t, refs, 3, "each --std-eps is its own version: %v", refs)
}
