package grade

import (
	"os"
	"sync"
	"sync/atomic"
	"testing"

	"github.com/kilnrl/kiln/internal/sandbox/sandboxtest"
)

var helperBuilt atomic.Bool

// HelperDirBuilt reports whether HelperDir was called.
func HelperDirBuilt() bool { return helperBuilt.Load() }

// HelperDir builds the sandbox helper once per test binary and returns its
// directory (for tests of both this package and grade_test).
var HelperDir = sync.OnceValues(func() (string, error) {
	helperBuilt.Store(true)
	dir, err := os.MkdirTemp("", "kiln-grade-helper-")
	if err != nil {
		return "", err
	}
	_, err = sandboxtest.BuildHelper(dir)
	return dir, err
})

// TestMain removes the helper HelperDir built, if any.
func TestMain(m *testing.M) {
	code := m.Run()
	if HelperDirBuilt() {
		if dir, err := HelperDir(); err == nil {
			os.RemoveAll(dir)
		}
	}
	os.Exit(code)
}
