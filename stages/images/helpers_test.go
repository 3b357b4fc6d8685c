package images_test

import (
	"archive/tar"
	"bytes"
	"crypto/sha256"
	"encoding/hex"
	"encoding/json"
	"fmt"
	"io"
	"io/fs"
	"os"
	"os/exec"
	"path/filepath"
	"sort"
	"strings"
	"syscall"
	"testing"
	"time"

	v1 "github.com/google/go-containerregistry/pkg/v1"
	"github.com/google/go-containerregistry/pkg/v1/empty"
	"github.com/google/go-containerregistry/pkg/v1/layout"
	"github.com/google/go-containerregistry/pkg/v1/mutate"
	"github.com/google/go-containerregistry/pkg/v1/tarball"
	"github.com/google/go-containerregistry/pkg/v1/types"
	"github.com/stretchr/testify/require"
	"github.com/urfave/cli/v2"
	"golang.org/x/sys/unix"

	"github.com/kilnrl/kiln/internal/stagecmd"
	"github.com/kilnrl/kiln/internal/stagecmd/stagetest"
	"github.com/kilnrl/kiln/internal/testenv"
	"github.com/kilnrl/kiln/stages/convert"
	"github.com/kilnrl/kiln/stages/datasets"
	"github.com/kilnrl/kiln/stages/images"
)

// The test binary doubles as a kiln process for the crash and concurrency
// tests: with KILN_TEST_HELPER=1 it runs the commands on its arguments.
// KILN_TEST_PAUSE_AT names a hook point at which it prints "PAUSED
// <point>" on stderr and waits for SIGKILL (or KILN_TEST_RESUME_FILE).
func TestMain(m *testing.M) {
	if os.Getenv("KILN_TEST_HELPER") == "1" {
		env := &stagecmd.Env{Stdout: os.Stdout, Stderr: os.Stderr, Log: stagecmd.NewLogger(os.Stderr, false), Hook: stagetest.PauseHook}
		app := stagecmd.CommonApp(&cli.App{Name: "kiln", Commands: commands(env)}, env.Stdout, env.Stderr)
		os.Exit(stagecmd.Main(app, append([]string{"kiln"}, os.Args[1:]...), os.Stderr))
	}
	os.Exit(m.Run())
}

// commands: "images import|gc|du|verify", "convert mimo|..." plus the kiln
// dataset commands.
func commands(env *stagecmd.Env) []*cli.Command {
	return append([]*cli.Command{{Name: "images", Subcommands: images.Commands(env)}, {Name: "convert", Subcommands: convert.Commands(env)}},
		datasets.Commands(env)...)
}

func kiln(t testing.TB, args ...string) stagetest.Result {
	t.Helper()
	return stagetest.Run(t, commands, args...)
}

// --- building test images ---------------------------------------------------

// ent is one tar entry of a test layer.
type ent struct {
	name     string
	typ      byte
	mode     int64
	uid, gid int
	body     string
	link     string
	xattrs   map[string]string
}

func dir(name string, mode int64, uid, gid int) ent {
	return ent{name: name, typ: tar.TypeDir, mode: mode, uid: uid, gid: gid}
}
func file(name, body string, mode int64, uid, gid int) ent {
	return ent{name: name, typ: tar.TypeReg, mode: mode, uid: uid, gid: gid, body: body}
}
func symlink(name, target string) ent {
	return ent{name: name, typ: tar.TypeSymlink, mode: 0o777, link: target}
}
func hardlink(name, target string) ent {
	return ent{name: name, typ: tar.TypeLink, mode: 0o644, link: target}
}
func whiteout(name string) ent { return file(name, "", 0o644, 0, 0) }

func layerTar(t testing.TB, ents []ent) []byte {
	t.Helper()
	var b bytes.Buffer
	tw := tar.NewWriter(&b)
	mt := time.Unix(1700000000, 0)
	for _, e := range ents {
		h := &tar.Header{Name: e.name, Typeflag: e.typ, Mode: e.mode, Uid: e.uid, Gid: e.gid, Linkname: e.link,
			Size: int64(len(e.body)), ModTime: mt, Format: tar.FormatPAX}
		if e.typ != tar.TypeReg {
			h.Size = 0
		}
		if e.typ == tar.TypeChar {
			h.Devmajor, h.Devminor = 1, 3
		}
		for k, v := range e.xattrs {
			if h.PAXRecords == nil {
				h.PAXRecords = map[string]string{}
			}
			h.PAXRecords["SCHILY.xattr."+k] = v
		}
		require.NoError(t, tw.WriteHeader(h))
		if e.typ == tar.TypeReg {
			_, err := tw.Write([]byte(e.body))
			require.NoError(t, err)
		}
	}
	require.NoError(t, tw.Close())
	return b.Bytes()
}

// imageConfig is the config of test images.
type imageConfig struct {
	env     []string
	workdir string
	cmd     []string
}

