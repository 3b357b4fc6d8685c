package images_test

import (
	"archive/tar"
	"encoding/json"
	"fmt"
	"math/rand"
	"os"
	"path/filepath"
	"strings"
	"testing"

	v1 "github.com/google/go-containerregistry/pkg/v1"
	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/kilnrl/kiln/stages/images"
)

const testRepo = "kiln.local/test"

// richLayers exercise every layer feature: owners, modes with special
// bits, symlinks (dangling, absolute), hard links within and across
// layers, a FIFO, a device node, implicit parents, read-only directories,
// whiteouts of files, directories and link members, opaque directories,
// and replacements of every kind.
func richLayers(t testing.TB) [][]byte {
	l0 := []ent{
		dir("etc", 0o755, 0, 0), dir("usr", 0o755, 0, 0), dir("usr/bin", 0o755, 0, 0), dir("usr/lib", 0o755, 0, 0),
		dir("home", 0o755, 0, 0), dir("home/user", 0o700, 1000, 1000), dir("tmp", 0o1777, 0, 0),
		file("etc/passwd", "root:x:0:0\n", 0o644, 0, 0),
		file("etc/shadow", "secret\n", 0o640, 0, 42),
		file("usr/bin/tool", "tool v1\n", 0o755, 0, 0),
		file("usr/bin/sudo", "sudo\n", 0o4755, 0, 0),
		file("usr/bin/wall", "wall\n", 0o2755, 0, 5),
		symlink("bin", "usr/bin"), symlink("lib", "usr/lib"),
		symlink("etc/localtime", "/usr/share/zoneinfo/UTC"),
		symlink("usr/bin/python", "python3"),
		hardlink("usr/bin/tool2", "usr/bin/tool"),
		{name: "run/fifo", typ: tar.TypeFifo, mode: 0o620, uid: 0, gid: 0},
		dir("dev", 0o755, 0, 0), {name: "dev/null", typ: tar.TypeChar, mode: 0o666},
		dir("opt", 0o755, 0, 0), dir("opt/ro", 0o555, 0, 0), file("opt/ro/f", "ro\n", 0o444, 0, 0),
		file("home/user/.bashrc", "alias ll='ls -l'\n", 0o600, 1000, 1000),
		file("var/lib/implicit/file", "no parents listed\n", 0o644, 0, 0),
		dir("data", 0o755, 0, 0), dir("data/old", 0o755, 0, 0), file("data/old/a", "a", 0o644, 0, 0),
		file("data/old/b", "b", 0o644, 0, 0), dir("data/keep", 0o755, 0, 0), file("data/keep/k", "k", 0o644, 0, 0),
		dir("cfg", 0o755, 0, 0), file("cfg/x", "x", 0o644, 0, 0), file("cfg/y", "y", 0o644, 0, 0),
		dir("cfg/sub", 0o750, 3, 3), file("cfg/sub/z", "z", 0o644, 0, 0),
		{name: "etc/xattr", typ: tar.TypeReg, mode: 0o644, body: "x", xattrs: map[string]string{"user.kiln": "1"}},
		file("etc/empty", "", 0o644, 0, 0),
		dir("ro", 0o555, 0, 0), file("ro/a", "a", 0o444, 0, 0),
	}
	l1 := []ent{
		file("etc/passwd", "root:x:0:0\nagent:x:1000:1000\n", 0o600, 0, 0),
		whiteout("data/.wh.old"), whiteout("etc/.wh.shadow"),
		dir("cfg", 0o755, 0, 0), whiteout("cfg/.wh..wh..opq"), file("cfg/new", "new", 0o644, 0, 0),
		file("usr/bin/tool", "tool v2\n", 0o755, 0, 0),
		hardlink("usr/bin/tool3", "usr/bin/tool2"),
		hardlink("usr/bin/tool4", "usr/bin/tool"),
		file("data/keep", "now a file\n", 0o644, 0, 0),
		dir("usr/lib", 0o700, 2, 2),
		file("etc/localtime", "UTC\n", 0o644, 0, 0),
		file("srv/a/b/file", "deep\n", 0o640, 7, 8),
		symlink("opt/ro", "/nowhere"),
		whiteout(".wh.nothing-here"),
		file("ro/b", "b", 0o400, 0, 0), file("ro/a", "a2", 0o444, 0, 0), // into a read-only directory
	}
	l2 := []ent{
		whiteout("usr/bin/.wh.python"),
		file("cfg/later", "later", 0o644, 0, 0),
		whiteout("usr/bin/.wh.tool2"),
		dir("data/keep2", 0o711, 0, 0), whiteout("data/keep2/.wh..wh..opq"),
	}
	return [][]byte{layerTar(t, l0), layerTar(t, l1), layerTar(t, l2)}
}

