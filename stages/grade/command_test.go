package grade

import (
	"bytes"
	"context"
	"encoding/json"
	"io"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/kilnrl/kiln/formats/dataset"
	"github.com/kilnrl/kiln/formats/records"
	"github.com/kilnrl/kiln/formats/store"
	"github.com/kilnrl/kiln/internal/sandbox"
	"github.com/kilnrl/kiln/internal/stagecmd"
)

const testDigest = "sha256:0123456789abcdef0123456789abcdef0123456789abcdef0123456789abcdef"

// commit writes one version of a dataset holding the rows encode writes.
func commit(t *testing.T, st store.Store, name string, kind records.Kind, rows int, encode func(io.Writer) error) string {
	t.Helper()
	ctx := context.Background()
	w, err := dataset.NewWriter(ctx, st, dataset.Spec{Name: name, Kind: kind, Identity: dataset.Identity{Stage: "test", Args: map[string]any{"t": t.Name(), "at": time.Now().UnixNano()}}})
	require.NoError(t, err)
	_, err = w.WriteShard(ctx, int64(rows), nil, encode)
	require.NoError(t, err)
	res, err := w.Commit(ctx, nil)
	require.NoError(t, err)
	return res.Ref.String()
}

// hostWorld is a store with tasks and images whose "image" is a host
// directory: each task's workdir is a host git repository graded by a
// hostSandbox grader.
type hostWorld struct {
	st      store.Store
	tasks   string
	images  string
	bundles string
	repos   map[string]string // task id -> workdir on the host
	env     *stagecmd.Env
	stdout  *bytes.Buffer
	stderr  *bytes.Buffer
}

// newHostWorld makes tasks whose eval_cmd passes iff fixed.txt says fixed
// (task "pass-always" passes with any patch). Task i has split train when
// i is even, eval otherwise.
func newHostWorld(t *testing.T, ids ...string) *hostWorld {
	t.Helper()
	st, err := store.NewLocal(t.TempDir())
	require.NoError(t, err)
	w := &hostWorld{st: st, bundles: t.TempDir(), repos: map[string]string{}, stdout: &bytes.Buffer{}, stderr: &bytes.Buffer{}}
	w.env = &stagecmd.Env{Stdout: w.stdout, Stderr: w.stderr, Log: stagecmd.NewLogger(w.stderr, false)}
	require.NoError(t, os.MkdirAll(filepath.Join(w.bundles, "b1", "rootfs"), 0o755))
	var tasks []records.Task
	for i, id := range ids {
		repo := gitRepo(t, map[string]string{"fixed.txt": "broken\n"})
		w.repos[id] = repo
		cmd := "grep -qx fixed fixed.txt"
		if id == "pass-always" {
			cmd = "true"
		}
		grading, _ := json.Marshal(map[string]string{"kind": "eval_cmd", "eval_cmd": cmd})
		split := []string{"train", "eval"}[i%2]
		image, gs := "img:"+id, string(grading)
		tasks = append(tasks, records.Task{TaskID: id, TaskIndex: int64(i), Prompt: `"p"`, Metadata: "{}", Image: &image,
			Workdir: &repo, Grading: &gs, Split: &split})
	}
	w.tasks = commit(t, st, "tasks", records.TasksKind(), len(tasks), func(out io.Writer) error {
		enc := records.NewTaskEncoder(out)
		if err := enc.Write(tasks...); err != nil {
			return err
		}
		return enc.Close()
	})
	var images []records.Image
	for _, id := range ids {
		images = append(images, records.Image{Image: "img:" + id, Digest: testDigest, Bundle: "b1", Env: `{"PATH":"/usr/bin:/bin","LANG":"C"}`, Command: "[]"})
	}
	w.images = commit(t, st, "images", records.ImagesKind(), len(images), func(out io.Writer) error {
		enc := records.NewImageEncoder(out)
		if err := enc.Write(images...); err != nil {
			return err
		}
		return enc.Close()
	})
	return w
}

// options grade one patch at a time: host sandboxes share the scratch
// directory (real sandboxes each have their own /tmp).
func (w *hostWorld) options(g *Grader) Options {
	return Options{Tasks: w.tasks, Images: w.images, Bundles: w.bundles, Jobs: 1, Timeout: time.Minute, Grader: g}
}

