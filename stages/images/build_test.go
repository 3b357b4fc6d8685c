package images_test

import (
	"compress/gzip"
	"context"
	"fmt"
	"os"
	"path/filepath"
	"strings"
	"sync"
	"testing"

	"github.com/google/go-containerregistry/pkg/v1/empty"
	"github.com/google/go-containerregistry/pkg/v1/layout"
	"github.com/google/go-containerregistry/pkg/v1/mutate"
	"github.com/google/go-containerregistry/pkg/v1/tarball"
	"github.com/google/go-containerregistry/pkg/v1/types"
	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/kilnrl/kiln/fixtures"
	"github.com/kilnrl/kiln/internal/stagecmd/stagetest"
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

// gzipBase writes the Dockerfile fixture's base (the fixtures' image, whose
// layers are stored uncompressed) to a new OCI layout under dir with gzip
// layers, as a registry serves images, under the same ref name; it returns
// the layout. With oci the manifest, config and layers have OCI media types
// (buildah's oci: transport finds no other kind in an index), else Docker's
// (what Docker Hub serves, and what kiln must read too).
func gzipBase(t testing.TB, set *fixtures.Set, dir string, oci bool) string {
	t.Helper()
	idx, err := layout.ImageIndexFromPath(set.Layout)
	require.NoError(t, err)
	im, err := idx.IndexManifest()
	require.NoError(t, err)
	const tag = "fixture-duration-001"
	for _, d := range im.Manifests {
		if d.Annotations["org.opencontainers.image.ref.name"] != tag {
			continue
		}
		img, err := idx.Image(d.Digest)
		require.NoError(t, err)
		ls, err := img.Layers()
		require.NoError(t, err)
		cf, err := img.ConfigFile()
		require.NoError(t, err)
		out, layerType := empty.Image, types.DockerLayer
		if oci {
			out, layerType = mutate.ConfigMediaType(mutate.MediaType(out, types.OCIManifestSchema1), types.OCIConfigJSON), types.OCILayer
		}
		for _, l := range ls {
			gz, err := tarball.LayerFromOpener(l.Uncompressed, tarball.WithCompressionLevel(gzip.BestSpeed), tarball.WithMediaType(layerType))
			require.NoError(t, err)
			out, err = mutate.AppendLayers(out, gz)
			require.NoError(t, err)
		}
		out, err = mutate.ConfigFile(out, cf)
		require.NoError(t, err)
		lay := filepath.Join(dir, "gzip-base")
		p, err := layout.Write(lay, empty.Index)
		require.NoError(t, err)
		require.NoError(t, p.AppendImage(out, layout.WithAnnotations(map[string]string{"org.opencontainers.image.ref.name": tag})))
		return lay
	}
	t.Fatalf("the fixtures' layout has no %s", tag)
	return ""
}

// TestBuildFromGzipBase builds the Dockerfile fixture FROM a base whose
// layers are gzip-compressed (a registry's kind): kiln hands buildah the
// base decompressed, and the image it builds runs the RUN step on it. A
// second context FROM the same base reuses the base decompressed once
// (BUILD-CACHE/.bases: the same file, hard-linked, in both builds'
// layouts). The paths are relative, as a user types them: buildah runs
// elsewhere and must still find the build's layout. A build killed while
// decompressing leaves its partial layer in its own storage, which the next
// build removes with it.
func TestBuildFromGzipBase(t *testing.T) {
	needTool(t, "buildah")
	if os.Geteuid() != 0 {
		testenv.SkipOrFail(t, "kiln-images build runs buildah as root (chroot isolation)")
	}
	if testing.Short() {
		t.Skip("compresses the fixture image and builds on it twice (about 40 s)")
	}
	set, err := fixtures.Load(context.Background())
	require.NoError(t, err)
	lay := gzipBase(t, set, t.TempDir(), false)
	task := harborDockerfileTask(t)
	t.Chdir(t.TempDir())
	build := func() stagetest.Result {
		r := kiln(t, "convert", "harbor", "--store", "store", task)
		require.Equal(t, 0, r.Code, r.Stderr)
		return kiln(t, "images", "build", "--store", "store", "--tasks", r.LastLine(), "--bundles", "bundles",
			"--source", set.Repository+"=oci:"+lay, "--out", "images/harbor")
	}
	r := build()
	require.Equal(t, 0, r.Code, r.Stderr)
	assert.Contains(t, r.Stderr, "build: 1 image(s) built, 0 reused")
	rows := exportRows(t, "store", r.LastLine())
	require.Len(t, rows, 1)
	rootfs := rootfsOf(t, filepath.Join("bundles", rows[0]["bundle"].(string)))
	run, err := os.ReadFile(filepath.Join(rootfs, "etc", "kiln-fixture-run-step"))
	require.NoError(t, err, "the RUN step's output is in the image")
	assert.True(t, strings.HasPrefix(string(run), "3\n"), "%q", run)

	df := filepath.Join(task, "environment", "Dockerfile")
	b, err := os.ReadFile(df)
	require.NoError(t, err)
	require.NoError(t, os.WriteFile(df, append(b, []byte("RUN echo second > /etc/kiln-second\n")...), 0o644))
	// What a build killed mid-decompression leaves: its storage, its lock
	// file (the lock went with the process) and a partial layer in it.
	killed := filepath.Join("bundles", "harbor-build", "buildah", "s-killed")
	require.NoError(t, os.MkdirAll(filepath.Join(killed, "root"), 0o700))
	require.NoError(t, os.WriteFile(killed+".lock", nil, 0o644))
	require.NoError(t, os.WriteFile(filepath.Join(killed, "base-layer-1234"), make([]byte, 1<<20), 0o600))
	r = build()
	require.Equal(t, 0, r.Code, r.Stderr)
	assert.Contains(t, r.Stderr, "build: 1 image(s) built, 0 reused")
	left, err := os.ReadDir(filepath.Join("bundles", "harbor-build", "buildah"))
	require.NoError(t, err)
	assert.Empty(t, left, "the killed build's storage and partial layer, and this build's own storage, are removed")
	shared, err := filepath.Glob(filepath.Join("bundles", "harbor-build", ".bases", "blobs", "sha256", "*"))
	require.NoError(t, err)
	require.NotEmpty(t, shared, "the decompressed base's layers")
	for _, one := range shared {
		assert.Regexp(t, `^[0-9a-f]{64}$`, filepath.Base(one), "only complete layers, named by diff id")
	}
	layouts, err := filepath.Glob(filepath.Join("bundles", "harbor-build", "*", "layout"))
	require.NoError(t, err)
	require.Len(t, layouts, 2, "one layout a context")
	for _, one := range shared {
		si, err := os.Stat(one)
		require.NoError(t, err)
		for _, l := range layouts {
			li, err := os.Stat(filepath.Join(l, "blobs", "sha256", filepath.Base(one)))
			require.NoError(t, err)
			assert.True(t, os.SameFile(si, li), "%s holds its own copy of the base's layer %s", l, filepath.Base(one))
		}
	}
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

// TestBuildConcurrent runs three kiln-images builds at once on one build
// cache: two of one context, one of another. Each build has buildah
// storage of its own and a lock per context, so all three succeed, the
// shared context is built once (its second build waits, then reuses it),
// each image holds its own context, and no build storage is left behind.
func TestBuildConcurrent(t *testing.T) {
	needTool(t, "buildah")
	if os.Geteuid() != 0 {
		testenv.SkipOrFail(t, "kiln-images build runs buildah as root (chroot isolation)")
	}
	if testing.Short() {
		t.Skip("builds two images at once (about a minute)")
	}
	set, err := fixtures.Load(context.Background())
	require.NoError(t, err)
	store, root := t.TempDir(), t.TempDir()
	src := set.Repository + "=oci:" + set.Layout
	a, b := harborDockerfileTask(t), harborDockerfileTask(t)
	require.NoError(t, os.WriteFile(filepath.Join(b, "environment", "built-by.txt"), []byte("the other context\n"), 0o644))
	var tasks []string
	for i, dir := range []string{a, b} {
		r := kiln(t, "convert", "harbor", "--store", store, "--out", fmt.Sprintf("tasks/%d", i), dir)
		require.Equal(t, 0, r.Code, r.Stderr)
		tasks = append(tasks, r.LastLine())
	}
	runs := []string{tasks[0], tasks[1], tasks[0]}
	results := make([]stagetest.Result, len(runs))
	var wg sync.WaitGroup
	for i, tk := range runs {
		wg.Add(1)
		go func() {
			defer wg.Done()
			results[i] = kiln(t, "images", "build", "--store", store, "--tasks", tk, "--bundles", root, "--source", src,
				"--out", fmt.Sprintf("images/%d", i))
		}()
	}
	wg.Wait()
	built, reused := 0, 0
	for i, r := range results {
		require.Equal(t, 0, r.Code, "build %d: %s", i, r.Stderr)
		switch {
		case strings.Contains(r.Stderr, "build: 1 image(s) built, 0 reused"):
			built++
		case strings.Contains(r.Stderr, "build: 0 image(s) built, 1 reused"):
			reused++
		}
	}
	assert.Equal(t, 2, built, "one build per context")
	assert.Equal(t, 1, reused, "the context's second build reuses the first's")
	for i, want := range []string{"kiln-images build\n", "the other context\n", "kiln-images build\n"} {
		rows := exportRows(t, store, results[i].LastLine())
		require.Len(t, rows, 1)
		copied, err := os.ReadFile(filepath.Join(rootfsOf(t, filepath.Join(root, rows[0]["bundle"].(string))), "etc", "kiln-fixture-built-by"))
		require.NoError(t, err)
		assert.Equal(t, want, string(copied), "build %d", i)
	}
	left, err := os.ReadDir(filepath.Join(root, "harbor-build", "buildah"))
	require.NoError(t, err)
	assert.Empty(t, left, "every build removed its buildah storage")
}