// crossLayers exercise what the layered form copies up from lower layers:
// implicit parents of every mode and owner, hard links to lower files that
// have other names, whiteouts in directories a layer does not list, a
// directory replacing a whited-out one, opaque directories over several
// layers.
func crossLayers(t testing.TB) [][]byte {
	l0 := []ent{
		dir("a", 0o750, 1000, 1000), dir("a/b", 0o1777, 7, 7), file("a/b/f", "f", 0o640, 1000, 1000),
		hardlink("a/f2", "a/b/f"), hardlink("g", "a/b/f"),
		dir("d", 0o700, 0, 0), file("d/x", "x", 0o644, 0, 0), dir("d/sub", 0o755, 0, 0), file("d/sub/y", "y", 0o644, 0, 0),
		dir("o", 0o755, 0, 0), file("o/x", "x", 0o644, 0, 0),
		{name: "a/xa", typ: tar.TypeReg, mode: 0o644, body: "x", xattrs: map[string]string{"user.k": "v"}},
	}
	l1 := []ent{
		file("a/b/new", "new", 0o600, 0, 0), // implicit a and a/b
		hardlink("h", "a/f2"),               // a lower file with three names
		whiteout("d/sub/.wh.y"),             // implicit d and d/sub
		whiteout(".wh.o"), dir("o", 0o711, 0, 0), file("o/fresh", "f", 0o644, 0, 0),
		file("a/xa", "x2", 0o644, 0, 0),
	}
	l2 := []ent{
		whiteout("a/.wh.f2"),
		dir("d", 0o755, 0, 0), whiteout("d/.wh..wh..opq"), file("d/only", "o", 0o644, 0, 0),
		hardlink("k", "o/fresh"),
	}
	l3 := []ent{file("d/later", "l", 0o644, 0, 0), file("o/y", "y", 0o644, 0, 0)}
	return [][]byte{layerTar(t, l0), layerTar(t, l1), layerTar(t, l2), layerTar(t, l3)}
}

// randomLayers builds n layers of random files, directories, links and
// whiteouts over a growing tree (seeded: failures reproduce).
func randomLayers(t testing.TB, seed int64, n, perLayer int) [][]byte {
	rng := rand.New(rand.NewSource(seed))
	var dirs = []string{""}
	var files []string
	modes := []int64{0o644, 0o600, 0o755, 0o700, 0o444, 0o4755, 0o2711, 0o640}
	var out [][]byte
	for l := 0; l < n; l++ {
		var ents []ent
		written := map[string]bool{}
		pick := func(s []string) string { return s[rng.Intn(len(s))] }
		name := func() string {
			d := pick(dirs)
			p := fmt.Sprintf("n%d_%d", l, rng.Intn(1<<20))
			if d != "" {
				p = d + "/" + p
			}
			return p
		}
		for i := 0; i < perLayer; i++ {
			switch k := rng.Intn(10); {
			case k < 4:
				p := name()
				body := strings.Repeat(fmt.Sprintf("%d-", rng.Int()), rng.Intn(200))
				ents = append(ents, file(p, body, modes[rng.Intn(len(modes))], rng.Intn(3)*500, rng.Intn(3)*500))
				files, written[p] = append(files, p), true
			case k < 6:
				p := name()
				ents = append(ents, dir(p, []int64{0o755, 0o700, 0o775, 0o1777}[rng.Intn(4)], rng.Intn(2)*1000, 0))
				dirs, written[p] = append(dirs, p), true
			case k < 7:
				p := name()
				ents = append(ents, symlink(p, []string{"../x", "/etc/passwd", "rel/target", "."}[rng.Intn(4)]))
				written[p] = true
			case k < 8 && len(files) > 0:
				target := pick(files) // of this layer or an earlier one
				p := name()
				ents = append(ents, hardlink(p, target))
				written[p] = true
			case k < 9 && len(files) > 0 && l > 0:
				// Whiteout of an earlier layer's file, not touched in this layer.
				f := pick(files)
				if written[f] {
					continue
				}
				d, b := filepath.Split(f)
				ents = append(ents, whiteout(d+".wh."+b))
				for i, g := range files {
					if g == f {
						files = append(files[:i], files[i+1:]...)
						break
					}
				}
			default:
				// Overwrite an earlier file with new content and mode.
				if len(files) == 0 {
					continue
				}
				f := pick(files)
				if written[f] {
					continue
				}
				ents = append(ents, file(f, fmt.Sprintf("rewritten %d", rng.Int()), modes[rng.Intn(len(modes))], 0, 0))
				written[f] = true
			}
		}
		out = append(out, layerTar(t, ents))
	}
	return out
}