// grader returns a host grader that restores the world's repositories at
// every boot.
func (w *hostWorld) grader(t *testing.T) (*Grader, *hostBoots) {
	g, boots := hostGrader(t, time.Minute)
	for _, repo := range w.repos {
		boots.reset = append(boots.reset, repo)
	}
	return g, boots
}

func (w *hostWorld) run(ctx context.Context, o Options) (dataset.Result, error) {
	return Run(ctx, w.env, w.st, stagecmd.Output{Name: "grades"}, o)
}

func (w *hostWorld) grades(t *testing.T, ref dataset.Ref) []records.Grade {
	t.Helper()
	v, err := dataset.Open(context.Background(), w.st, ref)
	require.NoError(t, err)
	var out []records.Grade
	require.NoError(t, v.EachShard(context.Background(), func(_ int, data []byte) error {
		return records.EachGrade(data, func(g records.Grade) error { out = append(out, g); return nil })
	}))
	return out
}

func byIndex(rows []records.Grade) map[int64]records.Grade {
	m := map[int64]records.Grade{}
	for _, r := range rows {
		m[r.Index] = r
	}
	return m
}

func writeFile(t *testing.T, body string) string {
	t.Helper()
	p := filepath.Join(t.TempDir(), "patches.jsonl")
	require.NoError(t, os.WriteFile(p, []byte(body), 0o644))
	return p
}

const fixPatch = "diff --git a/fixed.txt b/fixed.txt\n--- a/fixed.txt\n+++ b/fixed.txt\n@@ -1 +1 @@\n-broken\n+fixed\n"

func jsonString(s string) string { b, _ := json.Marshal(s); return string(b) }

func TestRunPatchesFormats(t *testing.T) {
	cases := []struct {
		name, body string
	}{
		{"kiln jsonl", `{"task_id":"a","patch":` + jsonString(fixPatch) + `}` + "\n\n" + `{"task_id":"a","patch":"","sample":7}` + "\n" + `{"task_id":"b","patch":"diff --git a/nope b/nope\n--- a/nope\n+++ b/nope\n@@ -1 +1 @@\n-x\n+y\n"}`},
		{"swe-bench jsonl", `{"instance_id":"a","model_name_or_path":"m","model_patch":` + jsonString(fixPatch) + `}` + "\n" + `{"instance_id":"a","model_patch":null,"sample":7}` + "\n" + `{"instance_id":"b","model_patch":"diff --git a/nope b/nope\n--- a/nope\n+++ b/nope\n@@ -1 +1 @@\n-x\n+y\n"}` + "\n"},
		{"swe-bench json array", ` [{"instance_id":"a","model_patch":` + jsonString(fixPatch) + `}, {"instance_id":"a","model_patch":"","sample":7}, {"instance_id":"b","model_patch":"diff --git a/nope b/nope\n--- a/nope\n+++ b/nope\n@@ -1 +1 @@\n-x\n+y\n"}]`},
	}
	for _, c := range cases {
		t.Run(c.name, func(t *testing.T) {
			w := newHostWorld(t, "a", "b")
			g, _ := w.grader(t)
			o := w.options(g)
			o.Patches = writeFile(t, c.body)
			res, err := w.run(context.Background(), o)
			require.NoError(t, err, w.stderr.String())
			rows := byIndex(w.grades(t, res.Ref))
			require.Len(t, rows, 3)
			assert.Equal(t, records.Grade{RolloutID: 0, Index: 0, GroupIndex: 0, Sample: 0, TaskID: "a", Reward: 1, Applied: true},
				records.Grade{RolloutID: rows[0].RolloutID, Index: rows[0].Index, GroupIndex: rows[0].GroupIndex, Sample: rows[0].Sample,
					TaskID: rows[0].TaskID, Reward: rows[0].Reward, Applied: rows[0].Applied})
			assert.Equal(t, ApplyGit, *rows[0].ApplyMethod)
			assert.Equal(t, testDigest, *rows[0].ImageDigest)
			assert.Equal(t, KindEvalCmd, *rows[0].GradingKind)
			assert.Equal(t, int64(7), rows[1].Sample)
			assert.Equal(t, 0.0, rows[1].Reward)
			assert.Equal(t, records.FailureTestsFailed, rows[1].Failure)
			assert.Equal(t, "b", rows[2].TaskID)
			assert.Equal(t, int64(1), rows[2].GroupIndex)
			assert.False(t, rows[2].Applied)
			assert.Equal(t, records.FailurePatchFailed, rows[2].Failure)
			// Each row's log is in the store under its key.
			for _, r := range rows {
				require.NotNil(t, r.Log)
				assert.True(t, strings.HasPrefix(*r.Log, "grades/_v/"+res.Ref.Version+"/attachments/logs/"), *r.Log)
				data, _, err := store.ReadAll(context.Background(), w.st, *r.Log)
				require.NoError(t, err)
				assert.Contains(t, string(data), `"task_id":"`+r.TaskID+`"`)
			}
			assert.Equal(t, float64(3), res.Version.Metrics["graded"])
			assert.Equal(t, float64(1), res.Version.Metrics["reward_1"])
			assert.Equal(t, float64(1), res.Version.Metrics["failure_patch_failed"])
			// The reference is the last line of stdout.
			assert.Equal(t, res.Ref.String()+"\n", w.stdout.String())
		})
	}
}

