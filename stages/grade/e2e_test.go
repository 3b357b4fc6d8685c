package grade_test

import (
	"context"
	"encoding/json"
	"io"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
	"github.com/urfave/cli/v2"

	"github.com/kilnrl/kiln/fixtures"
	"github.com/kilnrl/kiln/formats/dataset"
	"github.com/kilnrl/kiln/formats/records"
	"github.com/kilnrl/kiln/formats/store"
	"github.com/kilnrl/kiln/internal/sandbox/sandboxtest"
	"github.com/kilnrl/kiln/internal/stagecmd"
	"github.com/kilnrl/kiln/internal/stagecmd/stagetest"
	"github.com/kilnrl/kiln/stages/convert"
	"github.com/kilnrl/kiln/stages/grade"
	"github.com/kilnrl/kiln/stages/images"
)

// kilnCommands are the stages the end-to-end tests chain in-process.
func kilnCommands(env *stagecmd.Env) []*cli.Command {
	var cmds []*cli.Command
	cmds = append(cmds, convert.Commands(env)...)
	cmds = append(cmds, images.Commands(env)...)
	return append(cmds, grade.Commands(env)...)
}

func kiln(t testing.TB, args ...string) stagetest.Result {
	t.Helper()
	return stagetest.Run(t, kilnCommands, args...)
}

// world is the fixture tasks converted, their images imported, in a fresh
// store, with bwrap sandboxes ready (the helper on PATH).
type world struct {
	set     *fixtures.Set
	store   string
	tasks   string // mimo tasks
	images  string
	bundles string
}

// newWorld needs root, bubblewrap and the base rootfs: missing ones fail
// under CI=true and skip otherwise (sandboxtest.Require).
func newWorld(t testing.TB) *world {
	t.Helper()
	sandboxtest.Require(t)
	dir, err := grade.HelperDir()
	require.NoError(t, err)
	t.Setenv("PATH", dir+string(os.PathListSeparator)+os.Getenv("PATH"))
	set, err := fixtures.Load(context.Background())
	require.NoError(t, err)
	home, err := os.UserHomeDir()
	require.NoError(t, err)
	w := &world{set: set, store: t.TempDir(),
		// Bundles are reused across runs (kiln-images reuses a bundle whose
		// digest matches): unpacking the base layer takes a while.
		bundles: filepath.Join(home, ".cache", "kiln", "grade-test-bundles-"+fixtures.GeneratorVersion)}
	r := kiln(t, "mimo", "--store", w.store, "--data", set.MiMoDir, "--out", "tasks/mimo")
	require.Equal(t, 0, r.Code, r.Stderr)
	w.tasks = r.LastLine()
	r = kiln(t, "import", "--store", w.store, "--tasks", w.tasks, "--root", w.bundles, "--source", set.Repository+"=oci:"+set.Layout, "--out", "images")
	require.Equal(t, 0, r.Code, r.Stderr)
	w.images = r.LastLine()
	return w
}

func (w *world) convert(t testing.TB, args ...string) string {
	t.Helper()
	r := kiln(t, append(args[:1:1], append([]string{"--store", w.store}, args[1:]...)...)...)
	require.Equal(t, 0, r.Code, r.Stderr)
	return r.LastLine()
}

func (w *world) grade(t testing.TB, tasks string, args ...string) (stagetest.Result, []records.Grade) {
	t.Helper()
	r := kiln(t, append([]string{"grade", "--store", w.store, "--tasks", tasks, "--images", w.images, "--bundles", w.bundles, "-j", "2"}, args...)...)
	require.Equal(t, 0, r.Code, r.Stderr)
	st, err := store.Open(w.store)
	require.NoError(t, err)
	v, err := dataset.OpenString(context.Background(), st, r.LastLine())
	require.NoError(t, err)
	var rows []records.Grade
	require.NoError(t, v.EachShard(context.Background(), func(_ int, data []byte) error {
		return records.EachGrade(data, func(g records.Grade) error { rows = append(rows, g); return nil })
	}))
	return r, rows
}

type patchLine struct {
	TaskID string `json:"task_id"`
	Patch  string `json:"patch"`
	Sample int    `json:"sample"`
}

