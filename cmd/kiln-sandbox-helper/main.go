// Command kiln-sandbox-helper runs inside kiln's bwrap sandboxes: the init
// that serves command requests and forwards the sandbox's one endpoint, and
// the per-command child. The bwrap provider (internal/sandbox) finds it beside
// the running executable or on PATH and bind-mounts it into each sandbox; it
// must stay a static binary (see package sandboxinit).
package main

import (
	"os"

	"github.com/kilnrl/kiln/internal/sandbox/sandboxinit"
)

func main() {
	os.Exit(sandboxinit.Main(os.Args[1:], os.Stdout, os.Stderr))
}
