// Package sandbox runs commands in isolated copies of a task image's root
// filesystem, for agents (rollout) and graders (kiln-grade).
//
// A Sandbox is booted once from Options by Boot and then serves any number of
// Exec, WriteFile and ReadFile calls, concurrently, until Close. Filesystem
// state (installed packages, edited files, background processes) persists
// between calls; nothing reaches the image or the host.
//
// Providers:
//   - "bwrap" (the default; needs root): bubblewrap over a copy-on-write
//     overlay of the whole rootfs (kernel overlayfs, fuse-overlayfs where the
//     kernel refuses), new pid/ipc/uts/net namespaces, tmpfs /tmp and /run,
//     minimal /dev and read-only /proc, a reduced capability set for root,
//     no_new_privs and a seccomp filter in the manner of Docker's default
//     (seccomp.go), hard memory and pids limits through a per-sandbox cgroup
//     (v1, or a delegated v2), and exactly one way out of the network
//     namespace: the Options.Endpoint host address, reachable inside at
//     Endpoint(). It needs the kiln-sandbox-helper binary (cmd/) beside the
//     executable or on PATH. See bwrap.go for how a boot stays fast.
//   - "local": a host directory, no isolation at all, for debugging.
//
// ExecAndWait runs detached long commands (agents, installs) with polling.
package sandbox

import (
	"context"
	"fmt"
	"time"
)

// Users every sandbox has. Other names from the image's /etc/passwd work too.
const (
	// Root is the privileged user: setup and graders.
	Root = "root"
	// Agent is the unprivileged user that does all agent work. The bwrap
	// provider creates it at boot (uid >= 1000, home /home/agent) unless the
	// image has it; workspace.EnsureAgentUser gives it the workspace.
	Agent = "agent"
)

// Defaults for zero Options and Cmd fields.
const (
	DefaultTimeout      = 120 * time.Second
	DefaultOutputLimit  = 1 << 20 // bytes kept per stream and command
	DefaultMemoryBytes  = 2048 << 20
	DefaultPidsMax      = 1024
	DefaultEndpointPort = 18080
	// DefaultArtifactTimeout bounds Close's reading of ArtifactFiles.
	DefaultArtifactTimeout = 60 * time.Second
	// TimeoutExitCode is the exit code of a command that ran out of time.
	TimeoutExitCode = 124
)

// Sandbox is one booted sandbox. All methods are safe for concurrent use.
type Sandbox interface {
	// ID is unique among sandboxes of this host.
	ID() string
	// Exec runs one command and waits for it. A non-zero exit is a Result,
	// not an error; so is a timeout (ExitCode 124, TimedOut), and the whole
	// process tree of the command is killed by then: Exec returns within
	// Timeout plus a small slack. The error is non-nil only when the command
	// could not be run (unknown user, missing Dir, dead sandbox, cancelled
	// ctx) or when Cmd.Check is set and the exit code is non-zero (then it
	// is an *ExitError and the Result is returned as well). Every call that
	// reached the sandbox is recorded in the artifacts. Processes the command
	// leaves behind keep running (until Close); if they hold its stdout or
	// stderr open, the output is cut off 0.5 s after the command exits.
	Exec(ctx context.Context, cmd Cmd) (Result, error)
	// WriteFile writes data to path as user (root if ""), creating missing
	// parent directories as that user; the file ends up owned by user with
	// mode perm.
	WriteFile(ctx context.Context, path string, data []byte, perm uint32, user string) error
	// ReadFile returns the content of the regular file path, read as root.
	ReadFile(ctx context.Context, path string) ([]byte, error)
	// Kill sends SIGKILL to every process user (not root) runs in the
	// sandbox, those that commands left running in the background and
	// their descendants included, until none is left; it starts no process,
	// so it works in a sandbox at its pids limit. The local provider, which
	// has no users, kills the process groups its commands led.
	Kill(ctx context.Context, user string) error
	// Endpoint is the in-sandbox address (host:port) of the forwarded
	// Options.Endpoint, e.g. "127.0.0.1:18080", or "" when there is none.
	Endpoint() string
	// Close saves the artifacts (if Options.Artifacts is set; reading
	// ArtifactFiles out of the sandbox takes at most Options.ArtifactTimeout),
	// then kills every process of the sandbox and removes all of its state.
	// It always does the killing, even when saving fails; the error reports
	// the failure. Calling Close again returns the first call's error.
	Close() error
}

// Cmd is one command. Exactly one of Argv and Shell is set.
type Cmd struct {
	// Argv is run directly (argv[0] looked up in PATH).
	Argv []string
	// Shell is run by bash -c.
	Shell string
	// User runs the command (root if "").
	User string
	// Timeout kills the command after that long (DefaultTimeout if 0).
	Timeout time.Duration
	// Env overlays the sandbox environment (KEY=VALUE entries).
	Env []string
	// Dir is the working directory ("/" of the sandbox if "", the root
	// directory for the local provider).
	Dir string
	// Stdin is the command's standard input (empty if nil).
	Stdin []byte
	// Check turns a non-zero exit into an *ExitError.
	Check bool
}

// String is the command as recorded: the shell text or the joined argv.
func (c Cmd) String() string {
	if c.Shell != "" {
		return c.Shell
	}
	return fmt.Sprint(c.Argv)
}

// Result is what a command did. Output beyond the provider's output limit is
// dropped and marked truncated; the byte counts are the full sizes.
type Result struct {
	ExitCode        int
	Stdout, Stderr  []byte
	StdoutTruncated bool
	StderrTruncated bool
	StdoutBytes     int64
	StderrBytes     int64
	// TimedOut: the command ran out of time (ExitCode 124).
	TimedOut bool
	// OOMKilled: the sandbox's memory limit killed a process while the
	// command ran (bwrap provider with a cgroup).
	OOMKilled bool
	// PidsLimited: a fork failed on the sandbox's pids limit while the
	// command ran.
	PidsLimited bool
	Duration    time.Duration
	// CPU is the user + system CPU time of the command and of the
	// processes it waited for (not of those it left running).
	CPU time.Duration
}

// ExitError is Exec's error for a checked command with a non-zero exit.
type ExitError struct {
	Provider string
	Cmd      string
	Result   Result
}

func (e *ExitError) Error() string {
	return fmt.Sprintf("%s exec failed (exit=%d): %s\n%s", e.Provider, e.Result.ExitCode,
		truncate(e.Cmd, 120), truncate(string(e.Result.Stderr), 400))
}

func truncate(s string, n int) string {
	if len(s) > n {
		return s[:n]
	}
	return s
}

// checked applies cmd.Check to a finished command.
func checked(provider string, cmd Cmd, res Result) (Result, error) {
	if cmd.Check && res.ExitCode != 0 {
		return res, &ExitError{Provider: provider, Cmd: cmd.String(), Result: res}
	}
	return res, nil
}
