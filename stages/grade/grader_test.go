package grade

import (
	"context"
	"encoding/base64"
	"encoding/json"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/kilnrl/kiln/formats/records"
	"github.com/kilnrl/kiln/internal/sandbox"
	"github.com/kilnrl/kiln/internal/shlex"
)

// mimoEvalCmd builds a MiMo grading command as docs/data-and-grading.md §1.4 describes
// (kiln-convert writes the real ones): reset the test patch's paths, apply
// it, run the test command.
func mimoEvalCmd(testPatch, testCommand string) string {
	lines := []string{"set -e"}
	for _, p := range patchPaths(testPatch) {
		q := shlex.Quote(p)
		lines = append(lines, "if git cat-file -e HEAD:"+q+" 2>/dev/null; then git checkout HEAD -- "+q+"; else git rm -f --cached -- "+q+" >/dev/null 2>&1 || true; rm -f -- "+q+"; fi")
	}
	lines = append(lines, "printf %s "+shlex.Quote(base64.StdEncoding.EncodeToString([]byte(testPatch)))+" | base64 -d > /tmp/mimo-tests.patch",
		"git apply --verbose /tmp/mimo-tests.patch", testCommand)
	return "bash -lc " + shlex.Quote(strings.Join(lines, "\n"))
}

func evalTarget(workdir, cmd string) *Target {
	return &Target{TaskID: "t", Workdir: workdir, Grading: &Grading{Kind: KindEvalCmd, EvalCmd: cmd}}
}

func userOf(cmds []sandbox.Cmd, substr string) (string, bool) {
	for _, c := range cmds {
		if strings.Contains(c.Shell, substr) {
			return c.User, true
		}
	}
	return "", false
}

// docs/data-and-grading.md §6 case 25: no grading path is (0, applied) and no sandbox.
func TestGradeNoGradingPath(t *testing.T) {
	g, boots := hostGrader(t, time.Minute)
	out := g.Grade(context.Background(), &Target{TaskID: "t", Workdir: "/nowhere"}, "diff --git a/x b/x\n")
	assert.Equal(t, 0.0, out.Reward)
	assert.True(t, out.Applied)
	assert.Equal(t, records.FailureNoGrading, out.Failure)
	assert.Equal(t, 0, boots.n, "no sandbox may be created")
}

// docs/data-and-grading.md §6 case 26: eval_cmd verdicts and the user it runs as.
func TestGradeEvalCmdVerdicts(t *testing.T) {
	repo := gitRepo(t, map[string]string{"a.txt": "a\n"})
	cases := []struct {
		name, cmd, evalUser, wantUser string
		reward                        float64
		failure                       string
		exit                          int
	}{
		{"true as root", "true", "root", sandbox.Root, 1, records.FailureNone, 0},
		{"exit 1 as default agent", "exit 1", "", sandbox.Agent, 0, records.FailureTestsFailed, 1},
		{"runs in the workdir", "test -f a.txt", "", sandbox.Agent, 1, records.FailureNone, 0},
	}
	for _, c := range cases {
		t.Run(c.name, func(t *testing.T) {
			g, boots := hostGrader(t, time.Minute)
			tg := evalTarget(repo, c.cmd)
			tg.EvalUser = c.evalUser
			out := g.Grade(context.Background(), tg, "")
			assert.Equal(t, c.reward, out.Reward)
			assert.True(t, out.Applied)
			assert.Equal(t, ApplyEmpty, out.ApplyMethod)
			assert.Equal(t, c.failure, out.Failure)
			assert.Equal(t, c.exit, out.ExitCode)
			user, ok := userOf(boots.last.commands(), c.cmd)
			require.True(t, ok, "eval_cmd ran")
			assert.Equal(t, c.wantUser, user)
			g.Wait()
			assert.True(t, boots.last.isClosed(), "the sandbox is closed")
			// The log names every command with its exit code.
			assert.Contains(t, string(out.Log), `"step":"eval_cmd"`)
			assert.Contains(t, string(out.Log), `"task_id":"t"`)
		})
	}
}

