// Command kiln-rollout runs agents and records their trajectories; today it
// assembles trajectories from saved turn records ("kiln rollout assemble").
package main

import (
	"os"

	"github.com/kilnrl/kiln/internal/stagecmd"
	"github.com/kilnrl/kiln/stages/rollout"
)

func main() {
	os.Exit(stagecmd.Run(rollout.App))
}
