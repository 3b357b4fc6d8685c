// Command kiln-convert converts coding-RL datasets (MiMo, SWE-bench style,
// SWE-bench Pro, f2p-script rows) into versions of the tasks kind.
package main

import (
	"os"
	"runtime/debug"

	"github.com/kilnrl/kiln/internal/stagecmd"
	"github.com/kilnrl/kiln/stages/convert"
)

func main() {
	// The conversion's live memory is bounded (a shard's compressed bytes,
	// one row group and the rows in flight; see stages/convert) plus about
	// 300 bytes per task for the id and image lookups (~30 MB at 100,000
	// tasks); a soft limit keeps the collector near that instead of letting
	// the heap double. GOMEMLIMIT overrides it.
	if os.Getenv("GOMEMLIMIT") == "" {
		debug.SetMemoryLimit(192 << 20)
	}
	os.Exit(stagecmd.Run(convert.App))
}