// The grading log places each command in time (docs/data-and-grading.md
// §5.6): the tests' span is where they ran, after the apply, so a reader
// (bench/demosplit) can tell the tests from the sandbox's own work.
func TestGradeLogTimesEachStep(t *testing.T) {
	repo := gitRepo(t, map[string]string{"a.txt": "a\n"})
	g, _ := hostGrader(t, time.Minute)
	before := time.Now()
	out := g.Grade(context.Background(), evalTarget(repo, "sleep 0.3"), "")
	after := time.Now()
	require.Equal(t, records.FailureNone, out.Failure)
	steps := map[string]step{}
	for _, line := range strings.Split(strings.TrimSpace(string(out.Log)), "\n")[1:] { // line 1: the grading's header
		var s step
		require.NoError(t, json.Unmarshal([]byte(line), &s), line)
		steps[s.Step] = s
	}
	ev, ap := steps["eval_cmd"], steps["apply"]
	require.False(t, ev.Started.IsZero(), "eval_cmd has started")
	assert.GreaterOrEqual(t, ev.DurationMS, 300.0, "eval_cmd slept 0.3 s")
	evEnd := ev.Started.Add(time.Duration(ev.DurationMS * float64(time.Millisecond)))
	assert.False(t, ev.Started.Before(before) || evEnd.After(after), "eval_cmd [%s, %s] within the grading [%s, %s]", ev.Started, evEnd, before, after)
	end := ap.Started.Add(time.Duration(ap.DurationMS * float64(time.Millisecond)))
	assert.False(t, ev.Started.Before(end.Add(-time.Millisecond)), "eval_cmd (%s) starts after the apply ends (%s)", ev.Started, end)
}

// docs/data-and-grading.md §6 case 27: an unappliable diff is (0, not applied) and eval_cmd
// never runs.
func TestGradeUnappliableDiff(t *testing.T) {
	repo := gitRepo(t, map[string]string{"a.txt": "a\n"})
	patch := "diff --git a/a.txt b/a.txt\n--- a/a.txt\n+++ b/a.txt\n@@ -1 +1 @@\n-nothing like this\n+b\n"
	g, boots := hostGrader(t, time.Minute)
	out := g.Grade(context.Background(), evalTarget(repo, "echo EVAL-RAN"), patch)
	assert.Equal(t, 0.0, out.Reward)
	assert.False(t, out.Applied)
	assert.Equal(t, records.FailurePatchFailed, out.Failure)
	assert.Equal(t, -1, out.ExitCode)
	_, ran := userOf(boots.last.commands(), "EVAL-RAN")
	assert.False(t, ran, "eval_cmd must not run")
	b, _ := os.ReadFile(filepath.Join(repo, "a.txt"))
	assert.Equal(t, "a\n", string(b))
}

// docs/data-and-grading.md §6 case 28: the MiMo command resets the official test paths, so an
// agent's edits to them and files it created there are discarded before
// the test patch applies.
func TestGradeMiMoResetSemantics(t *testing.T) {
	repo := gitRepo(t, map[string]string{"tests/test_a.py": "v1\n", "src.py": "bug\n"})
	agent := diffOf(t, repo, map[string]string{"tests/test_a.py": "agent\n", "tests/new_test.py": "agent made\n", "src.py": "fixed\n"})
	official := diffOf(t, repo, map[string]string{"tests/test_a.py": "v2\n", "tests/new_test.py": "official\n",
		"mimo_test_command.sh": "grep -qx v2 tests/test_a.py && grep -qx official tests/new_test.py && grep -qx fixed src.py\n"})
	for _, c := range []struct {
		name   string
		patch  string
		reward float64
	}{{"agent fix", agent, 1}, {"empty patch", "", 0}} {
		t.Run(c.name, func(t *testing.T) {
			git(t, repo, "checkout", "-q", "--", ".")
			git(t, repo, "clean", "-qfd")
			g, _ := hostGrader(t, time.Minute)
			tg := evalTarget(repo, mimoEvalCmd(official, "bash mimo_test_command.sh"))
			tg.EvalUser = "root"
			out := g.Grade(context.Background(), tg, c.patch)
			assert.True(t, out.Applied)
			assert.Equal(t, c.reward, out.Reward, string(out.Log))
			b, _ := os.ReadFile(filepath.Join(repo, "tests/new_test.py"))
			assert.Equal(t, "official\n", string(b), "the agent's file was replaced by the official one")
		})
	}
}

