// Command kiln-sync publishes trained weights as versioned, delta-aware
// data, pulls a version onto an engine host byte for byte, and reloads
// the engines (see stages/sync, docs/sync.md).
package main

import (
	"os"

	"github.com/kilnrl/kiln/internal/stagecmd"
	"github.com/kilnrl/kiln/stages/sync"
)

func main() {
	os.Exit(stagecmd.Run(sync.App))
}