// buildImage makes an image of the given layers (gzip-compressed).
func buildImage(t testing.TB, cfg imageConfig, layers ...[]byte) v1.Image {
	t.Helper()
	img := mutate.ConfigMediaType(mutate.MediaType(empty.Image, types.OCIManifestSchema1), types.OCIConfigJSON)
	for _, l := range layers {
		data := l
		layer, err := tarball.LayerFromOpener(func() (io.ReadCloser, error) { return io.NopCloser(bytes.NewReader(data)), nil },
			tarball.WithMediaType(types.OCILayer))
		require.NoError(t, err)
		img, err = mutate.AppendLayers(img, layer)
		require.NoError(t, err)
	}
	cf, err := img.ConfigFile()
	require.NoError(t, err)
	cf = cf.DeepCopy()
	cf.OS, cf.Architecture = "linux", "amd64"
	cf.Config.Env, cf.Config.WorkingDir, cf.Config.Cmd = cfg.env, cfg.workdir, cfg.cmd
	img, err = mutate.ConfigFile(img, cf)
	require.NoError(t, err)
	return img
}

// writeLayout writes images into an OCI layout, tagged by ref.name.
func writeLayout(t testing.TB, dir string, tagged map[string]v1.Image) {
	t.Helper()
	p, err := layout.Write(dir, empty.Index)
	require.NoError(t, err)
	tags := make([]string, 0, len(tagged))
	for tag := range tagged {
		tags = append(tags, tag)
	}
	sort.Strings(tags)
	for _, tag := range tags {
		require.NoError(t, p.AppendImage(tagged[tag], layout.WithAnnotations(map[string]string{"org.opencontainers.image.ref.name": tag})))
	}
}

// tasksRow is one reference JSONL task row.
func tasksRow(id, image, workdir string) string {
	md := map[string]any{"instance_id": id, "image": image}
	if workdir != "" {
		md["workdir"] = workdir
	}
	b, _ := json.Marshal(map[string]any{"prompt": "p " + id, "label": id, "metadata": md})
	return string(b)
}

// importTasks writes rows as a tasks dataset in store and returns its ref.
func importTasks(t testing.TB, store string, rows ...string) string {
	t.Helper()
	p := filepath.Join(t.TempDir(), "tasks.jsonl")
	require.NoError(t, os.WriteFile(p, []byte(strings.Join(rows, "\n")+"\n"), 0o644))
	r := kiln(t, "import", "tasks", "--store", store, "--out", "tasks", p)
	require.Equal(t, 0, r.Code, r.Stderr)
	return r.LastLine()
}

// --- comparing trees --------------------------------------------------------

// node is what the comparison checks of one filesystem entry.
type node struct {
	Type     string
	Perm     string // permission and setuid/setgid/sticky bits
	UID, GID uint32
	Link     string
	SHA256   string
	Xattrs   string // sorted name=value lines
}

// tree describes a rootfs: its entries, and its hard-link groups (paths
// sharing an inode, for regular files with more than one link).
type tree struct {
	nodes map[string]node
	links [][]string
}

func walkTree(t testing.TB, root string) tree {
	t.Helper()
	tr := tree{nodes: map[string]node{}}
	inodes := map[uint64][]string{}
	err := filepath.WalkDir(root, func(p string, d fs.DirEntry, err error) error {
		if err != nil {
			return err
		}
		rel, _ := filepath.Rel(root, p)
		fi, err := os.Lstat(p)
		if err != nil {
			return err
		}
		st := fi.Sys().(*syscall.Stat_t)
		n := node{Perm: fmt.Sprintf("%o", uint32(fi.Mode().Perm())|uint32(st.Mode)&0o7000), UID: st.Uid, GID: st.Gid}
		switch {
		case fi.Mode().IsRegular():
			n.Type = "file"
			data, err := os.ReadFile(p)
			if err != nil {
				return err
			}
			sum := sha256.Sum256(data)
			n.SHA256 = hex.EncodeToString(sum[:])
			if st.Nlink > 1 {
				inodes[st.Ino] = append(inodes[st.Ino], rel)
			}
		case fi.IsDir():
			n.Type = "dir"
		case fi.Mode()&fs.ModeSymlink != 0:
			n.Type = "symlink"
			n.Perm = ""
			n.Link, _ = os.Readlink(p)
		case fi.Mode()&fs.ModeNamedPipe != 0:
			n.Type = "fifo"
		case fi.Mode()&fs.ModeDevice != 0:
			n.Type = "device"
		default:
			n.Type = fi.Mode().Type().String()
		}
		n.Xattrs = xattrList(t, p)
		tr.nodes[rel] = n
		return nil
	})
	require.NoError(t, err)
	for _, g := range inodes {
		if len(g) > 1 {
			sort.Strings(g)
			tr.links = append(tr.links, g)
		}
	}
	sort.Slice(tr.links, func(i, j int) bool { return tr.links[i][0] < tr.links[j][0] })
	return tr
}