// importLayout imports testRepo:tag from an OCI layout and returns the
// bundle directory.
func importLayout(t *testing.T, layoutDir, tag string) (bundle string, digest v1.Hash) {
	t.Helper()
	store, root := t.TempDir(), t.TempDir()
	tasks := importTasks(t, store, tasksRow("t1", testRepo+":"+tag, "/testbed"))
	r := kiln(t, "images", "import", "--store", store, "--tasks", tasks, "--root", root, "--source", testRepo+"=oci:"+layoutDir)
	require.Equal(t, 0, r.Code, r.Stderr)
	var info images.ImageJSON
	matches, _ := filepath.Glob(filepath.Join(root, "sha256", "*", "image.json"))
	require.Len(t, matches, 1)
	b, err := os.ReadFile(matches[0])
	require.NoError(t, err)
	require.NoError(t, json.Unmarshal(b, &info))
	digest, err = v1.NewHash(info.ManifestDigest)
	require.NoError(t, err)
	return filepath.Dir(matches[0]), digest
}

func TestUnpackMatchesUmoci(t *testing.T) {
	cases := []struct {
		name   string
		layers func(testing.TB) [][]byte
	}{
		{"rich", richLayers},
		{"random-a", func(t testing.TB) [][]byte { return randomLayers(t, 1, 4, 300) }},
		{"random-b", func(t testing.TB) [][]byte { return randomLayers(t, 2, 6, 150) }},
		// More layers than a bundle has lowers: the bottom ones are flattened.
		{"random-flattened", func(t testing.TB) [][]byte { return randomLayers(t, 3, images.MaxLowers+8, 25) }},
		{"cross-layer", crossLayers},
	}
	for _, c := range cases {
		t.Run(c.name, func(t *testing.T) {
			layoutDir := filepath.Join(t.TempDir(), "layout")
			writeLayout(t, layoutDir, map[string]v1.Image{c.name: buildImage(t, imageConfig{env: []string{"PATH=/bin"}}, c.layers(t)...)})
			want := walkTree(t, umociUnpack(t, layoutDir, c.name))
			bundle, _ := importLayout(t, layoutDir, c.name)
			require.FileExists(t, filepath.Join(bundle, "lowers"), "the layered form (root)")
			got := walkTree(t, rootfsOf(t, bundle))
			requireSameTree(t, want, got)
			if c.name == "rich" {
				// The checks that matter most, spelled out.
				assert.Equal(t, "symlink", got.nodes["bin"].Type)
				assert.Equal(t, "4755", got.nodes["usr/bin/sudo"].Perm)
				assert.NotContains(t, got.nodes, "data/old")
				assert.NotContains(t, got.nodes, "cfg/x")
				assert.Contains(t, got.nodes, "cfg/new")
				assert.Equal(t, [][]string{{"usr/bin/tool", "usr/bin/tool4"}}, got.links)
				assert.NotContains(t, got.nodes, "usr/bin/tool2", "whited out")
				assert.Equal(t, "user.kiln=1", got.nodes["etc/xattr"].Xattrs)
				assert.NotEqual(t, got.nodes["usr/bin/tool"].SHA256, got.nodes["usr/bin/tool3"].SHA256, "tool3 links the old tool")
				var info images.ImageJSON
				b, _ := os.ReadFile(filepath.Join(bundle, "image.json"))
				require.NoError(t, json.Unmarshal(b, &info))
				assert.Contains(t, strings.Join(info.Notes, "\n"), `skipped device node "dev/null"`)
			}
		})
	}
}

