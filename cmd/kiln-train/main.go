// Command kiln-train batches trajectories and advantages into
// rollout-atomic optimizer steps, runs the PyTorch trainer on them and
// commits the checkpoint it saves (see stages/train).
package main

import (
	"os"

	"github.com/kilnrl/kiln/internal/stagecmd"
	"github.com/kilnrl/kiln/stages/train"
)

func main() {
	os.Exit(stagecmd.Run(train.App))
}
