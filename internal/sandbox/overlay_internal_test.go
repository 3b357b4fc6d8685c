package sandbox

import (
	"os"
	"os/exec"
	"path/filepath"
	"testing"

	"github.com/kilnrl/kiln/internal/testenv"
)

// The fuse-overlayfs fallback gives the same copy-on-write view as the
// kernel overlay: writes land in upper, lower stays as it was.
func TestFuseOverlay(t *testing.T) {
	if _, err := exec.LookPath("fuse-overlayfs"); err != nil {
		testenv.SkipOrFail(t, "needs fuse-overlayfs (%v); run scripts/install-test-deps.sh", err)
	}
	if os.Geteuid() != 0 {
		testenv.SkipOrFail(t, "needs root (a fuse mount)")
	}
	d := t.TempDir()
	lower, upper, work, merged := filepath.Join(d, "lower"), filepath.Join(d, "upper"), filepath.Join(d, "work"), filepath.Join(d, "merged")
	for _, p := range []string{lower, upper, work, merged} {
		if err := os.Mkdir(p, 0o755); err != nil {
			t.Fatal(err)
		}
	}
	if err := os.WriteFile(filepath.Join(lower, "f"), []byte("image"), 0o644); err != nil {
		t.Fatal(err)
	}
	ov, err := mountFuse("lowerdir="+lower+",upperdir="+upper+",workdir="+work, merged)
	if err != nil {
		t.Fatal(err)
	}
	if err := os.WriteFile(filepath.Join(merged, "f"), []byte("sandbox"), 0o644); err != nil {
		ov.unmount()
		t.Fatal(err)
	}
	if err := ov.unmount(); err != nil {
		t.Fatal(err)
	}
	for p, want := range map[string]string{filepath.Join(lower, "f"): "image", filepath.Join(upper, "f"): "sandbox"} {
		if b, err := os.ReadFile(p); err != nil || string(b) != want {
			t.Errorf("%s: %q %v; want %q", p, b, err, want)
		}
	}
}