func writePatches(t testing.TB, rows any, jsonl bool) string {
	t.Helper()
	var b strings.Builder
	if jsonl {
		for _, r := range rows.([]patchLine) {
			line, _ := json.Marshal(r)
			b.Write(line)
			b.WriteByte('\n')
		}
	} else {
		data, _ := json.Marshal(rows)
		b.Write(data)
	}
	p := filepath.Join(t.TempDir(), "patches.jsonl")
	require.NoError(t, os.WriteFile(p, []byte(b.String()), 0o644))
	return p
}

// cheatPatch rewrites the task's official test files so that they pass
// and adds a mimo_test_command.sh that exits 0: grading must still fail,
// since the official test files are reset before the test patch applies.
func cheatPatch(t testing.TB, task fixtures.Task) string {
	t.Helper()
	dir := filepath.Join(t.TempDir(), "repo")
	out, err := exec.Command("cp", "-a", task.RepoDir, dir).CombinedOutput()
	require.NoError(t, err, string(out))
	for _, f := range task.TestFiles {
		p := filepath.Join(dir, f)
		require.NoError(t, os.MkdirAll(filepath.Dir(p), 0o755))
		require.NoError(t, os.WriteFile(p, []byte("def test_cheat():\n    assert True\n"), 0o644))
	}
	require.NoError(t, os.WriteFile(filepath.Join(dir, "mimo_test_command.sh"), []byte("exit 0\n"), 0o755))
	for _, args := range [][]string{{"add", "-A"}} {
		out, err := exec.Command("git", append([]string{"-C", dir}, args...)...).CombinedOutput()
		require.NoError(t, err, string(out))
	}
	diff, err := exec.Command("git", "-C", dir, "diff", "--cached", "--binary").Output()
	require.NoError(t, err)
	require.NotEmpty(t, diff)
	return string(diff)
}

const (
	unappliable = "diff --git a/README.md b/README.md\n--- a/README.md\n+++ b/README.md\n@@ -1 +1 @@\n-this line is not in the file\n+x\n"
	// hang makes every pytest run loop forever (conftest.py at the root).
	hang = "diff --git a/conftest.py b/conftest.py\nnew file mode 100644\n--- /dev/null\n+++ b/conftest.py\n@@ -0,0 +1,3 @@\n+import time\n+while True:\n+    time.sleep(0.05)\n"
)

