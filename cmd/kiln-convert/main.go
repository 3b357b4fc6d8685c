// Command kiln-convert converts coding-RL datasets (MiMo, SWE-bench style,
// SWE-bench Pro, f2p-script rows) into versions of the tasks kind.
package main

import (
	"os"
	"runtime/debug"

	"github.com/urfave/cli/v2"

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
	env := &stagecmd.Env{Stdout: os.Stdout, Stderr: os.Stderr, Log: stagecmd.NewLogger(os.Stderr, false)}
	app := env.App(&cli.App{
		Name:     "kiln-convert",
		Usage:    "convert coding-RL datasets into versioned tasks",
		Commands: convert.Commands(env),
	})
	os.Exit(stagecmd.Main(app, os.Args, os.Stderr))
}
