package sandbox_test

import (
	"fmt"
	"os"
	"testing"

	"github.com/kilnrl/kiln/stages/sandbox/sandboxtest"
)

// helper is the kiln-sandbox-helper binary built for this test run.
var helper string

func TestMain(m *testing.M) {
	dir, err := os.MkdirTemp("", "kiln-sandbox-test-")
	if err != nil {
		fmt.Fprintln(os.Stderr, err)
		os.Exit(1)
	}
	if helper, err = sandboxtest.BuildHelper(dir); err != nil {
		fmt.Fprintln(os.Stderr, err)
		os.Exit(1)
	}
	code := m.Run()
	os.RemoveAll(dir)
	os.Exit(code)
}
