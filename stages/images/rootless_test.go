package images_test

import (
	"io"
	"os"
	"os/exec"
	"path/filepath"
	"syscall"
	"testing"

	v1 "github.com/google/go-containerregistry/pkg/v1"
	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
)

// TestRootlessImport runs the import as an unprivileged user (nobody):
// owners are not applied (everything belongs to the importing user), and
// everything else matches umoci's unpack as root, read-only directories
// and files included (they are made writable while layers are applied and
// get their modes at the end).
func TestRootlessImport(t *testing.T) {
	if os.Geteuid() != 0 {
		t.Skip("needs root to start a process as another user")
	}
	const nobody = 65534
	base := t.TempDir()
	require.NoError(t, os.Chmod(base, 0o755))
	require.NoError(t, os.Chmod(filepath.Dir(base), 0o755))
	layoutDir := filepath.Join(base, "layout")
	writeLayout(t, layoutDir, map[string]v1.Image{"rich": buildImage(t, imageConfig{}, richLayers(t)...)})
	chmodTree(t, layoutDir)
	store := filepath.Join(base, "store")
	require.NoError(t, os.Mkdir(store, 0o755))
	tasks := importTasks(t, store, tasksRow("t1", testRepo+":rich", "/testbed"))
	root := filepath.Join(base, "root")
	require.NoError(t, os.Mkdir(root, 0o755))
	for _, p := range []string{store, root} {
		require.NoError(t, filepath.Walk(p, func(p string, _ os.FileInfo, err error) error {
			if err != nil {
				return err
			}
			return os.Lchown(p, nobody, nobody)
		}))
	}
	// The test binary, where nobody can run it.
	self := filepath.Join(base, "images.test")
	copyFile(t, os.Args[0], self)

	cmd := exec.Command(self, "images", "import", "--store", store, "--tasks", tasks, "--root", root, "--source", testRepo+"=oci:"+layoutDir)
	cmd.Env = append(os.Environ(), "KILN_TEST_HELPER=1", "HOME="+base)
	cmd.SysProcAttr = &syscall.SysProcAttr{Credential: &syscall.Credential{Uid: nobody, Gid: nobody}}
	out, err := cmd.CombinedOutput()
	require.NoError(t, err, "%s", out)

	bundles := bundleDirs(t, root)
	require.Len(t, bundles, 1)
	got := walkTree(t, filepath.Join(root, "sha256", bundles[0], "rootfs"))
	want := walkTree(t, umociUnpack(t, layoutDir, "rich"))
	for p, n := range want.nodes {
		n.UID, n.GID = nobody, nobody
		want.nodes[p] = n
	}
	requireSameTree(t, want, got)
	assert.Equal(t, "555", got.nodes["ro"].Perm, "modes are final")
	assert.Equal(t, "400", got.nodes["ro/b"].Perm)
}

func chmodTree(t *testing.T, dir string) {
	t.Helper()
	require.NoError(t, filepath.Walk(dir, func(p string, fi os.FileInfo, err error) error {
		if err != nil {
			return err
		}
		if fi.IsDir() {
			return os.Chmod(p, 0o755)
		}
		return os.Chmod(p, 0o644)
	}))
}

func copyFile(t *testing.T, src, dst string) {
	t.Helper()
	in, err := os.Open(src)
	require.NoError(t, err)
	defer in.Close()
	out, err := os.OpenFile(dst, os.O_WRONLY|os.O_CREATE|os.O_EXCL, 0o755)
	require.NoError(t, err)
	_, err = io.Copy(out, in)
	require.NoError(t, err)
	require.NoError(t, out.Close())
}
