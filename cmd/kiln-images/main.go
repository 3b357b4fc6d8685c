// Command kiln-images imports task images into digest-named rootfs bundles
// on a sandbox node and records them as an images dataset
// ("kiln images import", "kiln images gc").
package main

import (
	"os"

	"github.com/kilnrl/kiln/internal/stagecmd"
	"github.com/kilnrl/kiln/stages/images"
)

func main() {
	os.Exit(stagecmd.Run(images.App))
}
