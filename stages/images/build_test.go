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

// harborDockerfileTask copies the Dockerfile fixture (fixtures/harbor) so a
// test can change it.
func harborDockerfileTask(t *testing.T) string {
	t.Helper()
	src, err := filepath.Abs("../../fixtures/harbor/duration-dockerfile")
	require.NoError(t, err)
	dst := filepath.Join(t.TempDir(), "duration-dockerfile")
	require.NoError(t, os.CopyFS(dst, os.DirFS(src)))
	return dst
}

// TestBuildHarborDockerfile builds the Dockerfile fixture (FROM the fixture
// image, resolved offline from the OCI layout, plus COPY and RUN steps)
// with buildah and imports it: the bundle holds what the RUN step wrote; a
// rerun builds nothing; a changed context builds again; a failing RUN is
// exit 5 naming the step with buildah's log.
func TestBuildHarborDockerfile(t *testing.T) {
	needTool(t, "buildah")
	if os.Geteuid() != 0 {
		testenv.SkipOrFail(t, "kiln-images build runs buildah as root (chroot isolation)")
	}
	if testing.Short() {
		t.Skip("builds an image three times (about a minute)")
	}
	set, err := fixtures.Load(context.Background())
	require.NoError(t, err)
	store, root := t.TempDir(), t.TempDir()
	src := set.Repository + "=oci:" + set.Layout
	task := harborDockerfileTask(t)

	convert := func() string {
		r := kiln(t, "convert", "harbor", "--store", store, task)
		require.Equal(t, 0, r.Code, r.Stderr)
		return r.LastLine()
	}
	build := func(tasks string) (int, string, string) {
		r := kiln(t, "images", "build", "--store", store, "--tasks", tasks, "--bundles", root, "--source", src, "--out", "images/harbor")
		return r.Code, r.Stderr, r.LastLine()
	}

	tasks := convert()
	code, stderr, ref := build(tasks)
	require.Equal(t, 0, code, stderr)
	assert.Contains(t, stderr, "build: 1 image(s) built, 0 reused")
	rows := exportRows(t, store, ref)
	require.Len(t, rows, 1)
	require.True(t, strings.HasPrefix(rows[0]["image"].(string), "kiln.local/harbor-build:"))
	assert.Equal(t, "/testbed", rows[0]["workdir"])
	rootfs := rootfsOf(t, filepath.Join(root, rows[0]["bundle"].(string)))
	run, err := os.ReadFile(filepath.Join(rootfs, "etc", "kiln-fixture-run-step"))
	require.NoError(t, err, "the RUN step's output is in the image")
	assert.True(t, strings.HasPrefix(string(run), "3\n"), "%q", run)
	copied, err := os.ReadFile(filepath.Join(rootfs, "etc", "kiln-fixture-built-by"))
	require.NoError(t, err, "the COPY step's file is in the image")
	assert.Equal(t, "kiln-images build\n", string(copied))
	_, err = os.Stat(filepath.Join(rootfs, "testbed", "timefmt", "duration.py"))
	require.NoError(t, err, "the FROM image's repository is there")

	// Unchanged: nothing is built; the same images version.
	code, stderr, ref2 := build(tasks)
	require.Equal(t, 0, code, stderr)
	assert.Contains(t, stderr, "build: 0 image(s) built, 1 reused")
	assert.Equal(t, ref, ref2)

	// A changed context builds again.
	require.NoError(t, os.WriteFile(filepath.Join(task, "environment", "built-by.txt"), []byte("changed\n"), 0o644))
	code, stderr, _ = build(convert())
	require.Equal(t, 0, code, stderr)
	assert.Contains(t, stderr, "build: 1 image(s) built, 0 reused")

	// A failing RUN step: exit 5 naming the step, with its log.
	df := filepath.Join(task, "environment", "Dockerfile")
	b, err := os.ReadFile(df)
	require.NoError(t, err)
	require.NoError(t, os.WriteFile(df, append(b, []byte("RUN echo kiln-step-output && exit 7\n")...), 0o644))
	code, stderr, _ = build(convert())
	require.Equal(t, 5, code, stderr)
	assert.Contains(t, stderr, `step "RUN echo kiln-step-output && exit 7" failed`)
	assert.Contains(t, stderr, "kiln-step-output", "the step's log")
	assert.Contains(t, stderr, `task "duration-dockerfile"`)
}

// A docker-compose environment is refused with what is unsupported.
func TestBuildRefusesCompose(t *testing.T) {
	store := t.TempDir()
	task := harborDockerfileTask(t)
	require.NoError(t, os.Remove(filepath.Join(task, "environment", "Dockerfile")))
	require.NoError(t, os.WriteFile(filepath.Join(task, "environment", "docker-compose.yaml"), []byte("services: {main: {build: .}}\n"), 0o644))
	r := kiln(t, "convert", "harbor", "--store", store, "--keep-ungradeable", task)
	require.Equal(t, 0, r.Code, r.Stderr)
	r = kiln(t, "images", "build", "--store", store, "--tasks", r.LastLine(), "--bundles", t.TempDir(), "--out", "images/x")
	require.Equal(t, 5, r.Code, r.Stderr)
	assert.Contains(t, r.Stderr, "docker-compose.yaml")
	assert.Contains(t, r.Stderr, "compose environments (several services, networks, volumes) are not supported")
}