// docs/data-and-grading.md §6 case 29: SWE-bench Pro rewards from result.json; the run
// script's exit code is ignored.
func TestGradeSWEPro(t *testing.T) {
	repo := gitRepo(t, map[string]string{"a.txt": "a\n"})
	result := `{"tests":[{"name":"a","status":"PASSED"},{"name":"b","status":"FAILED"}]}`
	cases := []struct {
		name     string
		result   string
		f2p, p2p []string
		reward   float64
	}{
		{"a passes", result, []string{"a"}, []string{}, 1},
		{"b fails", result, []string{"a", "b"}, nil, 0},
		{"empty lists", result, nil, nil, 0},
		{"empty result.json", "", []string{"a"}, nil, 0},
		{"unknown name", result, []string{"a"}, []string{"zzz"}, 0},
	}
	for _, c := range cases {
		t.Run(c.name, func(t *testing.T) {
			g, boots := hostGrader(t, time.Minute)
			sp := &SWEPro{FailToPass: c.f2p, PassToPass: c.p2p, SelectedTestFiles: []string{"t1.py", "té.py"},
				RunScript:    "printf '%s' " + shlex.Quote(c.result) + "\necho \"$1\" > \"$(dirname \"$0\")/arg\"\nexit 3\n",
				ParserScript: "import sys\nopen(sys.argv[3], 'w').write(open(sys.argv[1]).read())\n"}
			tg := &Target{TaskID: "p", Workdir: repo, Grading: &Grading{Kind: KindSWEPro, SWEPro: sp}}
			out := g.Grade(context.Background(), tg, "")
			assert.Equal(t, c.reward, out.Reward, string(out.Log))
			assert.True(t, out.Applied)
			if c.reward == 0 {
				assert.Equal(t, records.FailureTestsFailed, out.Failure)
			}
			arg, err := os.ReadFile(filepath.Join(g.SWEProDir, "arg"))
			require.NoError(t, err)
			// json.dumps of the joined list, as the reference passes it
			// (ensure_ascii), inside the shell command's double quotes.
			assert.Equal(t, `t1.py,t\u00e9.py`+"\n", string(arg))
			run, _ := userOf(boots.last.commands(), "run_script.sh")
			assert.Equal(t, sandbox.Agent, run)
			var tests map[string]any
			require.NoError(t, json.Unmarshal([]byte(out.Tests), &tests))
		})
	}
	t.Run("invalid result.json is an infra error", func(t *testing.T) {
		g, _ := hostGrader(t, time.Minute)
		sp := &SWEPro{FailToPass: []string{"a"}, RunScript: "echo '{not json'\n",
			ParserScript: "import sys\nopen(sys.argv[3], 'w').write(open(sys.argv[1]).read())\n"}
		out := g.Grade(context.Background(), &Target{TaskID: "p", Workdir: repo, Grading: &Grading{Kind: KindSWEPro, SWEPro: sp}}, "")
		assert.Equal(t, records.FailureInfraError, out.Failure)
		assert.Contains(t, out.Error, "result.json is not valid JSON")
	})
}

