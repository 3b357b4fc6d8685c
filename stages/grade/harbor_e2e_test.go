package grade_test

import (
	"context"
	"io"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"testing"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/kilnrl/kiln/formats/records"
	"github.com/kilnrl/kiln/formats/store"
	"github.com/kilnrl/kiln/internal/testenv"
)

// harborFixture is a task of the project's Harbor fixtures (fixtures/harbor).
func harborFixture(t testing.TB, name string) string {
	t.Helper()
	dir, err := filepath.Abs(filepath.Join("..", "..", "fixtures", "harbor", name))
	require.NoError(t, err)
	return dir
}

// harborWorld converts Harbor task directories and imports their
// (prebuilt) images into w's store: it returns the tasks and images.
func (w *world) harbor(t testing.TB, out string, dirs ...string) (tasks, imgs string) {
	t.Helper()
	r := kiln(t, append([]string{"harbor", "--store", w.store, "--out", out}, dirs...)...)
	require.Equal(t, 0, r.Code, r.Stderr)
	tasks = r.LastLine()
	r = kiln(t, "import", "--store", w.store, "--tasks", tasks, "--bundles", w.bundles,
		"--source", w.set.Repository+"=oci:"+w.set.Layout, "--out", "images/"+out)
	require.Equal(t, 0, r.Code, r.Stderr)
	return tasks, r.LastLine()
}

func (w *world) gradeWith(t testing.TB, tasks, imgs string, args ...string) (string, []records.Grade) {
	t.Helper()
	saved := w.images
	w.images = imgs
	defer func() { w.images = saved }()
	r, rows := w.grade(t, tasks, args...)
	return r.Stderr, rows
}

// gradingLog reads a grade row's log.
func (w *world) gradingLog(t testing.TB, g records.Grade) string {
	t.Helper()
	require.NotNil(t, g.Log)
	st, err := store.Open(w.store)
	require.NoError(t, err)
	rc, _, err := st.Get(context.Background(), *g.Log)
	require.NoError(t, err)
	defer rc.Close()
	b, err := io.ReadAll(rc)
	require.NoError(t, err)
	return string(b)
}

// TestHarborEndToEnd converts the Harbor fixtures with prebuilt images,
// imports them and grades them in real bwrap sandboxes: the oracle
// (--solution) gets reward 1, or the declared fraction 0.5 from
// reward.json; the empty patch (--baseline) gets 0; the fixture's gold
// patch, graded as a patch, gets 1 with the verifier's reward.txt.
func TestHarborEndToEnd(t *testing.T) {
	w := newWorld(t)
	tasks, imgs := w.harbor(t, "tasks/harbor", harborFixture(t, "slugify-prebuilt"), harborFixture(t, "calc-fraction"))

	_, rows := w.gradeWith(t, tasks, imgs, "--solution", "--out", "grades/harbor-solution")
	require.Len(t, rows, 2)
	want := map[string]float64{"slugify-prebuilt": 1, "kiln-fixtures/calc-fraction": 0.5}
	for _, g := range rows {
		assert.Equal(t, want[g.TaskID], g.Reward, "%s: %s %s\n%s", g.TaskID, g.Failure, deref(g.Error), w.gradingLog(t, g))
		assert.True(t, g.Applied)
		require.NotNil(t, g.GradingKind)
		assert.Equal(t, "harbor", *g.GradingKind)
		if g.Reward < 1 {
			assert.Equal(t, records.FailureTestsFailed, g.Failure, "a fraction is tests_failed")
		}
		log := w.gradingLog(t, g)
		assert.Contains(t, log, `"step":"upload /tests"`)
	}

	stderr, rows := w.gradeWith(t, tasks, imgs, "--baseline", "--out", "grades/harbor-baseline")
	require.Len(t, rows, 2)
	for _, g := range rows {
		assert.Equal(t, 0.0, g.Reward, "%s: %s %s", g.TaskID, g.Failure, deref(g.Error))
		assert.Equal(t, records.FailureTestsFailed, g.Failure, "%s: %s", g.TaskID, deref(g.Error))
	}
	assert.Contains(t, stderr, "baseline: all 2 graded tasks fail with the empty patch")

	var gold string
	for _, task := range w.set.Tasks {
		if task.ID == "fixture-slugify-002" {
			gold = task.GoldPatch
		}
	}
	_, rows = w.gradeWith(t, tasks, imgs, "--patches",
		writePatches(t, []patchLine{{TaskID: "slugify-prebuilt", Patch: gold}, {TaskID: "slugify-prebuilt", Patch: "", Sample: 1}}, true),
		"--out", "grades/harbor-patches")
	require.Len(t, rows, 2)
	assert.Equal(t, 1.0, rows[0].Reward, "%s %s", rows[0].Failure, deref(rows[0].Error))
	assert.Equal(t, 0.0, rows[1].Reward)
	assert.Contains(t, w.gradingLog(t, rows[0]), `"step":"reward.txt"`)
}

