// Command kiln-advantages turns trajectories and grades into per-segment
// advantages with per-rollout statistics, selects learnable tasks and
// prints grade statistics (see stages/advantages).
package main

import (
	"os"

	"github.com/kilnrl/kiln/internal/stagecmd"
	"github.com/kilnrl/kiln/stages/advantages"
)

func main() {
	os.Exit(stagecmd.Run(advantages.App))
}