// TestMaliciousLayers: each layer tries to reach outside the bundle; the
// import fails naming the layer and entry, and the sentinel directory
// beside the bundle root is untouched.
func TestMaliciousLayers(t *testing.T) {
	cases := []struct {
		name  string
		layer []ent
		entry string // the entry the error must name
		below []ent  // more entries of layer 0, below the evil layer 1
	}{
		{"write through a symlink of a lower layer", []ent{file("esc/pwned", "x", 0o644, 0, 0)}, "esc/pwned", []ent{symlink("esc", "SENTINEL")}},
		{"directory through a symlink of a lower layer", []ent{dir("esc/d", 0o755, 0, 0)}, "esc/d", []ent{symlink("esc", "SENTINEL")}},
		{"whiteout through a symlink of a lower layer", []ent{whiteout("esc/.wh.keep")}, "esc/.wh.keep", []ent{symlink("esc", "SENTINEL")}},
		{"hard link through a symlink of a lower layer", []ent{hardlink("h", "esc/keep")}, "h", []ent{symlink("esc", "SENTINEL")}},
		{"overlay xattr", []ent{{name: "f", typ: tar.TypeReg, mode: 0o644, xattrs: map[string]string{"trusted.overlay.redirect": "/x"}}}, "f", nil},
		{"path traversal", []ent{file("../../sentinel/pwned", "x", 0o644, 0, 0)}, "../../sentinel/pwned", nil},
		{"traversal inside a name", []ent{dir("a", 0o755, 0, 0), file("a/../../sentinel/pwned", "x", 0o644, 0, 0)}, "a/../../sentinel/pwned", nil},
		{"absolute symlink escape", []ent{symlink("esc", "SENTINEL"), file("esc/pwned", "x", 0o644, 0, 0)}, "esc/pwned", nil},
		{"relative symlink escape", []ent{symlink("esc", "../../../../../../../../SENTINEL"), file("esc/pwned", "x", 0o644, 0, 0)}, "esc/pwned", nil},
		{"symlink then a directory through it", []ent{symlink("esc", "SENTINEL"), dir("esc/d", 0o755, 0, 0)}, "esc/d", nil},
		{"hard link outside", []ent{hardlink("h", "../../sentinel/keep")}, "h", nil},
		{"hard link through a symlink", []ent{symlink("esc", "SENTINEL"), hardlink("h", "esc/keep")}, "h", nil},
		{"whiteout of ..", []ent{dir("a", 0o755, 0, 0), whiteout("a/.wh..."), file("x", "x", 0o644, 0, 0)}, "a/.wh...", nil},
		{"whiteout through a symlink", []ent{symlink("esc", "SENTINEL"), whiteout("esc/.wh.keep")}, "esc/.wh.keep", nil},
		{"opaque through a symlink", []ent{symlink("esc", "SENTINEL"), whiteout("esc/.wh..wh..opq")}, "esc/.wh..wh..opq", nil},
	}
	for _, c := range cases {
		t.Run(c.name, func(t *testing.T) {
			base := t.TempDir()
			sentinel := filepath.Join(base, "sentinel")
			require.NoError(t, os.MkdirAll(sentinel, 0o755))
			require.NoError(t, os.WriteFile(filepath.Join(sentinel, "keep"), []byte("keep"), 0o644))
			root := filepath.Join(base, "a", "b", "root") // deep, so ../.. chains would land on sentinel
			for i := range c.layer {
				c.layer[i].link = strings.ReplaceAll(c.layer[i].link, "SENTINEL", sentinel)
			}
			below := []ent{file("ok", "ok", 0o644, 0, 0)}
			for _, e := range c.below {
				e.link = strings.ReplaceAll(e.link, "SENTINEL", sentinel)
				below = append(below, e)
			}
			layoutDir := filepath.Join(base, "layout")
			writeLayout(t, layoutDir, map[string]v1.Image{"evil": buildImage(t, imageConfig{},
				layerTar(t, below), layerTar(t, c.layer))})
			store := t.TempDir()
			tasks := importTasks(t, store, tasksRow("t1", testRepo+":evil", "/testbed"))
			r := kiln(t, "images", "import", "--store", store, "--tasks", tasks, "--root", root, "--source", testRepo+"=oci:"+layoutDir)
			require.Equal(t, 5, r.Code, "invalid input, not a failure to retry: %s", r.Stderr)
			assert.Contains(t, r.Stderr, "layer 1 (sha256:")
			assert.Contains(t, r.Stderr, fmt.Sprintf("entry %q", c.entry))
			ents, err := os.ReadDir(sentinel)
			require.NoError(t, err)
			require.Len(t, ents, 1, "the sentinel directory changed")
			b, err := os.ReadFile(filepath.Join(sentinel, "keep"))
			require.NoError(t, err)
			assert.Equal(t, "keep", string(b))
			fi, err := os.Stat(filepath.Join(sentinel, "keep"))
			require.NoError(t, err)
			assert.Equal(t, uint64(1), nlink(fi), "a hard link to the sentinel was made")
			// No bundle, no temporary directory, no version; in the layer
			// store only the harmless layer 0, nothing of layer 1.
			assert.Empty(t, bundleDirs(t, root))
			assert.Len(t, layerDirs(t, root), 1, "only layer 0 is in the layer store")
			assert.Equal(t, 3, kiln(t, "show", "--store", store, "images").Code)
		})
	}
}
