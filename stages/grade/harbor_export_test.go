package grade_test

import (
	"archive/tar"
	"bytes"
	"context"
	"encoding/json"
	"io"
	"os"
	"path/filepath"
	"testing"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/kilnrl/kiln/formats/dataset"
	"github.com/kilnrl/kiln/formats/records"
	"github.com/kilnrl/kiln/formats/store"
	"github.com/kilnrl/kiln/internal/harbor"
	"github.com/kilnrl/kiln/internal/stagecmd/stagetest"
	"github.com/kilnrl/kiln/stages/datasets"
	"github.com/kilnrl/kiln/stages/grade"
)

// readTasks reads a tasks version of w's store.
func (w *world) readTasks(t testing.TB, ref string) (*dataset.Version, []records.Task) {
	t.Helper()
	st, err := store.Open(w.store)
	require.NoError(t, err)
	v, err := dataset.OpenString(context.Background(), st, ref)
	require.NoError(t, err)
	var rows []records.Task
	require.NoError(t, v.EachShard(context.Background(), func(_ int, data []byte) error {
		return records.EachTask(data, func(task records.Task) error { rows = append(rows, task); return nil })
	}))
	return v, rows
}

// tarFile is one file of a packed directory (harbor.TarDir).
func tarFile(t testing.TB, data []byte, name string) string {
	t.Helper()
	tr := tar.NewReader(bytes.NewReader(data))
	for {
		h, err := tr.Next()
		require.NoError(t, err, "no %s in the packed directory", name)
		if h.Name == name {
			b, err := io.ReadAll(tr)
			require.NoError(t, err)
			return string(b)
		}
	}
}

// TestHarborExportRoundTrip exports the fixture tasks of every source
// format as Harbor task directories (kiln export --format harbor),
// converts those back with kiln-convert harbor and grades them in real
// bwrap sandboxes: the MiMo tasks' verifier runs the very eval_cmd the
// MiMo tasks have, and for every format the gold patch (as a patch and as
// the oracle solution/solve.sh) gets reward 1 and the empty patch 0, as
// the original tasks do (TestFixturesEndToEnd, TestFixturesOtherGradingKinds).
func TestHarborExportRoundTrip(t *testing.T) {
	w := newWorld(t)
	sources := []struct {
		kind, tasks string
	}{
		{"eval_cmd", w.tasks},
		{"swebench", w.convert(t, "swebench", "--data", w.set.SWEBenchJSONL, "--out", "tasks/swebench")},
		{"swepro", w.convert(t, "swepro", "--data", w.set.SWEProJSONL, "--scripts", w.set.SWEProScripts, "--out", "tasks/swepro")},
		{"f2p", w.convert(t, "f2p", "--data", w.set.F2PJSONL, "--out", "tasks/f2p")},
	}
	gold := map[string]string{}
	for _, task := range w.set.Tasks {
		gold[task.ID] = task.GoldPatch
	}
	if testing.Short() {
		sources = sources[:1] // the acceptance case: MiMo
	}
	for _, src := range sources {
		t.Run(src.kind, func(t *testing.T) {
			out := filepath.Join(t.TempDir(), "harbor-"+src.kind)
			r := stagetest.Run(t, datasets.Commands, "export", "--store", w.store, "--format", "harbor",
				"--solutions", w.set.GoldPatches, "--out", out, src.tasks)
			require.Equal(t, 0, r.Code, r.Stderr)
			var summary struct {
				Output string `json:"output"`
				Tasks  int    `json:"tasks"`
			}
			require.NoError(t, json.Unmarshal([]byte(r.LastLine()), &summary))
			assert.Equal(t, out, summary.Output)
			_, orig := w.readTasks(t, src.tasks)
			require.Equal(t, len(orig), summary.Tasks)

			tasks, imgs := w.harbor(t, "tasks/harbor-rt-"+src.kind, out)
			v, back := w.readTasks(t, tasks)
			require.Len(t, back, len(orig))
			byID := map[string]records.Task{}
			for _, task := range back {
				byID[task.TaskID] = task
			}
			var lines []patchLine
			for _, o := range orig {
				b, ok := byID[o.TaskID]
				require.True(t, ok, "task %q lost in the round trip", o.TaskID)
				assert.Equal(t, *o.Image, *b.Image)
				assert.Equal(t, *o.Workdir, *b.Workdir)
				assert.Equal(t, *o.ProblemStatement, *b.ProblemStatement)
				g, err := grade.ParseGrading(b.Grading)
				require.NoError(t, err)
				require.NotNil(t, g.Harbor)
				assert.NotEmpty(t, g.Harbor.Solution, "the gold patch is the oracle")
				if src.kind == "eval_cmd" {
					og, err := grade.ParseGrading(o.Grading)
					require.NoError(t, err)
					rc, _, err := v.OpenAttachment(context.Background(), g.Harbor.Tests)
					require.NoError(t, err)
					data, err := io.ReadAll(rc)
					rc.Close()
					require.NoError(t, err)
					assert.Equal(t, og.EvalCmd, tarFile(t, data, "eval_cmd.sh"), "the verifier runs the task's own grading command")
				}
				lines = append(lines, patchLine{TaskID: o.TaskID, Patch: gold[o.TaskID]}, patchLine{TaskID: o.TaskID, Patch: "", Sample: 1})
			}

			_, rows := w.gradeWith(t, tasks, imgs, "--patches", writePatches(t, lines, true), "--out", "grades/rt-"+src.kind)
			require.Len(t, rows, len(lines))
			for _, g := range rows {
				want := 1.0
				if lines[g.Index].Patch == "" {
					want = 0
				}
				assert.Equal(t, want, g.Reward, "%s sample %d: %s %s\n%s", g.TaskID, g.Sample, g.Failure, deref(g.Error), w.gradingLog(t, g))
				assert.Contains(t, w.gradingLog(t, g), `"step":"reward.txt"`)
			}
			_, rows = w.gradeWith(t, tasks, imgs, "--solution", "--out", "grades/rt-solution-"+src.kind)
			require.Len(t, rows, len(orig))
			for _, g := range rows {
				assert.Equal(t, 1.0, g.Reward, "oracle of %s: %s %s\n%s", g.TaskID, g.Failure, deref(g.Error), w.gradingLog(t, g))
			}
		})
	}
}