func TestRunBadInputs(t *testing.T) {
	w := newHostWorld(t, "a")
	g, boots := w.grader(t)
	cases := []struct {
		name   string
		edit   func(o *Options)
		code   int
		errSub string
	}{
		{"unknown task", func(o *Options) {
			o.Patches = writeFile(t, `{"task_id":"a","patch":""}`+"\n"+`{"task_id":"zzz","patch":""}`)
		}, stagecmd.ExitBadInput, `row 2: task "zzz" is not in tasks`},
		{"no patch key", func(o *Options) { o.Patches = writeFile(t, `{"task_id":"a"}`) }, stagecmd.ExitBadInput, `row 1 (task "a"): no "patch" key`},
		{"not json", func(o *Options) { o.Patches = writeFile(t, `{"task_id":`) }, stagecmd.ExitBadInput, `row 1: not a JSON object`},
		{"neither shape", func(o *Options) { o.Patches = writeFile(t, `{"id":"a"}`) }, stagecmd.ExitBadInput, `want {"task_id", "patch"}`},
		{"unterminated array", func(o *Options) { o.Patches = writeFile(t, `[{"instance_id":"a","model_patch":""}`) }, stagecmd.ExitBadInput, "the array is not closed"},
		{"garbage after the array", func(o *Options) { o.Patches = writeFile(t, `[{"instance_id":"a","model_patch":""}] {}`) }, stagecmd.ExitBadInput, "after the closing ']'"},
		{"empty patches", func(o *Options) { o.Patches = writeFile(t, "") }, stagecmd.ExitBadInput, "is empty"},
		{"empty array", func(o *Options) { o.Patches = writeFile(t, " []\n") }, stagecmd.ExitBadInput, "empty array"},
		{"two sources", func(o *Options) { o.Patches = writeFile(t, ""); o.Baseline = true }, stagecmd.ExitUsage, "exactly one of"},
		{"no bundles", func(o *Options) { o.Baseline = true; o.Bundles = "" }, stagecmd.ExitUsage, "--bundles DIR is required"},
		{"bundles missing", func(o *Options) { o.Baseline = true; o.Bundles = filepath.Join(t.TempDir(), "none") }, stagecmd.ExitUsage, "is not a directory"},
		{"missing patches file", func(o *Options) { o.Patches = filepath.Join(t.TempDir(), "none.jsonl") }, stagecmd.ExitNotFound, "none.jsonl"},
		{"bad sandbox", func(o *Options) { o.Baseline = true; o.Provider = "docker" }, stagecmd.ExitUsage, `--sandbox "docker"`},
		{"absurd jobs", func(o *Options) { o.Baseline = true; o.Jobs = 1 << 20 }, stagecmd.ExitUsage, "--jobs 1048576: want 1 to 4096"},
	}
	for _, c := range cases {
		t.Run(c.name, func(t *testing.T) {
			o := w.options(g)
			c.edit(&o)
			_, err := w.run(context.Background(), o)
			require.Error(t, err)
			assert.Contains(t, err.Error(), c.errSub)
			assert.Equal(t, c.code, stagecmd.ExitCode(err), err.Error())
			vs, lerr := dataset.List(context.Background(), w.st, "grades")
			require.NoError(t, lerr)
			assert.Empty(t, vs, "no grades version may be visible")
		})
	}
	assert.Equal(t, 0, boots.n, "nothing was graded")
}

