package images_test

import (
	"context"
	"encoding/json"
	"os"
	"path/filepath"
	"strings"
	"testing"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/kilnrl/kiln/fixtures"
	"github.com/kilnrl/kiln/formats/dataset"
	"github.com/kilnrl/kiln/formats/records"
	fstore "github.com/kilnrl/kiln/formats/store"
	"github.com/kilnrl/kiln/internal/sandbox/sandboxtest"
	"github.com/kilnrl/kiln/internal/stagecmd"
)

// addFile is a git diff adding a file of one line.
func addFile(name string) string {
	return "diff --git a/" + name + " b/" + name + "\nnew file mode 100644\n--- /dev/null\n+++ b/" + name + "\n@@ -0,0 +1 @@\n+fixed\n"
}

// evalTaskRow is a reference tasks row graded by an eval_cmd on image, with
// a gold patch in metadata "patch" unless gold is "".
func evalTaskRow(id, image, workdir, evalCmd, gold string) string {
	md := map[string]any{"instance_id": id, "image": image, "workdir": workdir, "eval_cmd": evalCmd}
	if gold != "" {
		md["patch"] = gold
	}
	b, _ := json.Marshal(map[string]any{"prompt": "p " + id, "label": id, "metadata": md})
	return string(b)
}

func gradeRows(t *testing.T, store, ref string) map[string]records.Grade {
	t.Helper()
	st, err := fstore.Open(store)
	require.NoError(t, err)
	v, err := dataset.OpenString(context.Background(), st, ref)
	require.NoError(t, err)
	out := map[string]records.Grade{}
	require.NoError(t, v.EachShard(context.Background(), func(_ int, data []byte) error {
		return records.EachGrade(data, func(g records.Grade) error {
			out[g.TaskID+"/"+string(rune('0'+g.Sample))] = g
			return nil
		})
	}))
	return out
}

// TestVerifyGate runs the gate in real bwrap sandboxes on layered bundles
// of the fixture images (imported fresh: every image shares the base
// layer, unpacked once):
//   - import --verify on the four fixture tasks with their gold patches:
//     every image ok, exit 0, the grades dataset holds an empty-patch row
//     that fails and a gold row that passes per task, the images reference
//     is the last stdout line;
//   - verify on deliberately broken tasks of one fixture image: tests that
//     pass without the fix, a gold patch that does not fix, an image that
//     lacks a file the tests need are each refused by name with exit 5; a
//     good task with its gold patch in metadata and a baseline-only task
//     pass; the image line says REFUSED.
func TestVerifyGate(t *testing.T) {
	sandboxtest.Require(t)
	set, err := fixtures.Load(context.Background())
	require.NoError(t, err)
	helper := t.TempDir()
	_, err = sandboxtest.BuildHelper(helper)
	require.NoError(t, err)
	t.Setenv("PATH", helper+string(os.PathListSeparator)+os.Getenv("PATH"))
	store, root := t.TempDir(), t.TempDir()
	source := set.Repository + "=oci:" + set.Layout

	t.Run("fixtures pass", func(t *testing.T) {
		r := kiln(t, "convert", "mimo", "--store", store, "--data", set.MiMoDir, "--out", "tasks/mimo")
		require.Equal(t, 0, r.Code, r.Stderr)
		tasks := r.LastLine()
		r = kiln(t, "images", "import", "--store", store, "--tasks", tasks, "--bundles", root, "--source", source,
			"--out", "images/mimo", "--verify", "--verify-out", "verify/mimo", "--gold", set.GoldPatches)
		require.Equal(t, 0, r.Code, r.Stderr)
		lines := strings.Split(strings.TrimSpace(r.Stdout), "\n")
		require.GreaterOrEqual(t, len(lines), 2, r.Stdout)
		assert.True(t, strings.HasPrefix(lines[len(lines)-1], "images/mimo@"), "the images reference is the last line: %q", r.Stdout)
		verifyRef := lines[len(lines)-2]
		assert.True(t, strings.HasPrefix(verifyRef, "verify/mimo@"), r.Stdout)
		images := 0
		for _, l := range lines {
			if strings.HasPrefix(l, "image\t") {
				images++
				assert.Contains(t, l, "\tok\t", l)
				assert.Contains(t, l, "refused=0", l)
			}
		}
		assert.Equal(t, len(set.Tasks), images, r.Stdout)
		// The bundles graded are the layered form, over one shared base layer.
		for _, task := range set.Tasks {
			hex := strings.TrimPrefix(task.ManifestDigest, "sha256:")
			assert.FileExists(t, filepath.Join(root, "sha256", hex, "lowers"))
		}
		rows := gradeRows(t, store, verifyRef)
		require.Len(t, rows, 2*len(set.Tasks))
		for _, task := range set.Tasks {
			empty, gold := rows[task.ID+"/0"], rows[task.ID+"/1"]
			assert.Equal(t, float64(0), empty.Reward, task.ID)
			assert.Equal(t, records.FailureTestsFailed, empty.Failure, task.ID)
			assert.Equal(t, float64(1), gold.Reward, "%s: %s %v", task.ID, gold.Failure, gold.Error)
			require.NotNil(t, gold.ImageDigest)
			assert.Equal(t, task.ManifestDigest, *gold.ImageDigest)
		}
	})

	t.Run("broken tasks are refused", func(t *testing.T) {
		im, wd := set.Tasks[0].Image, set.Tasks[0].Workdir
		fixed := "test -f " + wd + "/kiln-fixed"
		tasks := importTasks(t, store,
			evalTaskRow("good", im, wd, fixed, addFile("kiln-fixed")),
			evalTaskRow("baseline-only", im, wd, fixed, ""),
			evalTaskRow("passes-anyway", im, wd, "true", ""),
			evalTaskRow("gold-does-not-fix", im, wd, fixed, addFile("kiln-other")),
			evalTaskRow("image-lacks-file", im, wd, fixed+" && test -f /opt/kiln-tests/data.json", addFile("kiln-fixed")),
		)
		r := kiln(t, "images", "import", "--store", store, "--tasks", tasks, "--bundles", root, "--source", source, "--out", "images/broken")
		require.Equal(t, 0, r.Code, r.Stderr)
		images := r.LastLine()
		r = kiln(t, "images", "verify", "--store", store, "--tasks", tasks, "--images", images, "--bundles", root, "--out", "verify/broken")
		require.Equal(t, stagecmd.ExitBadInput, r.Code, r.Stderr)
		ref := r.LastLine()
		assert.True(t, strings.HasPrefix(ref, "verify/broken@"), r.Stdout)
		assert.Contains(t, r.Stdout, "image\t"+im+"\t"+set.Tasks[0].ManifestDigest+"\tREFUSED\ttasks=5 gold=3 baseline_only=2 refused=3")
		for _, c := range []struct{ task, says string }{
			{"passes-anyway", "the tests PASS with the empty patch"},
			{"gold-does-not-fix", "the gold patch FAILS: tests_failed"},
			{"image-lacks-file", "the gold patch FAILS: tests_failed"},
		} {
			assert.Contains(t, r.Stderr, `task "`+c.task+`" (image `+im+`): `+c.says, r.Stderr)
		}
		for _, ok := range []string{"good", "baseline-only"} {
			assert.NotContains(t, r.Stderr, `task "`+ok+`"`)
		}
		rows := gradeRows(t, store, ref)
		assert.Len(t, rows, 8, "5 empty patches, 3 gold patches")
		assert.Equal(t, float64(1), rows["good/1"].Reward, "the gold patch from metadata passes")
		assert.Equal(t, float64(1), rows["passes-anyway/0"].Reward)
	})
}