// TestFixturesEndToEnd chains the fixtures through kiln-convert,
// kiln-images import and kiln-grade, grading in real bwrap sandboxes: the
// gold patch passes; the empty patch, a patch editing the official tests to
// pass and an unappliable patch fail; a hanging test is a timeout within
// the timeout plus 5 s; --baseline flags no fixture task.
func TestFixturesEndToEnd(t *testing.T) {
	w := newWorld(t)
	const timeout = 5 * time.Second
	var lines []patchLine
	type want struct {
		reward  float64
		applied bool
		failure string
	}
	var wants []want
	for _, task := range w.set.Tasks {
		lines = append(lines,
			patchLine{TaskID: task.ID, Patch: task.GoldPatch, Sample: 0},
			patchLine{TaskID: task.ID, Patch: "", Sample: 1},
			patchLine{TaskID: task.ID, Patch: cheatPatch(t, task), Sample: 2},
			patchLine{TaskID: task.ID, Patch: unappliable, Sample: 3})
		wants = append(wants, want{1, true, records.FailureNone}, want{0, true, records.FailureTestsFailed},
			want{0, true, records.FailureTestsFailed}, want{0, false, records.FailurePatchFailed})
	}
	r, rows := w.grade(t, w.tasks, "--patches", writePatches(t, lines, true), "--out", "grades/mimo")
	require.Len(t, rows, len(lines), r.Stderr)
	for _, g := range rows {
		t.Logf("%s sample %d: reward %v applied %v (%s) failure %s exit %d in %d ms", g.TaskID, g.Sample, g.Reward, g.Applied, deref(g.ApplyMethod), g.Failure, g.ExitCode, g.DurationMS)
		wt, line := wants[g.Index], lines[g.Index]
		assert.Equal(t, line.TaskID, g.TaskID)
		assert.Equal(t, int64(line.Sample), g.Sample)
		assert.Equal(t, wt.reward, g.Reward, "%s sample %d: %s %s", g.TaskID, g.Sample, g.Failure, deref(g.Error))
		assert.Equal(t, wt.applied, g.Applied, "%s sample %d", g.TaskID, g.Sample)
		assert.Equal(t, wt.failure, g.Failure, "%s sample %d: %s", g.TaskID, g.Sample, deref(g.Error))
		require.NotNil(t, g.ImageDigest)
		assert.Equal(t, w.set.Tasks[g.GroupIndex].ManifestDigest, *g.ImageDigest)
		require.NotNil(t, g.Log)
		switch g.Failure {
		case records.FailureTestsFailed:
			if line.Patch == "" {
				assert.True(t, g.ExitCode >= 1 && g.ExitCode <= 123, "baseline exit %d", g.ExitCode)
			}
		}
	}

	// A hanging test, graded with a short --timeout (apart, so that a
	// loaded machine cannot push the other gradings past it).
	_, rows = w.grade(t, w.tasks, "--patches", writePatches(t, []patchLine{{TaskID: w.set.Tasks[0].ID, Patch: hang}}, true),
		"--timeout", timeout.String(), "--out", "grades/hang")
	require.Len(t, rows, 1)
	g := rows[0]
	assert.Equal(t, 0.0, g.Reward)
	assert.True(t, g.Applied)
	assert.Equal(t, records.FailureTimeout, g.Failure)
	assert.Equal(t, int64(124), g.ExitCode)
	assert.LessOrEqual(t, g.DurationMS, (timeout + 5*time.Second).Milliseconds(), "timeout recorded within the timeout + 5 s")

	r, rows = w.grade(t, w.tasks, "--baseline", "--out", "grades/baseline")
	require.Len(t, rows, len(w.set.Tasks))
	for _, g := range rows {
		assert.True(t, g.Baseline)
		assert.Equal(t, 0.0, g.Reward, g.TaskID)
	}
	assert.Contains(t, r.Stderr, "baseline: all 4 graded tasks fail with the empty patch")
}

// TestFixturesOtherGradingKinds grades the fixtures' SWE-bench rows (given
// as SWE-bench predictions), SWE-bench Pro row and f2p row: gold passes,
// empty fails.
func TestFixturesOtherGradingKinds(t *testing.T) {
	w := newWorld(t)
	type pred struct {
		InstanceID string `json:"instance_id"`
		ModelPatch string `json:"model_patch"`
		Model      string `json:"model_name_or_path"`
	}
	gold := map[string]string{}
	for _, task := range w.set.Tasks {
		gold[task.ID] = task.GoldPatch
	}
	check := func(t *testing.T, tasks string, preds []pred, kind string) {
		_, rows := w.grade(t, tasks, "--patches", writePatches(t, preds, false), "--out", "grades/"+kind)
		require.Len(t, rows, len(preds))
		for _, g := range rows {
			p := preds[g.Index]
			want := 0.0
			if p.ModelPatch != "" {
				want = 1
			}
			assert.Equal(t, want, g.Reward, "%s %s: %s %s", kind, g.TaskID, g.Failure, deref(g.Error))
			require.NotNil(t, g.GradingKind)
			assert.Equal(t, kind, *g.GradingKind)
			if kind == grade.KindSWEBench || kind == grade.KindSWEPro {
				require.NotNil(t, g.Tests, "per-test results")
				var tests struct {
					F2P map[string]string `json:"fail_to_pass"`
				}
				require.NoError(t, json.Unmarshal([]byte(*g.Tests), &tests))
				assert.NotEmpty(t, tests.F2P)
				for name, status := range tests.F2P {
					assert.Equal(t, want == 1, status == grade.StatusPassed, "%s %s: %s", g.TaskID, name, status)
				}
			}
		}
	}
	t.Run("swebench", func(t *testing.T) {
		tasks := w.convert(t, "swebench", "--data", w.set.SWEBenchJSONL, "--out", "tasks/swebench")
		var preds []pred
		for _, task := range w.set.Tasks {
			preds = append(preds, pred{task.ID, task.GoldPatch, "gold"}, pred{task.ID, "", "empty"})
		}
		check(t, tasks, preds, grade.KindSWEBench)
	})
	t.Run("swepro", func(t *testing.T) {
		tasks := w.convert(t, "swepro", "--data", w.set.SWEProJSONL, "--scripts", w.set.SWEProScripts, "--out", "tasks/swepro")
		check(t, tasks, []pred{{fixtures.SWEProTaskID, gold[fixtures.SWEProTaskID], "gold"}, {fixtures.SWEProTaskID, "", "empty"}}, grade.KindSWEPro)
	})
	t.Run("f2p", func(t *testing.T) {
		tasks := w.convert(t, "f2p", "--data", w.set.F2PJSONL, "--out", "tasks/f2p")
		check(t, tasks, []pred{{fixtures.F2PTaskID, gold[fixtures.F2PTaskID], "gold"}, {fixtures.F2PTaskID, "", "empty"}}, grade.KindF2P)
	})
}

