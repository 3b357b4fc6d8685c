// Package harness knows how to run each coding agent inside a task sandbox
// (docs/rollout.md §3): what to bind into the sandbox, which configuration
// files to write, and the command line and environment that point the
// agent at the adapter with its session token. Running, timing and patch
// capture belong to the rollout stage; a harness only describes the
// agent, so adding one is one new file with a type that implements
// Harness and an entry in New.
package harness

import (
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"time"

	"github.com/kilnrl/kiln/internal/agent/shellagent"
	"github.com/kilnrl/kiln/internal/sandbox"
)

// Harness names.
const (
	ShellName      = "shell"
	ClaudeCodeName = "claude-code"
	CodexName      = "codex"
)

// RunSpec is what a harness knows of one agent run.
type RunSpec struct {
	// SessionID is the adapter session's token: the agent's API key, and
	// the only thing that ties its requests to this run.
	SessionID string
	// BaseURL is the adapter's root as the sandbox reaches it
	// ("http://127.0.0.1:18080", no path).
	BaseURL string
	// Model is the model name the agent sends (the adapter ignores it).
	Model string
	// Workdir is the repository the agent works in; TaskFile holds the
	// problem statement (both in-sandbox paths).
	Workdir, TaskFile string
	// Budget is the agent's time budget; the stage kills it at Budget
	// plus a short grace.
	Budget time.Duration
	// LogFile is the in-sandbox path where the agent writes its own
	// transcript (saved with the run's artifacts); under
	// Workdir/.harness, which patch capture excludes. Its directory may
	// not exist yet: the command a harness gives makes it.
	LogFile string
}

// File is a configuration file a harness needs in the sandbox before the
// agent starts.
type File struct {
	Path string
	Data []byte
	Perm uint32
	User string
}

// Harness describes one coding agent.
type Harness interface {
	// Name is the harness's name as rollouts rows record it.
	Name() string
	// Mounts are the host paths bound read-only into every sandbox of
	// this harness (the agent's binaries).
	Mounts() []sandbox.Mount
	// Files are the configuration files to write before the run.
	Files(RunSpec) []File
	// Command is the agent's argv and its environment (KEY=VALUE, over the
	// image's), run as the agent user in Workdir.
	Command(RunSpec) (argv, env []string)
}

// Options configure the harnesses New builds.
type Options struct {
	// ShellAgent is the host path of the kiln-agent binary ("" to look
	// beside the running executable, then on PATH).
	ShellAgent string
	// MaxTurns bounds the model calls of agents that take a limit (0: the
	// agent's default).
	MaxTurns int
	// CommandTimeout bounds each tool command of the shell agent (0: its
	// default).
	CommandTimeout time.Duration
	// ClaudeCode and Codex locate the pinned CLIs on the host ("": the
	// env variable ClaudeCodeEnv / CodexEnv, else the cache install of
	// scripts/install-test-deps.sh). See findClaudeCode and findCodex for
	// the layouts accepted.
	ClaudeCode, Codex string
	// MaxOutputTokens and MaxContextTokens are passed to the CLIs as their
	// own limits when set (the adapter clamps anyway).
	MaxOutputTokens, MaxContextTokens int
	// Extra are the --agent-args and --agent-env.
	Extra Extra
}

// Normalize maps the spellings tasks use for a harness (claude_code,
// Claude-Code) to its name.
func Normalize(name string) string {
	return strings.ReplaceAll(strings.ToLower(strings.TrimSpace(name)), "_", "-")
}

// New returns the harness called name (see Normalize).
func New(name string, o Options) (Harness, error) {
	args, env := o.Extra.For(Normalize(name))
	switch Normalize(name) {
	case ShellName:
		bin, err := FindShellAgent(o.ShellAgent)
		if err != nil {
			return nil, err
		}
		// The binary runs in images that may have no libc.
		if err := shellagent.CheckStatic(bin); err != nil {
			return nil, err
		}
		return &Shell{Binary: bin, MaxTurns: o.MaxTurns, CommandTimeout: o.CommandTimeout, Args: args, Env: env}, nil
	case ClaudeCodeName:
		bin, err := findClaudeCode(o.ClaudeCode)
		if err != nil {
			return nil, err
		}
		return &ClaudeCode{Binary: bin, MaxTurns: o.MaxTurns, MaxOutputTokens: o.MaxOutputTokens,
			MaxContextTokens: o.MaxContextTokens, Args: args, Env: env}, nil
	case CodexName:
		dir, bin, err := findCodex(o.Codex)
		if err != nil {
			return nil, err
		}
		return &Codex{Dir: dir, Binary: bin, MaxOutputTokens: o.MaxOutputTokens, MaxContextTokens: o.MaxContextTokens,
			Args: args, Env: env}, nil
	}
	return nil, fmt.Errorf("unknown harness %q: want %s, %s or %s", name, ShellName, ClaudeCodeName, CodexName)
}

// ShellAgentName is the shell agent's binary name.
const ShellAgentName = "kiln-agent"

// FindShellAgent returns configured if set, else kiln-agent beside the
// running executable, else on PATH (as the sandbox finds its helper).
func FindShellAgent(configured string) (string, error) {
	if configured != "" {
		if _, err := os.Stat(configured); err != nil {
			return "", fmt.Errorf("shell agent %q: %w", configured, err)
		}
		return filepath.Abs(configured)
	}
	if exe, err := os.Executable(); err == nil {
		p := filepath.Join(filepath.Dir(exe), ShellAgentName)
		if fi, err := os.Stat(p); err == nil && !fi.IsDir() {
			return p, nil
		}
	}
	if p, err := exec.LookPath(ShellAgentName); err == nil {
		return filepath.Abs(p)
	}
	return "", fmt.Errorf("%s not found beside the executable or on PATH; build it (go build -o bin/ ./cmd/%s, or make build) or pass --agent-binary", ShellAgentName, ShellAgentName)
}