// docs/data-and-grading.md §6 case 30: the empty diff on an unmodified task fails with an exit
// in [1, 123]; a grader command past its timeout is exit 124, reward 0,
// failure timeout, not an error, within the timeout plus a little.
func TestGradeBaselineAndTimeout(t *testing.T) {
	repo := gitRepo(t, map[string]string{"a.txt": "a\n"})
	g, _ := hostGrader(t, time.Minute)
	out := g.Grade(context.Background(), evalTarget(repo, "grep -q fixed a.txt; exit 2"), "")
	assert.Equal(t, 0.0, out.Reward)
	assert.Equal(t, records.FailureTestsFailed, out.Failure)
	assert.True(t, out.ExitCode >= 1 && out.ExitCode <= 123, "exit %d", out.ExitCode)

	g.Timeout = time.Second
	start := time.Now()
	out = g.Grade(context.Background(), evalTarget(repo, "while :; do :; done"), "")
	assert.Less(t, time.Since(start), 6*time.Second)
	assert.Equal(t, 0.0, out.Reward)
	assert.Equal(t, sandbox.TimeoutExitCode, out.ExitCode)
	assert.Equal(t, records.FailureTimeout, out.Failure)
	assert.True(t, out.Applied)
}

// The three apply methods, first success wins, with the worktree reset
// between attempts.
func TestGradeApplyMethods(t *testing.T) {
	base := map[string]string{"f": "1\n2\n3\n4\n5\n6\n7\n8\n9\n10\n", "g": "1\n2\n3\n4\n5\n6\n7\n8\n9\n10\n"}
	lines := func(s string, from, to string) string { return strings.Replace(s, "\n"+from+"\n", "\n"+to+"\n", 1) }
	cases := []struct {
		name string
		// commit is what the task's repository has committed on top of
		// the base the patch was made against.
		commit map[string]string
		// patch makes the agent's patch from the base repository.
		patch   func(t *testing.T, repo string) string
		method  string
		applied bool
		want    map[string]string
	}{{
		name: "plain git apply",
		patch: func(t *testing.T, repo string) string {
			return diffOf(t, repo, map[string]string{"f": lines(base["f"], "5", "five")})
		},
		method:  ApplyGit,
		applied: true,
		want:    map[string]string{"f": lines(base["f"], "5", "five")},
	}, {
		name:   "3-way merge over a moved base",
		commit: map[string]string{"f": lines(base["f"], "2", "two")},
		patch: func(t *testing.T, repo string) string {
			return diffOf(t, repo, map[string]string{"f": lines(base["f"], "5", "five")})
		},
		method: ApplyGit3Way, applied: true,
		want: map[string]string{"f": lines(lines(base["f"], "2", "two"), "5", "five")},
	}, {
		name:   "patch with fuzz when git has no blob",
		commit: map[string]string{"f": lines(base["f"], "2", "two")},
		patch: func(t *testing.T, repo string) string {
			d := diffOf(t, repo, map[string]string{"f": lines(base["f"], "5", "five")})
			// A plain unified diff (no index line): git cannot merge.
			var keep []string
			for _, l := range strings.Split(d, "\n") {
				if !strings.HasPrefix(l, "diff --git") && !strings.HasPrefix(l, "index ") {
					keep = append(keep, l)
				}
			}
			return strings.Join(keep, "\n")
		},
		method: ApplyPatchCmd, applied: true,
		want: map[string]string{"f": lines(lines(base["f"], "2", "two"), "5", "five")},
	}, {
		name: "reset between attempts: no conflict markers left behind",
		// g is edited right next to the patch's change: --3way conflicts
		// (writing markers), patch(1) cannot apply either.
		commit: map[string]string{"g": lines(base["g"], "4", "four")},
		patch: func(t *testing.T, repo string) string {
			return diffOf(t, repo, map[string]string{"f": lines(base["f"], "5", "five"), "g": lines(base["g"], "5", "five")})
		},
		applied: false,
		want:    map[string]string{"g": lines(base["g"], "4", "four")},
	}}
	for _, c := range cases {
		t.Run(c.name, func(t *testing.T) {
			repo := gitRepo(t, base)
			patch := c.patch(t, repo)
			for name, body := range c.commit {
				require.NoError(t, os.WriteFile(filepath.Join(repo, name), []byte(body), 0o644))
			}
			if len(c.commit) > 0 {
				git(t, repo, "-c", "user.name=t", "-c", "user.email=t@t", "commit", "-qam", "moved")
			}
			g, _ := hostGrader(t, time.Minute)
			out := g.Grade(context.Background(), evalTarget(repo, "true"), patch)
			assert.Equal(t, c.applied, out.Applied, string(out.Log))
			assert.Equal(t, c.method, out.ApplyMethod)
			for name, body := range c.want {
				b, err := os.ReadFile(filepath.Join(repo, name))
				require.NoError(t, err)
				assert.Equal(t, body, string(b), name)
			}
			if !c.applied {
				assert.Equal(t, records.FailurePatchFailed, out.Failure)
			}
		})
	}
}

