package images_test

import (
	"bufio"
	"bytes"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"sync"
	"syscall"
	"testing"
	"time"

	v1 "github.com/google/go-containerregistry/pkg/v1"
	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/kilnrl/kiln/stages/images"
)

// proc is a kiln process (the test binary in helper mode, see TestMain).
type proc struct {
	cmd    *exec.Cmd
	stdout bytes.Buffer
	mu     sync.Mutex
	stderr bytes.Buffer
	paused chan struct{}
	done   chan struct{}
}

func (p *proc) Stderr() string { p.mu.Lock(); defer p.mu.Unlock(); return p.stderr.String() }

func start(t *testing.T, env []string, args ...string) *proc {
	t.Helper()
	p := &proc{paused: make(chan struct{}, 1), done: make(chan struct{})}
	p.cmd = exec.Command(os.Args[0], args...)
	p.cmd.Env = append(append(os.Environ(), "KILN_TEST_HELPER=1"), env...)
	p.cmd.Stdout = &p.stdout
	pr, err := p.cmd.StderrPipe()
	require.NoError(t, err)
	require.NoError(t, p.cmd.Start())
	go func() {
		defer close(p.done)
		sc := bufio.NewScanner(pr)
		for sc.Scan() {
			p.mu.Lock()
			p.stderr.WriteString(sc.Text() + "\n")
			p.mu.Unlock()
			if strings.HasPrefix(sc.Text(), "PAUSED ") {
				p.paused <- struct{}{}
			}
		}
	}()
	t.Cleanup(func() { p.cmd.Process.Kill() })
	return p
}

func (p *proc) waitPaused(t *testing.T) {
	t.Helper()
	select {
	case <-p.paused:
	case <-p.done:
		t.Fatalf("process exited before pausing:\n%s", p.Stderr())
	case <-time.After(60 * time.Second):
		t.Fatalf("process never paused:\n%s", p.Stderr())
	}
}

func (p *proc) wait(t *testing.T) int {
	t.Helper()
	<-p.done
	err := p.cmd.Wait()
	if ee, ok := err.(*exec.ExitError); ok {
		return ee.ExitCode()
	}
	require.NoError(t, err)
	return 0
}

// bigFixture is one image of two layers with many entries, so a kill
// lands mid-layer.
func bigFixture(t *testing.T) (layoutDir, store, tasks string, digest v1.Hash) {
	t.Helper()
	layoutDir = filepath.Join(t.TempDir(), "layout")
	img := buildImage(t, imageConfig{}, randomLayers(t, 7, 2, 400)...)
	writeLayout(t, layoutDir, map[string]v1.Image{"big": img})
	d, err := img.Digest()
	require.NoError(t, err)
	store = t.TempDir()
	tasks = importTasks(t, store, tasksRow("b", testRepo+":big", "/testbed"))
	return layoutDir, store, tasks, d
}

func TestKilledImportLeavesNoBundle(t *testing.T) {
	for _, point := range []string{images.HookLayerPartial, images.HookLayerBeforeRename, images.HookBeforeRename} {
		t.Run(point, func(t *testing.T) {
			layoutDir, store, tasks, digest := bigFixture(t)
			root := t.TempDir()
			args := []string{"images", "import", "--store", store, "--tasks", tasks, "--root", root, "--source", testRepo + "=oci:" + layoutDir}
			p := start(t, []string{"KILN_TEST_PAUSE_AT=" + point}, args...)
			p.waitPaused(t)
			require.NoError(t, p.cmd.Process.Signal(syscall.SIGKILL))
			p.wait(t)

			final := filepath.Join(root, "sha256", digest.Hex)
			_, err := os.Lstat(final)
			assert.True(t, os.IsNotExist(err), "a killed import left a bundle at the final path")
			left := bundleDirs(t, root)
			require.Len(t, left, 1)
			assert.True(t, strings.HasPrefix(left[0], ".tmp-"+digest.Hex+"-"), left)
			if point != images.HookBeforeRename {
				// Killed mid-layer: nothing at the layer's final path.
				layers := layerDirs(t, root)
				require.Len(t, layers, 1)
				assert.True(t, strings.HasPrefix(layers[0], ".tmp-"), layers)
			}
			assert.Equal(t, 3, kiln(t, "show", "--store", store, "images").Code, "no version")

			// A rerun completes it and removes the leftover; another unpacks nothing.
			q := start(t, nil, args...)
			require.Equal(t, 0, q.wait(t), q.Stderr())
			assert.Contains(t, q.Stderr(), "unpacked=1")
			assert.Equal(t, []string{digest.Hex}, bundleDirs(t, root))
			_, err = os.Stat(filepath.Join(final, "rootfs"))
			require.NoError(t, err)
			assert.Len(t, layerDirs(t, root), 2, "both layers in place, no leftover")
			requireSameTree(t, walkTree(t, umociUnpack(t, layoutDir, "big")), walkTree(t, rootfsOf(t, final)))
			q = start(t, nil, args...)
			require.Equal(t, 0, q.wait(t), q.Stderr())
			assert.Contains(t, q.Stderr(), "unpacked=0 reused=1")
		})
	}
}

