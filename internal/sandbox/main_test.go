package sandbox_test

import (
	"testing"

	"github.com/kilnrl/kiln/internal/sandbox/sandboxtest"
)

// helper is the kiln-sandbox-helper binary built for this test run.
var helper string

func TestMain(m *testing.M) { sandboxtest.Main(m, &helper) }
