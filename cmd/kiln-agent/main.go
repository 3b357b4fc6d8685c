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

	"github.com/kilnrl/kiln/internal/agent/shellagent"
)

func main() {
	os.Exit(shellagent.Main(os.Args[1:], os.Getenv, os.Stdout, os.Stderr))
}
