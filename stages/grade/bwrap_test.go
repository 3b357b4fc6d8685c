package grade

import (
	"context"
	"encoding/json"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/kilnrl/kiln/formats/records"
	"github.com/kilnrl/kiln/internal/sandbox"
	"github.com/kilnrl/kiln/internal/sandbox/sandboxtest"
)

// bwrapGrader grades in real bwrap sandboxes over the base rootfs (bash,
// git, patch, python3, pytest), each seeded at boot with a git repository
// at /testbed holding files (committed): the image a task would ship.
func bwrapGrader(t *testing.T, files map[string]string, timeout time.Duration) *Grader {
	t.Helper()
	root := sandboxtest.Require(t)
	dir, err := HelperDir()
	require.NoError(t, err)
	g := &Grader{Timeout: timeout, Base: sandbox.Options{Rootfs: root, HelperPath: filepath.Join(dir, sandbox.HelperName), BootAttempts: 1}}
	g.Boot = func(ctx context.Context, o sandbox.Options) (sandbox.Sandbox, error) {
		o.Rootfs = root
		sb, err := sandbox.Boot(ctx, o)
		if err != nil {
			return nil, err
		}
		for name, body := range files {
			if err := sb.WriteFile(ctx, "/testbed/"+name, []byte(body), 0o644, sandbox.Root); err != nil {
				sb.Close()
				return nil, err
			}
		}
		if _, err := sb.Exec(ctx, sandbox.Cmd{Shell: "cd /testbed && git init -q -b main && git add -A && git -c user.name=t -c user.email=t@t commit -qm base",
			Check: true}); err != nil {
			sb.Close()
			return nil, err
		}
		return sb, nil
	}
	t.Cleanup(g.Wait)
	return g
}

// logSteps returns the grading log's steps by name.
func logSteps(t *testing.T, log []byte) map[string]step {
	t.Helper()
	out := map[string]step{}
	for _, line := range strings.Split(strings.TrimSpace(string(log)), "\n")[1:] {
		var s step
		require.NoError(t, json.Unmarshal([]byte(line), &s), line)
		out[s.Step] = s
	}
	return out
}