// TestConcurrentImportsUnpackOnce: two processes import one image at the
// same time on one node; it is unpacked once, and both succeed.
func TestConcurrentImportsUnpackOnce(t *testing.T) {
	layoutDir, store, tasks, digest := bigFixture(t)
	root := t.TempDir()
	resume := filepath.Join(t.TempDir(), "resume")
	args := []string{"images", "import", "--store", store, "--tasks", tasks, "--root", root, "--source", testRepo + "=oci:" + layoutDir}
	a := start(t, []string{"KILN_TEST_PAUSE_AT=" + images.HookLayerPartial, "KILN_TEST_RESUME_FILE=" + resume}, args...)
	a.waitPaused(t) // a holds the lock, mid-layer
	b := start(t, nil, args...)
	deadline := time.Now().Add(30 * time.Second)
	for !strings.Contains(b.Stderr(), "waiting for it") {
		require.True(t, time.Now().Before(deadline), "b never waited for the lock:\n%s", b.Stderr())
		time.Sleep(10 * time.Millisecond)
	}
	require.NoError(t, os.WriteFile(resume, nil, 0o644))
	require.Equal(t, 0, a.wait(t), a.Stderr())
	require.Equal(t, 0, b.wait(t), b.Stderr())
	assert.Contains(t, a.Stderr(), "unpacked=1 reused=0")
	assert.Contains(t, b.Stderr(), "unpacked=0 reused=1")
	assert.Equal(t, []string{digest.Hex}, bundleDirs(t, root))
	assert.Equal(t, strings.TrimSpace(a.stdout.String()), strings.TrimSpace(b.stdout.String()), "both report the same version")
}

// sharedFixture is two images over one base layer (each with a layer of
// its own) and a tasks dataset of both.
func sharedFixture(t *testing.T) (layoutDir, store, tasks string) {
	t.Helper()
	layoutDir = filepath.Join(t.TempDir(), "layout")
	base := randomLayers(t, 7, 1, 400)[0]
	one := buildImage(t, imageConfig{}, base, layerTar(t, []ent{file("one", "1", 0o644, 0, 0)}))
	two := buildImage(t, imageConfig{}, base, layerTar(t, []ent{file("two", "2", 0o644, 0, 0)}))
	writeLayout(t, layoutDir, map[string]v1.Image{"one": one, "two": two})
	store = t.TempDir()
	tasks = importTasks(t, store, tasksRow("a", testRepo+":one", "/testbed"))
	tasks2 := importTasks(t, store, tasksRow("b", testRepo+":two", "/testbed"))
	return layoutDir, store, tasks + " " + tasks2
}