// TestHarborExportOfHarborTasks: a task kiln converted from Harbor is
// exported as it was read (its task.toml keys, tests/, solution/ and, for
// a Dockerfile, environment/), so converting the export again gives the
// same grading payload.
func TestHarborExportOfHarborTasks(t *testing.T) {
	w := &world{store: t.TempDir()}
	dirs := []string{harborFixture(t, "slugify-prebuilt"), harborFixture(t, "calc-fraction"), harborFixture(t, "duration-dockerfile")}
	r := kiln(t, append([]string{"harbor", "--store", w.store, "--out", "tasks/h"}, dirs...)...)
	require.Equal(t, 0, r.Code, r.Stderr)
	_, orig := w.readTasks(t, r.LastLine())
	out := filepath.Join(t.TempDir(), "export")
	e := stagetest.Run(t, datasets.Commands, "export", "--store", w.store, "--format", "harbor", "--out", out, "tasks/h")
	require.Equal(t, 0, e.Code, e.Stderr)
	for _, d := range dirs {
		name := filepath.Base(d)
		if name == "calc-fraction" {
			name = harbor.ExportDirName("kiln-fixtures/calc-fraction")
		}
		for _, f := range []string{"tests/test.sh", "solution/solve.sh", "instruction.md"} {
			want, err := os.ReadFile(filepath.Join(d, f))
			require.NoError(t, err)
			got, err := os.ReadFile(filepath.Join(out, name, f))
			require.NoError(t, err, "%s/%s", name, f)
			assert.Equal(t, string(want), string(got), "%s/%s", name, f)
		}
	}
	_, err := os.Stat(filepath.Join(out, "duration-dockerfile", "environment", "Dockerfile"))
	assert.NoError(t, err, "a built image's context is exported")

	r = kiln(t, "harbor", "--store", w.store, "--out", "tasks/h-again", out)
	require.Equal(t, 0, r.Code, r.Stderr)
	_, back := w.readTasks(t, r.LastLine())
	require.Len(t, back, len(orig))
	byID := map[string]records.Task{}
	for _, b := range back {
		byID[b.TaskID] = b
	}
	for _, o := range orig {
		b, ok := byID[o.TaskID]
		require.True(t, ok, "task %q lost in the round trip", o.TaskID)
		assert.Equal(t, *o.Grading, *b.Grading, o.TaskID)
		assert.Equal(t, *o.Image, *b.Image, o.TaskID)
		assert.Equal(t, *o.Workdir, *b.Workdir, o.TaskID)
	}
}
