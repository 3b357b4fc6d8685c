// Command kiln-images imports task images into digest-named rootfs bundles
// on a sandbox node and records them as an images dataset
// ("kiln images import", "kiln images gc").
package main

import (
	"os"

	"github.com/urfave/cli/v2"

	"github.com/kilnrl/kiln/internal/stagecmd"
	"github.com/kilnrl/kiln/stages/images"
)

func main() {
	env := &stagecmd.Env{Stdout: os.Stdout, Stderr: os.Stderr, Log: stagecmd.NewLogger(os.Stderr, false)}
	app := env.App(&cli.App{
		Name:     "kiln-images",
		Usage:    "import task images into rootfs bundles named by digest",
		Commands: images.Commands(env),
	})
	os.Exit(stagecmd.Main(app, os.Args, os.Stderr))
}
