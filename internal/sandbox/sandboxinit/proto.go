// Package sandboxinit is the code that runs inside a bwrap sandbox: the
// long-lived init that serves command requests from the host over a unix
// socket and starts every command inside the sandbox's cgroup, the forwarder
// that gives the sandbox's loopback its one way out, and the file writer
// that runs as the requested user.
//
// It is built into the static binary cmd/kiln-sandbox-helper, which the bwrap
// provider bind-mounts read-only at HelperPath. The package must not import
// "net" or "os/user": with cgo enabled either one links the binary against
// the host's libc, and the helper has to run in any image's rootfs. Sockets
// are therefore raw syscalls here.
package sandboxinit

// Fixed paths inside the sandbox; /run is a fresh tmpfs in every sandbox.
// The host shares no writable path with the sandbox: init's request socket
// is a listening socket the host creates and hands over as fd 3, and the
// endpoint socket is bind-mounted read-only (connecting needs no write
// access to the mount).
const (
	// HelperPath is where the helper binary is bind-mounted (read-only, 0755).
	HelperPath = "/run/kiln/helper"
	// EndpointSocket is the host's end of the forwarded endpoint (root only).
	EndpointSocket = "/run/kiln/endpoint.sock"
	// CtlFD is init's inherited listening socket for host requests.
	CtlFD = 3
	// ReadyLine is what init prints on stdout once it serves requests.
	ReadyLine = "kiln-sandbox-ready"
)

// Operations (Request.Op). Exec and writefile start a process as User;
// readfile and kill are init's own work, so they start none and still work
// in a sandbox at its pids limit.
const (
	OpExec      = "exec"      // run Argv
	OpWriteFile = "writefile" // write Stdin to Argv[0] with mode Argv[1] (octal)
	OpReadFile  = "readfile"  // the regular file Argv[0] as stdout (as root only)
	OpKill      = "kill"      // SIGKILL every process of User (not root) until none is left
)

// Request is one command request, one JSON object per connection.
type Request struct {
	Op   string   `json:"op"`
	Argv []string `json:"argv"`
	// User is a user name from the sandbox's /etc/passwd.
	User string `json:"user"`
	// Env entries (KEY=VALUE) overlay the base environment.
	Env   []string `json:"env,omitempty"`
	Dir   string   `json:"dir,omitempty"`
	Stdin []byte   `json:"stdin,omitempty"`
	// TimeoutMs > 0 kills the command's process group and session after that
	// long; the response then has ExitCode 124 and TimedOut.
	TimeoutMs int64 `json:"timeout_ms"`
	// OutputLimit caps each of stdout and stderr (bytes kept).
	OutputLimit int `json:"output_limit"`
}

// Response answers a Request. Error is set when the command could not be
// started at all (unknown user, missing directory, cgroup join failure).
type Response struct {
	ExitCode        int    `json:"exit_code"`
	Stdout          []byte `json:"stdout"`
	Stderr          []byte `json:"stderr"`
	StdoutBytes     int64  `json:"stdout_bytes"`
	StderrBytes     int64  `json:"stderr_bytes"`
	StdoutTruncated bool   `json:"stdout_truncated"`
	StderrTruncated bool   `json:"stderr_truncated"`
	TimedOut        bool   `json:"timed_out"`
	DurationNs      int64  `json:"duration_ns"`
	// CPUNs is the user + system CPU time of the command and of the
	// descendants it waited for (wait4's rusage).
	CPUNs int64  `json:"cpu_ns,omitempty"`
	Error string `json:"error,omitempty"`
}
