package images_test

import (
	"archive/tar"
	"encoding/json"
	"fmt"
	"io"
	"net/http/httptest"
	"net/url"
	"os"
	"path/filepath"
	"strings"
	"testing"

	"github.com/google/go-containerregistry/pkg/name"
	"github.com/google/go-containerregistry/pkg/registry"
	v1 "github.com/google/go-containerregistry/pkg/v1"
	"github.com/google/go-containerregistry/pkg/v1/layout"
	"github.com/google/go-containerregistry/pkg/v1/remote"
	"github.com/google/go-containerregistry/pkg/v1/tarball"
	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/kilnrl/kiln/stages/images"
)

// fixture is a layout with two small images and a store with tasks using
// them (three tasks, two of which share an image).
type fixture struct {
	layout, store, root, tasks string
	digests                    map[string]string // tag -> manifest digest
}

func newFixture(t *testing.T) fixture {
	t.Helper()
	f := fixture{layout: filepath.Join(t.TempDir(), "layout"), store: t.TempDir(), root: t.TempDir(), digests: map[string]string{}}
	imgs := map[string]v1.Image{
		"alpha": buildImage(t, imageConfig{env: []string{"PATH=/usr/bin:/bin", "LANG=C.UTF-8", "EQ=a=b"}, workdir: "/srv", cmd: []string{"bash"}},
			layerTar(t, []ent{dir("etc", 0o755, 0, 0), file("etc/os-release", "alpha\n", 0o644, 0, 0)}),
			layerTar(t, []ent{dir("testbed", 0o755, 0, 0), file("testbed/marker", "alpha task\n", 0o644, 0, 0)})),
		"beta": buildImage(t, imageConfig{env: []string{"PATH=/bin", "HOME=/root"}},
			layerTar(t, []ent{file("marker", "beta\n", 0o644, 0, 0)})),
	}
	writeLayout(t, f.layout, imgs)
	for tag, img := range imgs {
		d, err := img.Digest()
		require.NoError(t, err)
		f.digests[tag] = d.String()
	}
	f.tasks = importTasks(t, f.store,
		tasksRow("t1", testRepo+":alpha", "/testbed"),
		tasksRow("t2", testRepo+":beta", "/work"),
		tasksRow("t3", testRepo+":alpha", "/testbed"))
	return f
}

func (f fixture) run(t *testing.T, extra ...string) (stdout, stderr string, code int) {
	t.Helper()
	args := append([]string{"images", "import", "--store", f.store, "--tasks", f.tasks, "--root", f.root,
		"--source", testRepo + "=oci:" + f.layout}, extra...)
	r := kiln(t, args...)
	return r.Stdout, r.Stderr, r.Code
}

// rows exports the images dataset ref as parsed JSON rows.
func exportRows(t *testing.T, store, ref string) []map[string]any {
	t.Helper()
	r := kiln(t, "export", "--store", store, ref)
	require.Equal(t, 0, r.Code, r.Stderr)
	var out []map[string]any
	for _, line := range strings.Split(strings.TrimSpace(r.Stdout), "\n") {
		var m map[string]any
		require.NoError(t, json.Unmarshal([]byte(line), &m))
		out = append(out, m)
	}
	return out
}