func TestRunImageNotImported(t *testing.T) {
	w := newHostWorld(t, "a")
	// Images of another tasks set: task a's image is missing.
	w.images = commit(t, w.st, "images", records.ImagesKind(), 1, func(out io.Writer) error {
		enc := records.NewImageEncoder(out)
		if err := enc.Write(records.Image{Image: "other", Digest: testDigest, Bundle: "b1", Env: "{}", Command: "[]"}); err != nil {
			return err
		}
		return enc.Close()
	})
	g, _ := w.grader(t)
	o := w.options(g)
	o.Baseline = true
	_, err := w.run(context.Background(), o)
	require.Error(t, err)
	assert.Contains(t, err.Error(), `image "img:a" of task "a" is not in images`)
	assert.Equal(t, stagecmd.ExitBadInput, stagecmd.ExitCode(err))
}

// Rollouts rows keep their ids; aborted ones get a row without grading.
func TestRunRollouts(t *testing.T) {
	w := newHostWorld(t, "a", "b")
	start := time.Date(2026, 1, 2, 3, 4, 5, 0, time.UTC)
	abort := "wall_clock_timeout"
	detail := "the run passed its deadline of 1m0s:\n  sandbox 0e7c3b754306: context deadline exceeded"
	rows := []records.Rollout{
		{RolloutID: 10, Index: 10, GroupIndex: 5, Sample: 0, TaskID: "a", Agent: "shell", Patch: fixPatch, StartedAt: start, EndedAt: start},
		{RolloutID: 11, Index: 11, GroupIndex: 5, Sample: 1, TaskID: "a", Agent: "shell", Patch: "", StartedAt: start, EndedAt: start},
		{RolloutID: 12, Index: 12, GroupIndex: 6, Sample: 0, TaskID: "b", Agent: "shell", Patch: fixPatch, AbortReason: &abort,
			AbortDetail: &detail, StartedAt: start, EndedAt: start},
	}
	ref := commit(t, w.st, "rollouts", records.RolloutsKind(), len(rows), func(out io.Writer) error {
		enc := records.NewRolloutEncoder(out)
		if err := enc.Write(rows...); err != nil {
			return err
		}
		return enc.Close()
	})
	g, boots := w.grader(t)
	o := w.options(g)
	o.Rollouts = ref
	res, err := w.run(context.Background(), o)
	require.NoError(t, err, w.stderr.String())
	got := byIndex(w.grades(t, res.Ref))
	require.Len(t, got, 3)
	assert.Equal(t, 1.0, got[10].Reward)
	assert.Equal(t, int64(5), got[10].GroupIndex)
	assert.Equal(t, int64(10), got[10].RolloutID)
	assert.Equal(t, 0.0, got[11].Reward)
	assert.Equal(t, int64(1), got[11].Sample)
	assert.Equal(t, records.FailureAborted, got[12].Failure)
	require.NotNil(t, got[12].Error)
	// The grade's one-line error carries the rollout's abort_detail.
	assert.Equal(t, "the rollout was aborted: wall_clock_timeout: the run passed its deadline of 1m0s: sandbox 0e7c3b754306: context deadline exceeded",
		*got[12].Error)
	assert.Nil(t, got[12].Log)
	assert.Equal(t, 2, boots.n, "the aborted rollout is not graded")
	assert.Contains(t, w.stderr.String(), "grade: 3 graded: reward 1: 1, reward 0: 2 (tests_failed 1, aborted 1)\n")
}

