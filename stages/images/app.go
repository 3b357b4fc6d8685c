package images

import (
	"github.com/urfave/cli/v2"

	"github.com/kilnrl/kiln/internal/stagecmd"
)

// App is the kiln-images binary on env.
func App(env *stagecmd.Env) *cli.App {
	return env.App(&cli.App{
		Name:     "kiln-images",
		Usage:    "import task images into rootfs bundles named by digest",
		Commands: Commands(env),
	})
}