func TestImportRecordsImagesAndExportsMap(t *testing.T) {
	f := newFixture(t)
	stdout, stderr, code := f.run(t, "--env-path-prepend", testRepo+":beta=/root/.pyenv/shims", "--out", "images/x")
	require.Equal(t, 0, code, stderr)
	ref := strings.TrimSpace(stdout)
	require.True(t, strings.HasPrefix(ref, "images/x@"), ref)
	assert.Contains(t, stderr, "unpacked=2")

	// Each input of another kind is a usage error naming it (exit 2).
	for _, c := range []struct {
		args []string
		want string
	}{
		{[]string{"import", "--tasks", ref, "--bundles", f.root}, "import: --tasks " + ref + " holds images records, not tasks"},
		{[]string{"build", "--tasks", ref, "--bundles", f.root}, "build: --tasks " + ref + " holds images records, not tasks"},
		{[]string{"verify", "--tasks", ref, "--images", ref, "--bundles", f.root}, "verify: --tasks " + ref + " holds images records, not tasks"},
		{[]string{"verify", "--tasks", f.tasks, "--images", f.tasks, "--bundles", f.root}, "verify: --images " + f.tasks + " holds tasks records, not images"},
		{[]string{"du", "--images", f.tasks, "--bundles", f.root}, "du: --images " + f.tasks + " holds tasks records, not images"},
		{[]string{"gc", "--keep", f.tasks, "--bundles", f.root}, "gc: --keep " + f.tasks + " holds tasks records, not images"},
	} {
		r := kiln(t, append(append([]string{"images"}, c.args[0], "--store", f.store), c.args[1:]...)...)
		assert.Equal(t, 2, r.Code, "%v: %s", c.args, r.Stderr)
		assert.Contains(t, r.Stderr, c.want, c.args)
	}

	got := exportRows(t, f.store, ref)
	require.Len(t, got, 2)
	alphaHex := strings.TrimPrefix(f.digests["alpha"], "sha256:")
	assert.Equal(t, map[string]any{
		"image": testRepo + ":alpha", "digest": f.digests["alpha"], "bundle": "sha256/" + alphaHex,
		"env": map[string]any{"PATH": "/usr/bin:/bin", "LANG": "C.UTF-8", "EQ": "a=b"}, "workdir": "/testbed",
		"config_workdir": "/srv", "command": []any{"bash"}, "source": "oci:" + f.layout,
		"size_bytes": got[0]["size_bytes"], "files": float64(4), "env_path_prepend": nil,
	}, got[0])
	assert.Equal(t, "/root/.pyenv/shims:/bin", got[1]["env"].(map[string]any)["PATH"])
	assert.Equal(t, "/", got[1]["config_workdir"], "an unset WorkingDir is /")
	assert.Equal(t, "/work", got[1]["workdir"])

	// The bundle: rootfs and image.json (docs/data-and-grading.md §2.3 fields).
	bundle := filepath.Join(f.root, "sha256", alphaHex)
	b, err := os.ReadFile(filepath.Join(rootfsOf(t, bundle), "testbed", "marker"))
	require.NoError(t, err)
	assert.Equal(t, "alpha task\n", string(b))
	var info map[string]any
	b, err = os.ReadFile(filepath.Join(bundle, "image.json"))
	require.NoError(t, err)
	require.NoError(t, json.Unmarshal(b, &info))
	assert.Equal(t, testRepo+":alpha", info["image"])
	assert.Equal(t, f.digests["alpha"], info["manifest_digest"])
	assert.Equal(t, "/srv", info["cwd"])
	assert.Equal(t, []any{"bash"}, info["command"])
	assert.Contains(t, string(b), `"env": {
    "PATH": "/usr/bin:/bin",
    "LANG": "C.UTF-8",
    "EQ": "a=b"
  }`, "env keeps image order")

	// kiln export --format images-json: the reference's map, byte for byte.
	out := filepath.Join(t.TempDir(), "sub", "images.json")
	require.NoError(t, os.MkdirAll(filepath.Dir(out), 0o755))
	r := kiln(t, "export", "--store", f.store, "--format", "images-json", "--root", f.root, "--out", out, ref)
	require.Equal(t, 0, r.Code, r.Stderr)
	assert.Equal(t, fmt.Sprintf(`{"output": %q, "images": 2}`, out), strings.TrimSpace(r.Stdout))
	b, err = os.ReadFile(out)
	require.NoError(t, err)
	golden, err := os.ReadFile("testdata/images.json")
	require.NoError(t, err)
	want := strings.NewReplacer("ROOT", f.root, "ALPHA", alphaHex, "BETA", strings.TrimPrefix(f.digests["beta"], "sha256:")).Replace(string(golden))
	assert.Equal(t, want, string(b))

	// Without --root, or on a tasks dataset, it is a usage error.
	assert.Equal(t, 2, kiln(t, "export", "--store", f.store, "--format", "images-json", ref).Code)
	assert.Equal(t, 2, kiln(t, "export", "--store", f.store, "--format", "images-json", "--root", f.root, f.tasks).Code)
}