// TestRacingImportsUnpackSharedLayerOnce: two processes import two images
// sharing a base layer at once; the base is unpacked once, by the first,
// while the second waits on its lock, and both bundles see it.
func TestRacingImportsUnpackSharedLayerOnce(t *testing.T) {
	layoutDir, store, both := sharedFixture(t)
	tasks := strings.Fields(both)
	root := t.TempDir()
	resume := filepath.Join(t.TempDir(), "resume")
	args := func(tasks string) []string {
		return []string{"images", "import", "--store", store, "--tasks", tasks, "--root", root, "--source", testRepo + "=oci:" + layoutDir}
	}
	a := start(t, []string{"KILN_TEST_PAUSE_AT=" + images.HookLayerPartial, "KILN_TEST_RESUME_FILE=" + resume}, args(tasks[0])...)
	a.waitPaused(t) // a holds the base layer's lock, mid-layer
	b := start(t, nil, args(tasks[1])...)
	deadline := time.Now().Add(30 * time.Second)
	for !strings.Contains(b.Stderr(), "waiting for it") {
		require.True(t, time.Now().Before(deadline), "b never waited for the layer lock:\n%s", b.Stderr())
		time.Sleep(10 * time.Millisecond)
	}
	require.NoError(t, os.WriteFile(resume, nil, 0o644))
	require.Equal(t, 0, a.wait(t), a.Stderr())
	require.Equal(t, 0, b.wait(t), b.Stderr())
	assert.Contains(t, a.Stderr(), "store_layers_unpacked=2 store_layers_reused=0")
	assert.Contains(t, b.Stderr(), "store_layers_unpacked=1 store_layers_reused=1", "b reused a's base layer")
	assert.Len(t, layerDirs(t, root), 3, "base + one + two")
	for _, tag := range []string{"one", "two"} {
		img, err := layoutImage(t, layoutDir, tag)
		require.NoError(t, err)
		d, err := img.Digest()
		require.NoError(t, err)
		requireSameTree(t, walkTree(t, umociUnpack(t, layoutDir, tag)), walkTree(t, rootfsOf(t, filepath.Join(root, "sha256", d.Hex))))
	}
}

// TestGCRacingImportKeepsLayers: gc runs while an import has put a layer
// in place but not yet the bundle listing it; gc leaves the layer, the
// import completes, and a later gc collects what no kept bundle lists.
func TestGCRacingImportKeepsLayers(t *testing.T) {
	layoutDir, store, both := sharedFixture(t)
	tasks := strings.Fields(both)
	root := t.TempDir()
	imp := func(tasks string) []string {
		return []string{"images", "import", "--store", store, "--tasks", tasks, "--root", root, "--source", testRepo + "=oci:" + layoutDir, "--out", "images-" + tasks[:5]}
	}
	r := kiln(t, imp(tasks[1])...) // "two": base + two, kept below
	require.Equal(t, 0, r.Code, r.Stderr)
	keep := r.LastLine()
	require.NoError(t, os.RemoveAll(filepath.Join(root, "layers", "sha256"))) // and no bundle of it: the race is on a fresh base
	matches, _ := filepath.Glob(filepath.Join(root, "sha256", "*"))
	for _, m := range matches {
		require.NoError(t, os.RemoveAll(m))
	}
	resume := filepath.Join(t.TempDir(), "resume")
	a := start(t, []string{"KILN_TEST_PAUSE_AT=" + images.HookLayerPlaced, "KILN_TEST_RESUME_FILE=" + resume}, imp(tasks[0])...)
	a.waitPaused(t) // the base layer is in place; no bundle lists it yet
	require.Len(t, layerDirs(t, root), 1)
	g := kiln(t, "images", "gc", "--store", store, "--root", root, "--keep", keep)
	require.Equal(t, 0, g.Code, g.Stderr)
	assert.NotContains(t, g.Stdout, "layers/", "gc removed a layer an import is about to reference")
	assert.Contains(t, g.Stderr, "an import is running")
	require.Len(t, layerDirs(t, root), 1, "the base layer is still there")
	require.NoError(t, os.WriteFile(resume, nil, 0o644))
	require.Equal(t, 0, a.wait(t), a.Stderr())
	img, err := layoutImage(t, layoutDir, "one")
	require.NoError(t, err)
	d, err := img.Digest()
	require.NoError(t, err)
	requireSameTree(t, walkTree(t, umociUnpack(t, layoutDir, "one")), walkTree(t, rootfsOf(t, filepath.Join(root, "sha256", d.Hex))))
	// Now nothing runs: gc removes bundle "one" and both its layers (keep's
	// bundle is not on this node any more).
	g = kiln(t, "images", "gc", "-n", "--store", store, "--root", root, "--keep", keep)
	require.Equal(t, 0, g.Code, g.Stderr)
	assert.Equal(t, 3, strings.Count(g.Stdout, "would remove"), g.Stdout)
	g = kiln(t, "images", "gc", "--store", store, "--root", root, "--keep", keep)
	require.Equal(t, 0, g.Code, g.Stderr)
	assert.Contains(t, g.Stdout, "removed layers/sha256/")
	assert.Empty(t, layerDirs(t, root))
}
