package images_test

import (
	"context"
	"os"
	"path/filepath"
	"strings"
	"testing"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/kilnrl/kiln/fixtures"
	"github.com/kilnrl/kiln/internal/testenv"
)

// TestFixtureImagesMatchUmoci imports the fixture task images (a
// debootstrap base layer plus a task layer each) and compares every
// rootfs with what `umoci unpack` makes of the same layout (under -short,
// the first image only: each has a ~370 MB base layer).
func TestFixtureImagesMatchUmoci(t *testing.T) {
	needTool(t, "umoci")
	// Not SkipOrFail: with the fixtures cached, CI needs no debootstrap.
	if _, err := os.Stat("/usr/sbin/debootstrap"); err != nil && !testenv.CI() {
		t.Skip("fixtures need debootstrap: run scripts/install-test-deps.sh")
	}
	set, err := fixtures.Load(context.Background())
	require.NoError(t, err)
	store, root := t.TempDir(), t.TempDir()
	var rows []string
	if testing.Short() {
		set.Tasks = set.Tasks[:1]
	}
	for _, task := range set.Tasks {
		rows = append(rows, tasksRow(task.ID, task.Image, task.Workdir))
	}
	tasks := importTasks(t, store, rows...)
	r := kiln(t, "images", "import", "--store", store, "--tasks", tasks, "--root", root, "--source", set.Repository+"=oci:"+set.Layout)
	require.Equal(t, 0, r.Code, r.Stderr)
	got := map[string]map[string]any{}
	for _, row := range exportRows(t, store, r.LastLine()) {
		got[row["image"].(string)] = row
	}
	for _, task := range set.Tasks {
		row := got[task.Image]
		require.NotNil(t, row, task.Image)
		assert.Equal(t, task.ManifestDigest, row["digest"])
		assert.Equal(t, task.Workdir, row["workdir"])
		rootfs := rootfsOf(t, filepath.Join(root, row["bundle"].(string)))
		fi, err := os.Stat(filepath.Join(rootfs, strings.TrimPrefix(task.Workdir, "/")))
		require.NoError(t, err, "the task repository is in the image")
		assert.True(t, fi.IsDir())
		t.Run(task.Tag, func(t *testing.T) {
			requireSameTree(t, walkTree(t, umociUnpack(t, set.Layout, task.Tag)), walkTree(t, rootfs))
		})
	}
}
