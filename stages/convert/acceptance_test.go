package convert_test

import (
	"bytes"
	"context"
	"encoding/json"
	"os/exec"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/kilnrl/kiln/fixtures"
	"github.com/kilnrl/kiln/internal/testenv"
)

// needTool fails the test in CI (CI=true) and skips it elsewhere when a
// tool it needs is missing.
func needTool(t *testing.T, what string, err error, hint string) {
	t.Helper()
	if err == nil {
		return
	}
	testenv.SkipOrFail(t, "%s: %v (%s)", what, err, hint)
}

// TestFixtureGradingCommands converts the fixture MiMo dataset and runs
// each task's generated grading command with bash in a bwrap sandbox over
// the base root filesystem, the repository copy bound at the task's
// workdir: it must pass once the gold patch is applied and fail without it.
func TestFixtureGradingCommands(t *testing.T) {
	ctx := context.Background()
	_, err := exec.LookPath("bwrap")
	needTool(t, "bwrap", err, "apt-get install bubblewrap, or run scripts/install-test-deps.sh")
	set, err := fixtures.Load(ctx)
	needTool(t, "fixtures", err, fixtures.RootfsInstallHint)
	rootfs, err := fixtures.BaseRootfs(ctx)
	require.NoError(t, err)
	rootArgs, err := fixtures.BwrapRootArgs(rootfs)
	require.NoError(t, err)

	storeDir := t.TempDir()
	res := run(t, "mimo", "--store", storeDir, "--data", set.MiMoDir, "--out", "tasks/fixtures")
	require.Equal(t, 0, res.Code, res.Stderr)
	tasks := readTasks(t, storeDir, res.LastLine())
	require.Len(t, tasks, len(set.Tasks))

	for i, task := range tasks {
		fx := set.Tasks[i]
		require.Equal(t, fx.ID, task.TaskID, "Parquet order")
		assert.Equal(t, fx.Image, *task.Image)
		assert.Equal(t, fx.Workdir, *task.Workdir)
		assert.NotContains(t, task.Prompt, "mimo_test_command", "the prompt carries no tests")
		var g struct {
			EvalCmd string `json:"eval_cmd"`
		}
		require.NoError(t, json.Unmarshal([]byte(*task.Grading), &g))
		for _, gold := range []bool{true, false} {
			name := fx.ID + map[bool]string{true: "/gold", false: "/unpatched"}[gold]
			t.Run(name, func(t *testing.T) {
				repo := filepath.Join(t.TempDir(), "repo")
				out, err := exec.Command("cp", "-a", fx.RepoDir, repo).CombinedOutput()
				require.NoError(t, err, "%s", out)
				if gold {
					cmd := exec.Command("git", "apply", "--whitespace=nowarn", "-")
					cmd.Dir, cmd.Stdin = repo, strings.NewReader(fx.GoldPatch)
					out, err := cmd.CombinedOutput()
					require.NoError(t, err, "%s", out)
				}
				args := append(append([]string{}, rootArgs...),
					"--bind", repo, fx.Workdir, "--tmpfs", "/tmp", "--proc", "/proc", "--dev", "/dev",
					"--unshare-all", "--die-with-parent", "--chdir", fx.Workdir,
					"--setenv", "HOME", "/root", "--setenv", "PATH", "/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin",
					// As the grader runs it (docs/data-and-grading.md §5.3): cd WORKDIR && <eval_cmd>.
					"bash", "-c", "cd "+fx.Workdir+" && "+g.EvalCmd)
				ctx, cancel := context.WithTimeout(ctx, 2*time.Minute)
				defer cancel()
				cmd := exec.CommandContext(ctx, "bwrap", args...)
				var log bytes.Buffer
				cmd.Stdout, cmd.Stderr = &log, &log
				err = cmd.Run()
				if gold {
					assert.NoError(t, err, "with the gold patch the tests must pass:\n%s", log.String())
				} else {
					var exit *exec.ExitError
					require.ErrorAs(t, err, &exit, "without the gold patch the tests must fail:\n%s", log.String())
					assert.NotZero(t, exit.ExitCode())
					// The test patch applied; the tests ran and failed.
					assert.Contains(t, log.String(), "Applied patch")
					assert.Contains(t, log.String(), "failed", "pytest reports failures:\n%s", log.String())
				}
			})
		}
	}
}

// TestFixtureRows converts the fixture set's SWE-bench, SWE-bench Pro and
// f2p-script rows.
func TestFixtureRows(t *testing.T) {
	set, err := fixtures.Load(context.Background())
	needTool(t, "fixtures", err, fixtures.RootfsInstallHint)
	cases := []struct {
		format string
		args   []string
		kind   string
		n      int
	}{
		{"swebench", []string{"--data", set.SWEBenchJSONL}, "swebench", len(set.Tasks)},
		{"swepro", []string{"--data", set.SWEProJSONL, "--scripts", set.SWEProScripts}, "swepro", 1},
		{"f2p", []string{"--data", set.F2PJSONL}, "f2p", 1},
	}
	for _, c := range cases {
		t.Run(c.format, func(t *testing.T) {
			storeDir := t.TempDir()
			res := run(t, append([]string{c.format, "--store", storeDir, "--out", "tasks/" + c.format}, c.args...)...)
			require.Equal(t, 0, res.Code, res.Stderr)
			tasks := readTasks(t, storeDir, res.LastLine())
			require.Len(t, tasks, c.n)
			for _, task := range tasks {
				g := grading(t, task.Grading)
				assert.Equal(t, c.kind, g["kind"])
				require.NotNil(t, task.Image)
				require.NotNil(t, task.Workdir)
				assert.NotEmpty(t, *task.ProblemStatement)
			}
			switch c.format {
			case "swepro":
				sp := grading(t, tasks[0].Grading)["swepro"].(map[string]any)
				assert.Contains(t, sp["run_script"], "#!/bin/bash")
				assert.NotEmpty(t, sp["parser_script"])
				assert.Equal(t, fixtures.SWEProTaskID, tasks[0].TaskID)
			case "f2p":
				assert.Equal(t, fixtures.F2PTaskID, tasks[0].TaskID)
				assert.Contains(t, grading(t, tasks[0].Grading)["f2p_script"], "pytest")
			case "swebench":
				assert.Equal(t, fixtures.SWEBenchLogParser, grading(t, tasks[0].Grading)["log_parser"])
			}
		})
	}
}