func TestImportReusesBundles(t *testing.T) {
	f := newFixture(t)
	_, stderr, code := f.run(t)
	require.Equal(t, 0, code, stderr)
	bundle := filepath.Join(f.root, "sha256", strings.TrimPrefix(f.digests["alpha"], "sha256:"))
	before, err := os.Stat(filepath.Join(bundle, "rootfs"))
	require.NoError(t, err)

	// Same tasks again (on this node): nothing is unpacked.
	_, stderr, code = f.run(t)
	require.Equal(t, 0, code, stderr)
	assert.Contains(t, stderr, "unpacked=0 reused=2")
	after, err := os.Stat(filepath.Join(bundle, "rootfs"))
	require.NoError(t, err)
	assert.True(t, os.SameFile(before, after))

	// Another dataset version wanting the same images (another --out) on
	// this node also reuses them.
	_, stderr, code = f.run(t, "--out", "other")
	require.Equal(t, 0, code, stderr)
	assert.Contains(t, stderr, "unpacked=0 reused=2")
	assert.Len(t, bundleDirs(t, f.root), 2)
}

func TestImportRefusesMismatchedBundle(t *testing.T) {
	cases := []struct {
		name   string
		damage func(t *testing.T, bundle string)
	}{
		{"other digest", func(t *testing.T, bundle string) {
			p := filepath.Join(bundle, "image.json")
			b, err := os.ReadFile(p)
			require.NoError(t, err)
			b = []byte(strings.Replace(string(b), `"manifest_digest": "sha256:`, `"manifest_digest": "sha256:0`, 1))
			require.NoError(t, os.WriteFile(p, b, 0o644))
		}},
		{"no rootfs", func(t *testing.T, bundle string) { require.NoError(t, os.RemoveAll(filepath.Join(bundle, "rootfs"))) }},
		{"no image.json", func(t *testing.T, bundle string) { require.NoError(t, os.Remove(filepath.Join(bundle, "image.json"))) }},
		{"garbage image.json", func(t *testing.T, bundle string) {
			require.NoError(t, os.WriteFile(filepath.Join(bundle, "image.json"), []byte("{"), 0o644))
		}},
	}
	for _, c := range cases {
		t.Run(c.name, func(t *testing.T) {
			f := newFixture(t)
			_, stderr, code := f.run(t)
			require.Equal(t, 0, code, stderr)
			bundle := filepath.Join(f.root, "sha256", strings.TrimPrefix(f.digests["beta"], "sha256:"))
			c.damage(t, bundle)
			_, stderr, code = f.run(t, "--out", "again")
			// A damaged bundle is corrupt data on this node (exit 4), not
			// a failure a retry would fix.
			assert.Equal(t, 4, code)
			assert.Contains(t, stderr, "Existing bundle does not match "+testRepo+":beta: "+bundle)
			assert.Equal(t, 3, kiln(t, "show", "--store", f.store, "again").Code, "no version on failure")
		})
	}
}