// pre_commands run before the patch (it applies only on their output);
// a failing pre_command is ignored, as in the reference.
func TestGradePreCommands(t *testing.T) {
	repo := gitRepo(t, map[string]string{"a.txt": "a\n"})
	agent := filepath.Join(t.TempDir(), "agent")
	out, err := exec.Command("cp", "-a", repo, agent).CombinedOutput()
	require.NoError(t, err, string(out))
	require.NoError(t, os.WriteFile(filepath.Join(agent, "gen.txt"), []byte("generated\n"), 0o644))
	git(t, agent, "add", "gen.txt")
	git(t, agent, "-c", "user.name=t", "-c", "user.email=t@t", "commit", "-qm", "as pre_commands left it")
	require.NoError(t, os.WriteFile(filepath.Join(agent, "gen.txt"), []byte("edited\n"), 0o644))
	patch := git(t, agent, "diff")

	body, err := preCommandsBody(ptrTo(`["echo generated > gen.txt", "", "false"]`))
	require.NoError(t, err)
	g, _ := hostGrader(t, time.Minute)
	tg := evalTarget(repo, "grep -qx edited gen.txt")
	tg.PreCommands = body
	res := g.Grade(context.Background(), tg, patch)
	assert.Equal(t, 1.0, res.Reward, string(res.Log))
	assert.Equal(t, ApplyGit, res.ApplyMethod)
}

