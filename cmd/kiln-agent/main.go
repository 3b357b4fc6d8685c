// Command kiln-agent is kiln's shell agent: a minimal coding-agent loop (one
// bash tool and one file-edit tool) that speaks OpenAI Chat Completions to
// kiln's adapter, so its turns are recorded like any other client's. The
// rollout stage bind-mounts it into a task's sandbox, so it must be a
// static binary: build it with CGO_ENABLED=0, as make build does (see
// package shellagent's doc and shellagent.CheckStatic). kiln-agent --help
// is the manual.
package main

import (
	"os"
	"runtime"
	"runtime/debug"

	"github.com/kilnrl/kiln/internal/agent/shellagent"
)

func main() {
	tuneRuntime()
	os.Exit(shellagent.Main(os.Args[1:], os.Getenv, os.Stdout, os.Stderr))
}

// tuneRuntime fits the Go runtime to a loop that does one thing at a time
// beside the commands it starts, on cores those commands and 31 other
// sandboxes share: one P (no scheduler spinning between the HTTP client's
// goroutines), and no collection until the heap reaches 64 MiB (a run's
// live heap is its conversation, KBs to a few MB). Together they cut the
// agent's own CPU by about a fifth in BenchmarkRun (docs/rollout.md §6.2).
// GOMAXPROCS, GOGC and GOMEMLIMIT in the environment win; none of this
// reaches the commands, which are other processes.
func tuneRuntime() {
	if os.Getenv("GOMAXPROCS") == "" {
		runtime.GOMAXPROCS(1)
	}
	if os.Getenv("GOGC") == "" && os.Getenv("GOMEMLIMIT") == "" {
		debug.SetGCPercent(-1)
		debug.SetMemoryLimit(64 << 20)
	}
}