// The docs/data-and-grading.md §6 image-import cases (11, 13-15), as they apply to
// digest-named bundles (12, tag validation, is moot: bundles are not named
// by tag; any reference a source can resolve is accepted).
func TestSpecImageImportCases(t *testing.T) {
	t.Run("11 same image and workdir: one entry; different workdirs fail", func(t *testing.T) {
		f := newFixture(t)
		_, stderr, code := f.run(t)
		require.Equal(t, 0, code, stderr)
		assert.Contains(t, stderr, "images=2")
		tasks := importTasks(t, f.store, tasksRow("a", testRepo+":alpha", "/testbed"), tasksRow("b", testRepo+":alpha", "/other"))
		r := kiln(t, "images", "import", "--store", f.store, "--tasks", tasks, "--root", f.root, "--source", testRepo+"=oci:"+f.layout)
		assert.Equal(t, 5, r.Code)
		assert.Contains(t, r.Stderr, "Conflicting workdirs for image "+testRepo+":alpha")
	})
	t.Run("13 reuse: an existing bundle is used without its source", func(t *testing.T) {
		f := newFixture(t)
		_, stderr, code := f.run(t)
		require.Equal(t, 0, code, stderr)
		// Pinned by digest, the import needs no source once the bundle exists.
		tasks := importTasks(t, f.store, tasksRow("p", testRepo+"@"+f.digests["beta"], "/w"))
		r := kiln(t, "images", "import", "--store", f.store, "--tasks", tasks, "--root", f.root, "--source", testRepo+"=oci:/nonexistent", "--out", "pinned")
		require.Equal(t, 0, r.Code, r.Stderr)
		assert.Contains(t, r.Stderr, "unpacked=0 reused=1")
		got := exportRows(t, f.store, "pinned")
		assert.Equal(t, map[string]any{"PATH": "/bin", "HOME": "/root"}, got[0]["env"])
	})
	t.Run("14 no images", func(t *testing.T) {
		store := t.TempDir()
		tasks := importTasks(t, store, tasksRow("x", "", "/w"))
		r := kiln(t, "images", "import", "--store", store, "--tasks", tasks, "--root", t.TempDir())
		assert.Equal(t, 5, r.Code)
		assert.Contains(t, r.Stderr, "No task images found in the prepared dataset")
	})
	t.Run("15 pull contract offline", func(t *testing.T) {
		reg := httptest.NewServer(registry.New())
		host := hostOf(t, reg.URL)
		img := buildImage(t, imageConfig{env: []string{"PATH=/bin"}}, layerTar(t, []ent{file("marker", "cached", 0o644, 0, 0)}))
		tag, err := name.NewTag(host + "/mimo/cache:v1")
		require.NoError(t, err)
		require.NoError(t, remote.Write(tag, img))
		d, err := img.Digest()
		require.NoError(t, err)
		pinned := host + "/mimo/cache@" + d.String()
		store, root := t.TempDir(), t.TempDir()
		tasks := importTasks(t, store, tasksRow("c", pinned, "/testbed"))
		r := kiln(t, "images", "import", "--store", store, "--tasks", tasks, "--root", root)
		require.Equal(t, 0, r.Code, r.Stderr)
		b, err := os.ReadFile(filepath.Join(rootfsOf(t, filepath.Join(root, "sha256", d.Hex)), "marker"))
		require.NoError(t, err)
		assert.Equal(t, "cached", string(b))
		var info images.ImageJSON
		b, err = os.ReadFile(filepath.Join(root, "sha256", d.Hex, "image.json"))
		require.NoError(t, err)
		require.NoError(t, json.Unmarshal(b, &info))
		assert.Equal(t, d.String(), info.ManifestDigest)
		assert.JSONEq(t, `{"PATH":"/bin"}`, string(info.Env))
		reg.Close() // no network from here on
		r = kiln(t, "images", "import", "--store", store, "--tasks", tasks, "--root", root, "--out", "again")
		require.Equal(t, 0, r.Code, r.Stderr)
		assert.Contains(t, r.Stderr, "unpacked=0 reused=1")
	})
}

func hostOf(t *testing.T, u string) string {
	t.Helper()
	p, err := url.Parse(u)
	require.NoError(t, err)
	return p.Host
}

// TestRegistryTagMoves: images come from a registry (go-containerregistry's
// in-process one); a tag moved to a new digest gets a new bundle, and gc
// then removes the bundle only the old version used.
func TestRegistryTagMoves(t *testing.T) {
	reg := httptest.NewServer(registry.New())
	defer reg.Close()
	image := hostOf(t, reg.URL) + "/swe/task:latest"
	tag, err := name.NewTag(image)
	require.NoError(t, err)
	store, root := t.TempDir(), t.TempDir()
	tasks := importTasks(t, store, tasksRow("r", image, "/testbed"))

	var digests []v1.Hash
	var refs []string
	for i, body := range []string{"one", "two"} {
		img := buildImage(t, imageConfig{}, layerTar(t, []ent{file("version", body, 0o644, 0, 0)}))
		require.NoError(t, remote.Write(tag, img))
		d, err := img.Digest()
		require.NoError(t, err)
		digests = append(digests, d)
		r := kiln(t, "images", "import", "--store", store, "--tasks", tasks, "--root", root)
		require.Equal(t, 0, r.Code, r.Stderr)
		assert.Contains(t, r.Stderr, "unpacked=1")
		refs = append(refs, r.LastLine())
		got := exportRows(t, store, r.LastLine())
		assert.Equal(t, d.String(), got[0]["digest"], "import %d", i)
		assert.Equal(t, "registry", got[0]["source"])
		b, err := os.ReadFile(filepath.Join(rootfsOf(t, filepath.Join(root, "sha256", d.Hex)), "version"))
		require.NoError(t, err)
		assert.Equal(t, body, string(b))
	}
	require.NotEqual(t, refs[0], refs[1], "a moved tag is a new version")
	assert.ElementsMatch(t, []string{digests[0].Hex, digests[1].Hex}, bundleDirs(t, root))

	r := kiln(t, "images", "gc", "--store", store, "--root", root, "--keep", refs[1], "--dry-run")
	require.Equal(t, 0, r.Code, r.Stderr)
	// The bundle, then the layer only it listed (its own top layer).
	assert.Regexp(t, "^would remove layers/sha256/[0-9a-f]{64}\nwould remove sha256/"+digests[0].Hex+"\n$", r.Stdout)
	assert.Len(t, bundleDirs(t, root), 2)
	r = kiln(t, "images", "gc", "--store", store, "--root", root, "--keep", refs[1])
	require.Equal(t, 0, r.Code, r.Stderr)
	assert.Regexp(t, "^removed layers/sha256/[0-9a-f]{64}\nremoved sha256/"+digests[0].Hex+"\n$", r.Stdout)
	assert.Equal(t, []string{digests[1].Hex}, bundleDirs(t, root))
}