// TestGradeSpecCasesInBwrap runs docs/data-and-grading.md §6 "Grading" cases 26-30
// with real git in real bwrap sandboxes (case 25 boots nothing).
func TestGradeSpecCasesInBwrap(t *testing.T) {
	repo := map[string]string{"tests/test_a.py": "v1\n", "src.py": "bug\n"}
	hostRepo := gitRepo(t, repo)
	agentFix := diffOf(t, hostRepo, map[string]string{"tests/test_a.py": "agent\n", "tests/new_test.py": "agent made\n", "src.py": "fixed\n"})
	official := diffOf(t, hostRepo, map[string]string{"tests/test_a.py": "v2\n", "tests/new_test.py": "official\n",
		"mimo_test_command.sh": "grep -qx v2 tests/test_a.py && grep -qx official tests/new_test.py && grep -qx fixed src.py\n"})
	mimo := mimoEvalCmd(official, "bash mimo_test_command.sh")
	unappliable := "diff --git a/src.py b/src.py\n--- a/src.py\n+++ b/src.py\n@@ -1 +1 @@\n-nothing like this\n+x\n"
	// Every case but the timeout one gets a limit no loaded machine reaches.
	const timeout, generous = 2 * time.Second, time.Minute
	cases := []struct {
		name     string
		target   Target
		patch    string
		reward   float64
		applied  bool
		failure  string
		exitOK   func(int) bool
		evalRuns bool
	}{
		{"26 true", Target{Grading: &Grading{Kind: KindEvalCmd, EvalCmd: "true"}}, "", 1, true, records.FailureNone, nil, true},
		{"26 exit 1", Target{Grading: &Grading{Kind: KindEvalCmd, EvalCmd: "exit 1"}}, "", 0, true, records.FailureTestsFailed, nil, true},
		{"26 root when eval_user is root", Target{EvalUser: "root", Grading: &Grading{Kind: KindEvalCmd, EvalCmd: `test "$(id -un)" = root`}}, "", 1, true, records.FailureNone, nil, true},
		{"26 agent by default", Target{Grading: &Grading{Kind: KindEvalCmd, EvalCmd: `test "$(id -un)" = agent && test -w src.py`}}, "", 1, true, records.FailureNone, nil, true},
		{"27 unappliable diff", Target{Grading: &Grading{Kind: KindEvalCmd, EvalCmd: "true"}}, unappliable, 0, false, records.FailurePatchFailed, nil, false},
		{"28 MiMo reset, agent fix", Target{EvalUser: "root", Grading: &Grading{Kind: KindEvalCmd, EvalCmd: mimo}}, agentFix, 1, true, records.FailureNone, nil, true},
		{"28 MiMo reset, empty patch", Target{EvalUser: "root", Grading: &Grading{Kind: KindEvalCmd, EvalCmd: mimo}}, "", 0, true, records.FailureTestsFailed, nil, true},
		{"29 swepro", Target{Grading: &Grading{Kind: KindSWEPro, SWEPro: &SWEPro{FailToPass: []string{"a"},
			RunScript:    "echo '{\"tests\":[{\"name\":\"a\",\"status\":\"PASSED\"},{\"name\":\"b\",\"status\":\"FAILED\"}]}'; exit 3\n",
			ParserScript: "import sys\nopen(sys.argv[3], 'w').write(open(sys.argv[1]).read())\n"}}}, "", 1, true, records.FailureNone, nil, false},
		{"29 swepro b fails", Target{Grading: &Grading{Kind: KindSWEPro, SWEPro: &SWEPro{FailToPass: []string{"a", "b"},
			RunScript:    "echo '{\"tests\":[{\"name\":\"a\",\"status\":\"PASSED\"},{\"name\":\"b\",\"status\":\"FAILED\"}]}'\n",
			ParserScript: "import sys\nopen(sys.argv[3], 'w').write(open(sys.argv[1]).read())\n"}}}, "", 0, true, records.FailureTestsFailed, nil, false},
		{"30 fresh baseline", Target{Grading: &Grading{Kind: KindEvalCmd, EvalCmd: "python3 -c 'import sys; sys.exit(2)'"}}, "", 0, true, records.FailureTestsFailed,
			func(c int) bool { return c >= 1 && c <= 123 }, true},
		{"30 timeout", Target{Grading: &Grading{Kind: KindEvalCmd, EvalCmd: "while :; do :; done"}}, "", 0, true, records.FailureTimeout,
			func(c int) bool { return c == sandbox.TimeoutExitCode }, true},
	}
	for _, c := range cases {
		t.Run(c.name, func(t *testing.T) {
			limit := generous
			if c.failure == records.FailureTimeout {
				limit = timeout
			}
			g := bwrapGrader(t, repo, limit)
			tg := c.target
			tg.TaskID, tg.Workdir = "spec", "/testbed"
			start := time.Now()
			out := g.Grade(context.Background(), &tg, c.patch)
			if limit == timeout {
				assert.Less(t, time.Since(start), timeout+5*time.Second, "a timeout is recorded within the timeout + 5 s")
			}
			assert.Equal(t, c.reward, out.Reward, string(out.Log))
			assert.Equal(t, c.applied, out.Applied)
			assert.Equal(t, c.failure, out.Failure, out.Error)
			if c.exitOK != nil {
				assert.True(t, c.exitOK(out.ExitCode), "exit %d", out.ExitCode)
			}
			steps := logSteps(t, out.Log)
			_, ran := steps["eval_cmd"]
			assert.Equal(t, c.evalRuns, ran, "eval_cmd ran")
			assert.Contains(t, steps, "ensure_agent_user")
		})
	}
}