func deref(s *string) string {
	if s == nil {
		return ""
	}
	return *s
}

// TestFixturesGradeRollouts grades a rollouts dataset (what kiln-rollout
// writes) in real sandboxes: each row's patch against its task, the grade
// keeping the rollout's ids and group; an aborted rollout is not graded.
func TestFixturesGradeRollouts(t *testing.T) {
	w := newWorld(t)
	ctx := context.Background()
	start := time.Date(2026, 11, 30, 1, 2, 3, 0, time.UTC)
	abort := "wall_clock_timeout"
	var rows []records.Rollout
	for g, task := range w.set.Tasks {
		base := int64(100 * (g + 1))
		rows = append(rows,
			records.Rollout{RolloutID: base, Index: base, GroupIndex: int64(g), Sample: 0, TaskID: task.ID, Agent: "claude-code",
				Patch: task.GoldPatch, StartedAt: start, EndedAt: start.Add(time.Minute)},
			records.Rollout{RolloutID: base + 1, Index: base + 1, GroupIndex: int64(g), Sample: 1, TaskID: task.ID, Agent: "claude-code",
				Patch: "", StartedAt: start, EndedAt: start.Add(time.Minute)})
	}
	rows = append(rows, records.Rollout{RolloutID: 999, Index: 999, GroupIndex: 0, Sample: 2, TaskID: w.set.Tasks[0].ID,
		Agent: "claude-code", Patch: w.set.Tasks[0].GoldPatch, AbortReason: &abort, StartedAt: start, EndedAt: start})

	st, err := store.Open(w.store)
	require.NoError(t, err)
	dw, err := dataset.NewWriter(ctx, st, dataset.Spec{Name: "rollouts/fixtures", Kind: records.RolloutsKind(),
		Identity: dataset.Identity{Stage: "test", Args: map[string]any{"t": t.Name()}}})
	require.NoError(t, err)
	_, err = dw.WriteShard(ctx, int64(len(rows)), nil, func(out io.Writer) error {
		enc := records.NewRolloutEncoder(out)
		if err := enc.Write(rows...); err != nil {
			return err
		}
		return enc.Close()
	})
	require.NoError(t, err)
	res, err := dw.Commit(ctx, nil)
	require.NoError(t, err)

	_, grades := w.grade(t, w.tasks, "--rollouts", res.Ref.String(), "--out", "grades/rollouts")
	require.Len(t, grades, len(rows))
	for _, g := range grades {
		want := 0.0
		if g.Sample == 0 {
			want = 1
		}
		if g.RolloutID == 999 {
			assert.Equal(t, records.FailureAborted, g.Failure)
			assert.Nil(t, g.Log, "an aborted rollout is not graded")
			// A row without abort_detail (as older versions have) gives the reason alone.
			assert.Equal(t, "the rollout was aborted: wall_clock_timeout", deref(g.Error))
			continue
		}
		assert.Equal(t, want, g.Reward, "%s sample %d: %s %s", g.TaskID, g.Sample, g.Failure, deref(g.Error))
		assert.Equal(t, g.Index, g.RolloutID, "the grade keeps the rollout's id")
		assert.Equal(t, g.RolloutID/100-1, g.GroupIndex, "and its group")
		require.NotNil(t, g.Log)
	}
}