// requireSameTree fails with the differing paths when got and want differ.
// Device nodes of want are dropped first (kiln skips them by design).
func requireSameTree(t testing.TB, want, got tree) {
	t.Helper()
	var devs []string
	for p, n := range want.nodes {
		if n.Type == "device" {
			devs = append(devs, p)
			delete(want.nodes, p)
		}
	}
	for p, n := range got.nodes {
		require.NotEqual(t, "device", n.Type, "kiln created device node %q", p)
	}
	var diffs []string
	for p, w := range want.nodes {
		g, ok := got.nodes[p]
		switch {
		case !ok:
			diffs = append(diffs, fmt.Sprintf("missing %q: %+v", p, w))
		case g != w:
			diffs = append(diffs, fmt.Sprintf("differs %q: umoci %+v, kiln %+v", p, w, g))
		}
	}
	for p, g := range got.nodes {
		if _, ok := want.nodes[p]; !ok {
			diffs = append(diffs, fmt.Sprintf("extra %q: %+v", p, g))
		}
	}
	sort.Strings(diffs)
	if len(diffs) > 40 {
		diffs = append(diffs[:40], fmt.Sprintf("... %d more", len(diffs)-40))
	}
	require.Empty(t, diffs, "trees differ (device nodes ignored: %v)", devs)
	require.Equal(t, want.links, got.links, "hard-link groups differ")
}

// needTool returns the path of a tool the test needs: under CI=true a
// missing tool fails the test, elsewhere it skips with an install hint.
func needTool(t testing.TB, name string) string {
	t.Helper()
	p, err := exec.LookPath(name)
	if err == nil {
		return p
	}
	testenv.SkipOrFail(t, "%s is not installed: run scripts/install-test-deps.sh (apt-get install %s)", name, name)
	return ""
}

// umociUnpack runs `umoci unpack --image LAYOUT:TAG BUNDLE` as root and
// returns the rootfs.
func umociUnpack(t testing.TB, layoutDir, tag string) string {
	t.Helper()
	umoci := needTool(t, "umoci")
	if os.Geteuid() != 0 {
		testenv.SkipOrFail(t, "the umoci comparison needs root (umoci unpack without --rootless)")
	}
	bundle := filepath.Join(t.TempDir(), "umoci-bundle")
	out, err := exec.Command(umoci, "unpack", "--image", layoutDir+":"+tag, bundle).CombinedOutput()
	require.NoError(t, err, "umoci unpack: %s", out)
	return filepath.Join(bundle, "rootfs")
}

// rootfsOf is what a sandbox sees of a bundle: its rootfs/ for a
// whole-rootfs bundle, else its lowers mounted read-only with kernel
// overlayfs (unmounted at cleanup), as the sandbox mounts them.
func rootfsOf(t testing.TB, bundle string) string {
	t.Helper()
	b, err := os.ReadFile(filepath.Join(bundle, "lowers"))
	if os.IsNotExist(err) {
		return filepath.Join(bundle, "rootfs")
	}
	require.NoError(t, err)
	var lowers []string
	for _, l := range strings.Fields(string(b)) {
		lowers = append([]string{filepath.Join(bundle, l)}, lowers...)
	}
	// A read-only overlay needs two lowers: an empty one goes at the bottom.
	empty := t.TempDir()
	merged := t.TempDir()
	opts := "lowerdir=" + strings.Join(append(lowers, empty), ":")
	require.NoError(t, unix.Mount("overlay", merged, "overlay", unix.MS_RDONLY, opts), "mount %s", opts)
	t.Cleanup(func() { unix.Unmount(merged, unix.MNT_DETACH) })
	return merged
}

func nlink(fi os.FileInfo) uint64 { return uint64(fi.Sys().(*syscall.Stat_t).Nlink) }

// bundleDirs lists what is under ROOT/sha256 besides lock files: bundles
// and temporary directories.
func bundleDirs(t testing.TB, root string) []string {
	t.Helper()
	ents, err := os.ReadDir(filepath.Join(root, "sha256"))
	if os.IsNotExist(err) {
		return nil
	}
	require.NoError(t, err)
	var out []string
	for _, e := range ents {
		if !strings.HasSuffix(e.Name(), ".lock") {
			out = append(out, e.Name())
		}
	}
	return out
}

// layerDirs lists what is under ROOT/layers/sha256 besides lock files:
// layers and temporary directories.
func layerDirs(t testing.TB, root string) []string {
	t.Helper()
	ents, err := os.ReadDir(filepath.Join(root, "layers", "sha256"))
	if os.IsNotExist(err) {
		return nil
	}
	require.NoError(t, err)
	var out []string
	for _, e := range ents {
		if !strings.HasSuffix(e.Name(), ".lock") {
			out = append(out, e.Name())
		}
	}
	return out
}

func xattrList(t testing.TB, p string) string {
	t.Helper()
	buf := make([]byte, 64<<10)
	n, err := unix.Llistxattr(p, buf)
	if err != nil {
		return "error: " + err.Error()
	}
	var out []string
	for _, name := range strings.Split(string(buf[:n]), "\x00") {
		if name == "" {
			continue
		}
		val := make([]byte, 64<<10)
		m, err := unix.Lgetxattr(p, name, val)
		if err != nil {
			out = append(out, name+"=error: "+err.Error())
			continue
		}
		out = append(out, name+"="+string(val[:m]))
	}
	sort.Strings(out)
	return strings.Join(out, "\n")
}
