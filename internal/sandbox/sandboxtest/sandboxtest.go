// Package sandboxtest boots real bwrap sandboxes for tests: it finds the base
// rootfs, builds the in-sandbox helper and enforces the repository's rule for
// missing tools (fail when CI=true, skip with an install hint otherwise).
package sandboxtest

import (
	"context"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"runtime"
	"testing"

	"github.com/kilnrl/kiln/fixtures"
	"github.com/kilnrl/kiln/internal/sandbox"
	"github.com/kilnrl/kiln/internal/testenv"
)

// missing fails the test under CI=true and skips it otherwise.
func missing(tb testing.TB, format string, args ...any) {
	tb.Helper()
	testenv.SkipOrFail(tb, "%s; run scripts/install-test-deps.sh", fmt.Sprintf(format, args...))
}

// Require checks what real bwrap sandboxes need: root, bubblewrap and the
// base rootfs (fixtures.BaseRootfs: debootstrap bookworm minbase with bash,
// git, patch, python3, pytest), whose directory it returns.
func Require(tb testing.TB) string {
	tb.Helper()
	if os.Geteuid() != 0 {
		missing(tb, "bwrap sandbox tests need root (kernel overlayfs, cgroups, the agent uid)")
	}
	if _, err := os.Stat("/usr/bin/bwrap"); err != nil {
		if _, err := exec.LookPath("bwrap"); err != nil {
			missing(tb, "bubblewrap is not installed")
		}
	}
	root, err := fixtures.BaseRootfs(context.Background())
	if err != nil {
		missing(tb, "base rootfs: %v", err)
	}
	return root
}

// BuildHelper builds cmd/kiln-sandbox-helper into dir and returns its path.
// Tests call it once from TestMain.
func BuildHelper(dir string) (string, error) {
	goBin := filepath.Join(runtime.GOROOT(), "bin", "go")
	if _, err := os.Stat(goBin); err != nil {
		goBin = "go"
	}
	out := filepath.Join(dir, sandbox.HelperName)
	cmd := exec.Command(goBin, "build", "-o", out, "github.com/kilnrl/kiln/cmd/kiln-sandbox-helper")
	if b, err := cmd.CombinedOutput(); err != nil {
		return "", fmt.Errorf("build %s: %w: %s", sandbox.HelperName, err, b)
	}
	return out, nil
}

// Main is a TestMain for packages whose tests boot sandboxes: it builds the
// helper into a temporary directory, stores its path in *helper, runs the
// tests and exits with their code.
func Main(m *testing.M, helper *string) {
	dir, err := os.MkdirTemp("", "kiln-helper-")
	if err != nil {
		fmt.Fprintln(os.Stderr, err)
		os.Exit(1)
	}
	if *helper, err = BuildHelper(dir); err != nil {
		fmt.Fprintln(os.Stderr, err)
		os.Exit(1)
	}
	code := m.Run()
	os.RemoveAll(dir)
	os.Exit(code)
}

// Boot boots a bwrap sandbox over the base rootfs (unless opts.Rootfs is
// set) with the given helper and closes it when the test ends.
func Boot(tb testing.TB, helper string, opts sandbox.Options) sandbox.Sandbox {
	tb.Helper()
	root := Require(tb)
	if opts.Rootfs == "" {
		opts.Rootfs = root
	}
	opts.HelperPath = helper
	sb, err := sandbox.Boot(context.Background(), opts)
	if err != nil {
		tb.Fatalf("boot sandbox: %v", err)
	}
	tb.Cleanup(func() {
		if err := sb.Close(); err != nil {
			tb.Errorf("close sandbox: %v", err)
		}
	})
	return sb
}
