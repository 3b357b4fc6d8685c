package harness

import (
	"strconv"
	"time"

	"github.com/kilnrl/kiln/internal/sandbox"
)

// ShellAgentPath is where the shell agent's binary appears inside the
// sandbox: on the sandbox's /run tmpfs, beside its init helper, so the
// image needs nothing and the overlay is not written.
const ShellAgentPath = "/run/kiln/bin/" + ShellAgentName

// Shell is kiln's own shell agent (cmd/kiln-agent): a static binary bound
// read-only into the sandbox that speaks Chat Completions to the adapter
// with a bash and an edit tool (docs/rollout.md §3.2).
type Shell struct {
	// Binary is the host path of kiln-agent.
	Binary string
	// MaxTurns and CommandTimeout are passed on when set.
	MaxTurns       int
	CommandTimeout time.Duration
	// Args and Env are --agent-args and --agent-env for this harness.
	Args, Env []string
}

// Name implements Harness.
func (s *Shell) Name() string { return ShellName }

// Mounts implements Harness.
func (s *Shell) Mounts() []sandbox.Mount {
	return []sandbox.Mount{{Source: s.Binary, Target: ShellAgentPath}}
}

// Files implements Harness: the shell agent needs no configuration.
func (s *Shell) Files(RunSpec) []File { return nil }

// Command implements Harness. The token goes in the environment, never on
// the command line (which every process of the sandbox can read).
func (s *Shell) Command(r RunSpec) (argv, env []string) {
	argv = []string{ShellAgentPath, "--base-url", r.BaseURL + "/v1", "--model", r.Model, "--task-file", r.TaskFile,
		"--workdir", r.Workdir}
	if s.MaxTurns > 0 {
		argv = append(argv, "--max-turns", strconv.Itoa(s.MaxTurns))
	}
	if r.Budget > 0 {
		argv = append(argv, "--timeout", r.Budget.String())
	}
	if s.CommandTimeout > 0 {
		argv = append(argv, "--command-timeout", s.CommandTimeout.String())
	}
	if r.LogFile != "" {
		argv = append(argv, "--log", r.LogFile)
	}
	argv = append(argv, s.Args...)
	env = append([]string{"KILN_AGENT_API_KEY=" + r.SessionID, "KILN_AGENT_SESSION=" + r.SessionID}, s.Env...)
	return argv, env
}
