// Command kiln-sync publishes trained weights as versioned, delta-aware
// data, pulls a version onto an engine host byte for byte, and reloads
// the engines (see stages/sync, docs/sync.md).
package main

import (
	"os"
	"runtime/debug"

	"github.com/kilnrl/kiln/internal/stagecmd"
	"github.com/kilnrl/kiln/stages/sync"
)

// memoryLimit is the Go heap's soft limit unless GOMEMLIMIT says
// otherwise: a publish holds a few tensors at a time (docs/sync.md §1),
// and without a limit the collector lets the heap grow to twice what is
// live, past the 256 MiB an engine host can spare beside its engine
// (BENCHMARKS.md).
const memoryLimit = 192 << 20

func main() {
	if os.Getenv("GOMEMLIMIT") == "" {
		debug.SetMemoryLimit(memoryLimit)
	}
	os.Exit(stagecmd.Run(sync.App))
}