// TestArchiveSources: docker save tarballs and OCI archives.
func TestArchiveSources(t *testing.T) {
	img := buildImage(t, imageConfig{env: []string{"PATH=/bin"}}, layerTar(t, []ent{dir("d", 0o755, 0, 0), file("d/f", "archived", 0o644, 0, 0)}))
	dockerTar := filepath.Join(t.TempDir(), "img.tar")
	tag, err := name.NewTag("kiln.local/archive:v1")
	require.NoError(t, err)
	require.NoError(t, tarball.WriteToFile(dockerTar, tag, img))
	layoutDir := filepath.Join(t.TempDir(), "layout")
	writeLayout(t, layoutDir, map[string]v1.Image{"v1": img})
	ociTar := filepath.Join(t.TempDir(), "oci.tar")
	tarDir(t, layoutDir, ociTar)

	for _, src := range []string{"docker-archive:" + dockerTar, "oci-archive:" + ociTar} {
		t.Run(strings.Split(src, ":")[0], func(t *testing.T) {
			store, root := t.TempDir(), t.TempDir()
			tasks := importTasks(t, store, tasksRow("a", "kiln.local/archive:v1", "/w"))
			r := kiln(t, "images", "import", "--store", store, "--tasks", tasks, "--root", root, "--source", "kiln.local/archive:v1="+src)
			require.Equal(t, 0, r.Code, r.Stderr)
			got := exportRows(t, store, r.LastLine())
			bundle := got[0]["bundle"].(string)
			b, err := os.ReadFile(filepath.Join(rootfsOf(t, filepath.Join(root, bundle)), "d", "f"))
			require.NoError(t, err)
			assert.Equal(t, "archived", string(b))
			assert.Equal(t, src, got[0]["source"])
			ents, _ := os.ReadDir(filepath.Join(root, ".sources"))
			assert.Empty(t, ents, "an unpacked oci-archive is removed")
		})
	}
}

// tarDir writes dir's files into a tar (an oci-archive of a layout).
func tarDir(t *testing.T, dir, out string) {
	t.Helper()
	f, err := os.Create(out)
	require.NoError(t, err)
	defer f.Close()
	tw := tar.NewWriter(f)
	require.NoError(t, filepath.Walk(dir, func(p string, fi os.FileInfo, err error) error {
		if err != nil || p == dir {
			return err
		}
		rel, _ := filepath.Rel(dir, p)
		h, err := tar.FileInfoHeader(fi, "")
		if err != nil {
			return err
		}
		h.Name = rel
		if err := tw.WriteHeader(h); err != nil {
			return err
		}
		if fi.Mode().IsRegular() {
			src, err := os.Open(p)
			if err != nil {
				return err
			}
			defer src.Close()
			_, err = io.Copy(tw, src)
			return err
		}
		return nil
	}))
	require.NoError(t, tw.Close())
}