// A run interrupted midway keeps what it graded; the rerun grades only
// the rest and commits the same version.
func TestRunResumes(t *testing.T) {
	w := newHostWorld(t, "a")
	var lines []string
	for range 5 {
		lines = append(lines, `{"task_id":"a","patch":`+jsonString(fixPatch)+`}`)
	}
	patches := writeFile(t, strings.Join(lines, "\n"))

	ctx, cancel := context.WithCancel(context.Background())
	g, boots := w.grader(t)
	boot := g.Boot
	g.Boot = func(bctx context.Context, o sandbox.Options) (sandbox.Sandbox, error) {
		if boots.n == 2 { // the third grading is interrupted
			cancel()
			return nil, bctx.Err()
		}
		return boot(bctx, o)
	}
	o := w.options(g)
	o.Patches, o.Jobs = patches, 1
	_, err := w.run(ctx, o)
	require.ErrorIs(t, err, context.Canceled)
	assert.Equal(t, stagecmd.ExitCancelled, stagecmd.ExitCode(err))
	assert.Equal(t, 2, boots.n)

	g2, boots2 := w.grader(t)
	o.Grader = g2
	res, err := w.run(context.Background(), o)
	require.NoError(t, err, w.stderr.String())
	assert.Equal(t, 3, boots2.n, "only the three missing rows are graded")
	rows := w.grades(t, res.Ref)
	require.Len(t, rows, 5)
	idx := byIndex(rows)
	for i := range int64(5) {
		assert.Equal(t, 1.0, idx[i].Reward, "row %d", i)
	}
	assert.Equal(t, float64(2), res.Version.Metrics["resumed"])
	assert.Contains(t, w.stderr.String(), "grade: 3 graded: reward 1: 3, reward 0: 0; 2 resumed from an earlier attempt\n")

	// A third run finds the version committed and grades nothing.
	g3, boots3 := w.grader(t)
	o.Grader = g3
	res3, err := w.run(context.Background(), o)
	require.NoError(t, err)
	assert.Equal(t, res.Ref, res3.Ref)
	assert.Equal(t, 0, boots3.n)
}

func TestRunBaselineFlagsPassingTasks(t *testing.T) {
	w := newHostWorld(t, "a", "pass-always", "c")
	g, _ := w.grader(t)
	o := w.options(g)
	o.Baseline = true
	res, err := w.run(context.Background(), o)
	require.NoError(t, err, w.stderr.String())
	rows := w.grades(t, res.Ref)
	require.Len(t, rows, 3)
	for _, r := range rows {
		assert.True(t, r.Baseline)
		assert.Equal(t, r.GroupIndex, r.Index)
		assert.Equal(t, r.TaskID == "pass-always", r.Reward == 1, r.TaskID)
	}
	assert.Contains(t, w.stderr.String(), "baseline: 1 of 3 tasks PASS with the empty patch")
	assert.Contains(t, w.stderr.String(), "pass-always")
	assert.Equal(t, float64(1), res.Version.Metrics["baseline_passing"])
	assert.Equal(t, "pass-always", res.Version.Metrics["baseline_passing_tasks"])

	// --split selects tasks.
	w.stderr.Reset()
	o.Split = "eval"
	res, err = w.run(context.Background(), o)
	require.NoError(t, err)
	rows = w.grades(t, res.Ref)
	require.Len(t, rows, 1)
	assert.Equal(t, "pass-always", rows[0].TaskID)
	assert.Equal(t, float64(2), res.Version.Metrics["skipped_other_split"])

	o.Split = "nope"
	_, err = w.run(context.Background(), o)
	assert.ErrorContains(t, err, `has no task of split "nope"`)
}

// Sharded runs split the rows and together commit one version.
func TestRunShards(t *testing.T) {
	w := newHostWorld(t, "a", "b", "c")
	g, boots := w.grader(t)
	o := w.options(g)
	o.Baseline = true
	var last dataset.Result
	for i := range 2 {
		res, err := Run(context.Background(), w.env, w.st, stagecmd.Output{Name: "grades", Part: dataset.Part{Index: i, Count: 2}}, o)
		require.NoError(t, err, w.stderr.String())
		last = res
	}
	assert.Equal(t, 3, boots.n)
	require.True(t, last.Committed)
	assert.Len(t, w.grades(t, last.Ref), 3)
}

// --print-version names the version without grading; the run then commits
// exactly that version.
func TestRunPrintVersion(t *testing.T) {
	w := newHostWorld(t, "a")
	g, boots := w.grader(t)
	o := w.options(g)
	o.Baseline = true
	res, err := Run(context.Background(), w.env, w.st, stagecmd.Output{Name: "grades", PrintVersion: true}, o)
	require.NoError(t, err)
	assert.Equal(t, 0, boots.n)
	assert.Equal(t, res.Ref.String()+"\n", w.stdout.String())
	got, err := w.run(context.Background(), o)
	require.NoError(t, err)
	assert.Equal(t, res.Ref, got.Ref)
	assert.Equal(t, 1, boots.n)
}
