package slurm

import (
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"sync"
	"testing"
	"time"
)

// builtBin is the directory buildAll builds into once per test binary
// (TestMain removes it); builtErr is that build's failure, reported to
// every test that asks.
var (
	buildOnce sync.Once
	builtBin  string
	builtErr  error
)

// TestMain removes buildAll's directory after the tests.
func TestMain(m *testing.M) {
	code := m.Run()
	if builtBin != "" {
		os.RemoveAll(filepath.Dir(builtBin))
	}
	os.Exit(code)
}

// buildAll returns a directory holding every binary of ./cmd/..., static
// (kiln-rollout finds kiln-agent and the sandbox helper beside it; Slurm
// jobs run them on any node). It builds once per test binary, on first
// use: linking ten static binaries takes minutes on a loaded machine, and
// the tests that need them share one build. The directory is
// world-readable (Slurm jobs and sandboxes may run as other users).
func buildAll(t *testing.T) string {
	t.Helper()
	buildOnce.Do(func() {
		dir, err := os.MkdirTemp("", "kiln-slurm-bin-")
		if err != nil {
			builtErr = err
			return
		}
		os.Chmod(dir, 0o755)
		builtBin = filepath.Join(dir, "bin")
		start := time.Now()
		// -s -w: no symbol table or DWARF, which the tests never read and
		// which make up much of the link time.
		build := exec.Command("go", "build", "-ldflags=-s -w", "-o", builtBin+"/", "../../cmd/...")
		build.Env = append(os.Environ(), "CGO_ENABLED=0")
		if out, err := build.CombinedOutput(); err != nil {
			builtErr = fmt.Errorf("go build ../../cmd/...: %v\n%s", err, out)
			return
		}
		t.Logf("built ./cmd/... into %s in %v", builtBin, time.Since(start).Round(time.Second))
	})
	if builtErr != nil {
		t.Fatal(builtErr)
	}
	return builtBin
}