func TestImportUsageErrors(t *testing.T) {
	f := newFixture(t)
	for _, args := range [][]string{
		{"--source", "nokind"},
		{"--source", "x=zip:/a"},
		{"--env-path-prepend", "unknown:image=/x"},
		{"--env-path-prepend", "noequals"},
		{"-j", "0"},
	} {
		_, stderr, code := f.run(t, args...)
		assert.Equal(t, 2, code, "%v: %s", args, stderr)
	}
	_, stderr, code := f.run(t, "--source", testRepo+"=oci:/elsewhere")
	assert.Equal(t, 2, code)
	assert.Contains(t, stderr, "given twice")
	r := kiln(t, "images", "import", "--store", f.store, "--tasks", f.tasks, "--root", f.root, "-j", "1",
		"--source", testRepo+"=oci:/nonexistent-layout", "--source", testRepo+":alpha=oci:"+f.layout)
	stderr, code = r.Stderr, r.Code
	assert.Equal(t, 3, code, "a missing layout is a missing input")
	assert.Contains(t, stderr, `image "kiln.local/test:beta": OCI layout "/nonexistent-layout"`)
}

// TestShardedImport: with --shard i/n the distinct images are dealt to
// parts; the version commits when the last part lands, with every image.
func TestShardedImport(t *testing.T) {
	f := newFixture(t)
	var last string
	for i, part := range []string{"0/2", "1/2"} {
		_, stderr, code := f.run(t, "--shard", part)
		require.Equal(t, 0, code, stderr)
		assert.Contains(t, stderr, "images=1 unpacked=1", "part %s", part)
		if i == 0 {
			assert.Equal(t, 3, kiln(t, "show", "--store", f.store, "images").Code, "not committed after one part")
		}
		last = stderr
	}
	assert.Contains(t, last, "committed")
	got := exportRows(t, f.store, "images")
	require.Len(t, got, 2)
	assert.ElementsMatch(t, []any{testRepo + ":alpha", testRepo + ":beta"}, []any{got[0]["image"], got[1]["image"]})
	_, stderr, code := f.run(t, "--shard", "0/2", "--tasks", "tasks")
	assert.Equal(t, 2, code, "an unpinned input is refused: %s", stderr)
}

// TestCorruptSourceFails: a layer or config blob whose content does not
// match its digest fails the import, and leaves no bundle.
func TestCorruptSourceFails(t *testing.T) {
	for _, what := range []string{"layer", "config"} {
		t.Run(what, func(t *testing.T) {
			f := newFixture(t)
			img, err := layoutImage(t, f.layout, "beta")
			require.NoError(t, err)
			m, err := img.Manifest()
			require.NoError(t, err)
			target := m.Config.Digest
			if what == "layer" {
				target = m.Layers[0].Digest
			}
			other := buildImage(t, imageConfig{env: []string{"PATH=/evil"}}, layerTar(t, []ent{file("marker", "evil\n", 0o644, 0, 0)}))
			var data []byte
			if what == "layer" {
				ls, err := other.Layers()
				require.NoError(t, err)
				rc, err := ls[0].Compressed()
				require.NoError(t, err)
				data, err = io.ReadAll(rc)
				require.NoError(t, err)
			} else {
				data, err = other.RawConfigFile()
				require.NoError(t, err)
			}
			blob := filepath.Join(f.layout, "blobs", "sha256", target.Hex)
			require.NoError(t, os.Chmod(blob, 0o644))
			require.NoError(t, os.WriteFile(blob, data, 0o644))
			_, stderr, code := f.run(t)
			assert.Equal(t, 5, code, "invalid input: a rerun reads the same blob")
			assert.Contains(t, stderr, "the source is corrupt")
			assert.Contains(t, stderr, testRepo+":beta")
			beta := strings.TrimPrefix(f.digests["beta"], "sha256:")
			for _, d := range bundleDirs(t, f.root) {
				assert.NotContains(t, d, beta, "no bundle or leftover of the corrupt image")
			}
		})
	}
}

func layoutImage(t *testing.T, dir, tag string) (v1.Image, error) {
	t.Helper()
	idx, err := layout.ImageIndexFromPath(dir)
	require.NoError(t, err)
	im, err := idx.IndexManifest()
	require.NoError(t, err)
	for _, d := range im.Manifests {
		if d.Annotations["org.opencontainers.image.ref.name"] == tag {
			return idx.Image(d.Digest)
		}
	}
	return nil, fmt.Errorf("no %s", tag)
}