// A SWE-bench task: the test patch's files are reset before it applies,
// the test command's output is parsed, every listed test must pass.
func TestGradeSWEBench(t *testing.T) {
	runTests := `grep -qx official tests/test_x.py && echo "PASSED tests/test_x.py::test_ok" || echo "FAILED tests/test_x.py::test_ok"
if grep -qx fixed src.py; then echo "tests/test_x.py::test_fix PASSED [ 50%]"; else echo "tests/test_x.py::test_fix FAILED [ 50%]"; fi
echo "ARGS: $*"
`
	repo := gitRepo(t, map[string]string{"tests/test_x.py": "orig\n", "src.py": "bug\n", "run_tests.sh": runTests})
	testPatch := diffOf(t, repo, map[string]string{"tests/test_x.py": "official\n", "tests/data.json": "{}\n"})
	cmd := "bash run_tests.sh"
	cases := []struct {
		name     string
		patch    map[string]string
		f2p, p2p []string
		reward   float64
	}{
		{"fix", map[string]string{"src.py": "fixed\n"}, []string{"tests/test_x.py::test_fix"}, []string{"tests/test_x.py::test_ok"}, 1},
		{"fix and edited tests are reset", map[string]string{"src.py": "fixed\n", "tests/test_x.py": "cheat\n"}, []string{"tests/test_x.py::test_fix"}, []string{"tests/test_x.py::test_ok"}, 1},
		{"no fix", map[string]string{"tests/test_x.py": "cheat\n"}, []string{"tests/test_x.py::test_fix"}, []string{"tests/test_x.py::test_ok"}, 0},
		{"missing test", map[string]string{"src.py": "fixed\n"}, []string{"tests/test_x.py::test_fix", "tests/test_x.py::test_gone"}, nil, 0},
		{"no required tests", map[string]string{"src.py": "fixed\n"}, nil, nil, 0},
	}
	for _, c := range cases {
		t.Run(c.name, func(t *testing.T) {
			git(t, repo, "checkout", "-q", "--", ".")
			git(t, repo, "clean", "-qfd")
			patch := diffOf(t, repo, c.patch)
			g, boots := hostGrader(t, time.Minute)
			tg := &Target{TaskID: "s", Workdir: repo, Grading: &Grading{Kind: KindSWEBench, TestPatch: testPatch, TestCmd: cmd,
				LogParser: "pytest", FailToPass: c.f2p, PassToPass: c.p2p}}
			out := g.Grade(context.Background(), tg, patch)
			assert.Equal(t, c.reward, out.Reward, string(out.Log))
			b, _ := os.ReadFile(filepath.Join(repo, "tests/test_x.py"))
			assert.Equal(t, "official\n", string(b))
			assert.Contains(t, string(out.Log), "ARGS: tests/test_x.py\\n", "the test files are the command's arguments")
			user, _ := userOf(boots.last.commands(), "git apply --verbose")
			assert.Equal(t, sandbox.Root, user)
			var tests struct {
				F2P map[string]string `json:"fail_to_pass"`
			}
			require.NoError(t, json.Unmarshal([]byte(out.Tests), &tests))
			for _, name := range c.f2p {
				assert.Contains(t, tests.F2P, name)
			}
		})
	}
}

func TestGradeF2P(t *testing.T) {
	repo := gitRepo(t, map[string]string{"a.txt": "a\n"})
	for _, c := range []struct {
		script string
		reward float64
	}{{"import os, sys\nsys.exit(0 if os.path.exists('a.txt') else 1)\n", 1}, {"import sys\nsys.exit(1)\n", 0}} {
		g, boots := hostGrader(t, time.Minute)
		out := g.Grade(context.Background(), &Target{TaskID: "f", Workdir: repo, Grading: &Grading{Kind: KindF2P, F2PScript: c.script}}, "")
		assert.Equal(t, c.reward, out.Reward, string(out.Log))
		user, ok := userOf(boots.last.commands(), "__cagent_f2p__.py")
		require.True(t, ok)
		assert.Equal(t, sandbox.Agent, user)
	}
}

// Kiln failures are rows: a sandbox that cannot boot or dies mid-way, or
// a task kiln cannot decode, is infra_error with reward 0.
func TestGradeInfraErrors(t *testing.T) {
	repo := gitRepo(t, map[string]string{"a.txt": "a\n"})
	g, boots := hostGrader(t, time.Minute)
	boots.fail = "eval-me"
	out := g.Grade(context.Background(), evalTarget(repo, "echo eval-me"), "")
	assert.Equal(t, records.FailureInfraError, out.Failure)
	g.Wait()
	assert.True(t, boots.last.isClosed())

	g.Boot = func(context.Context, sandbox.Options) (sandbox.Sandbox, error) { return nil, os.ErrPermission }
	out = g.Grade(context.Background(), evalTarget(repo, "true"), "")
	assert.Equal(t, records.FailureInfraError, out.Failure)
	assert.Contains(t, out.Error, "booting a sandbox")

	out = g.Grade(context.Background(), &Target{TaskID: "bad", Invalid: "unknown grading kind \"x\""}, "")
	assert.Equal(t, records.FailureInfraError, out.Failure)
	assert.Contains(t, out.Error, `task "bad" cannot be graded: unknown grading kind "x"`)
}

func ptrTo(s string) *string { return &s }