// TestHarborNoReward: a verifier that writes no reward is a no_grading row
// whose log holds the verifier's output; a verifier past its timeout_sec is
// a timeout.
func TestHarborNoReward(t *testing.T) {
	w := newWorld(t)
	silent := filepath.Join(t.TempDir(), "silent")
	require.NoError(t, os.CopyFS(silent, os.DirFS(harborFixture(t, "slugify-prebuilt"))))
	require.NoError(t, os.WriteFile(filepath.Join(silent, "tests", "test.sh"),
		[]byte("#!/bin/bash\necho the-verifier-said-this\nexit 2\n"), 0o755))
	slow := filepath.Join(t.TempDir(), "slow")
	require.NoError(t, os.CopyFS(slow, os.DirFS(harborFixture(t, "slugify-prebuilt"))))
	require.NoError(t, os.WriteFile(filepath.Join(slow, "tests", "test.sh"),
		[]byte("#!/bin/bash\nsleep 60\necho 1 > /logs/verifier/reward.txt\n"), 0o755))
	toml, err := os.ReadFile(filepath.Join(slow, "task.toml"))
	require.NoError(t, err)
	require.NoError(t, os.WriteFile(filepath.Join(slow, "task.toml"),
		[]byte(strings.Replace(string(toml), "timeout_sec = 120.0", "timeout_sec = 2.0", 1)), 0o644))

	tasks, imgs := w.harbor(t, "tasks/harbor-bad", silent, slow)
	_, rows := w.gradeWith(t, tasks, imgs, "--baseline", "--out", "grades/harbor-bad")
	require.Len(t, rows, 2)
	byID := map[string]records.Grade{}
	for _, g := range rows {
		byID[g.TaskID] = g
	}
	g := byID["silent"]
	assert.Equal(t, records.FailureNoGrading, g.Failure)
	assert.Contains(t, deref(g.Error), "wrote neither /logs/verifier/reward.json nor /logs/verifier/reward.txt")
	assert.EqualValues(t, 2, g.ExitCode)
	assert.Contains(t, w.gradingLog(t, g), "the-verifier-said-this")
	g = byID["slow"]
	assert.Equal(t, records.FailureTimeout, g.Failure, deref(g.Error))
	assert.EqualValues(t, 124, g.ExitCode)
	assert.Less(t, g.DurationMS, int64(50_000), "the task's timeout_sec, not --timeout, bounds the verifier")
}

// TestHarborBuiltEndToEnd chains kiln-images build of the Dockerfile
// fixture (FROM the fixture image, offline, with a RUN step) into
// kiln-grade in real bwrap sandboxes: the oracle (--solution) gets reward
// 1 and the empty patch 0, and the verifier sees what the RUN step wrote
// (the fixture's test.sh checks it). The whole test takes about 40 s (37 s
// on 2 shared cores at load 5 to 10), under the minute past which -short
// would skip it, so it runs under -short too.
func TestHarborBuiltEndToEnd(t *testing.T) {
	if _, err := exec.LookPath("buildah"); err != nil {
		testenv.SkipOrFail(t, "buildah is not installed: run scripts/install-test-deps.sh")
	}
	w := newWorld(t)
	r := kiln(t, "harbor", "--store", w.store, "--out", "tasks/built", harborFixture(t, "duration-dockerfile"))
	require.Equal(t, 0, r.Code, r.Stderr)
	tasks := r.LastLine()
	r = kiln(t, "build", "--store", w.store, "--tasks", tasks, "--bundles", w.bundles,
		"--build-cache", t.TempDir(), "--source", w.set.Repository+"=oci:"+w.set.Layout, "--out", "images/built")
	require.Equal(t, 0, r.Code, r.Stderr)
	assert.Contains(t, r.Stderr, "build: 1 image(s) built")
	imgs := r.LastLine()

	_, rows := w.gradeWith(t, tasks, imgs, "--solution", "--out", "grades/built-solution")
	require.Len(t, rows, 1)
	assert.Equal(t, 1.0, rows[0].Reward, "%s %s\n%s", rows[0].Failure, deref(rows[0].Error), w.gradingLog(t, rows[0]))
	assert.Equal(t, records.FailureNone, rows[0].Failure)

	_, rows = w.gradeWith(t, tasks, imgs, "--patches",
		writePatches(t, []patchLine{{TaskID: "duration-dockerfile", Patch: ""}}, true), "--out", "grades/built-empty")
	require.Len(t, rows, 1)
	assert.Equal(t, 0.0, rows[0].Reward, "%s %s", rows[0].Failure, deref(rows[0].Error))
	assert.Equal(t, records.FailureTestsFailed, rows[0].Failure, deref(rows[0].Error))
}
