package sandbox

import (
	"bufio"
	"context"
	"crypto/rand"
	"encoding/hex"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"net"
	"os"
	"os/exec"
	"path"
	"path/filepath"
	"strconv"
	"strings"
	"sync"
	"syscall"
	"time"

	"github.com/kilnrl/kiln/internal/sandbox/sandboxinit"
)

// HelperName is the helper binary the bwrap provider bind-mounts into every
// sandbox (built from cmd/kiln-sandbox-helper).
const HelperName = "kiln-sandbox-helper"

// Capabilities root keeps inside a bwrap sandbox: Docker's default set less
// MKNOD (no device nodes: the devices cgroup is not used) and NET_RAW. Without
// SYS_ADMIN root cannot mount, so the overlay and the namespaces hold; bwrap
// also sets no_new_privs, so no execve (setuid or file capabilities) regains
// anything.
func rootCaps() []string {
	var args []string
	for _, c := range []string{"CAP_CHOWN", "CAP_DAC_OVERRIDE", "CAP_FSETID", "CAP_FOWNER", "CAP_SETGID", "CAP_SETUID",
		"CAP_SETFCAP", "CAP_SETPCAP", "CAP_NET_BIND_SERVICE", "CAP_SYS_CHROOT", "CAP_KILL", "CAP_AUDIT_WRITE"} {
		args = append(args, "--cap-add", c)
	}
	return args
}

// bootTimeout bounds the wait for the in-sandbox init to come up.
const bootTimeout = 30 * time.Second

// execSlack is how long past a command's timeout the host waits for init's
// answer before it gives up on the sandbox.
const execSlack = 30 * time.Second

// bwrapSandbox is booted once: the overlay is mounted, the cgroups created,
// and one bwrap process started, running the helper's init as the sandbox's
// long-lived process (bwrap's own pid 1 reaps orphans). Each Exec is a
// request to that init over a unix socket; init forks the command straight
// into the sandbox's namespaces and cgroup as the requested user, so state
// persists between Execs (files, background processes, the agent user) and
// an Exec costs one fork+exec, not a namespace setup. Boot-to-first-exec is
// one overlay mount (volatile: no copy-up fsyncs), two cgroups created while
// it mounts, one bwrap start, one static-binary start, one cgroup attach and
// one fork: p50 18-50 ms on a loaded 2-core host (BenchmarkBoot,
// BENCHMARKS.md). A bwrap per Exec would
// give each command fresh pid and net namespaces, killing background
// processes (exec_and_wait) and the forwarder between calls.
//
// Commands that outlive their Exec normally (daemons, `cmd &`) keep running
// until Close; a timed-out command's whole session is killed.
type bwrapSandbox struct {
	id       string
	opts     Options
	state    string
	ctlSock  string
	stateDir *os.File // held open for short socket paths, see sockPath
	ov       *overlay
	cg       *cgroup
	cmd      *exec.Cmd
	exited   chan struct{}
	stderr   *syncBuffer
	endpoint net.Listener
	rec      *recorder

	closeOnce sync.Once
	closeErr  error
	mu        sync.Mutex
	closed    bool
}

func newID() string {
	b := make([]byte, 6)
	_, _ = rand.Read(b)
	return hex.EncodeToString(b)
}

func findHelper(configured string) (string, error) {
	if configured != "" {
		return configured, nil
	}
	if exe, err := os.Executable(); err == nil {
		p := filepath.Join(filepath.Dir(exe), HelperName)
		if fileExists(p) {
			return p, nil
		}
	}
	if p, err := exec.LookPath(HelperName); err == nil {
		return p, nil
	}
	return "", fmt.Errorf("%s not found beside the executable or on PATH; build it (go build -o bin/ ./cmd/%s, or make build) or set Options.HelperPath", HelperName, HelperName)
}

func findBwrap(configured string) (string, error) {
	for _, p := range []string{configured, "/usr/bin/bwrap"} {
		if p != "" && fileExists(p) {
			return p, nil
		}
	}
	if p, err := exec.LookPath("bwrap"); err == nil {
		return p, nil
	}
	return "", errors.New("bwrap not found; install bubblewrap (apt-get install bubblewrap, or scripts/install-test-deps.sh)")
}

func bootBwrap(ctx context.Context, o Options) (_ Sandbox, err error) {
	helper, bwrap, rootfs, lowers, err := bwrapInputs(o)
	if err != nil {
		return nil, err
	}
	s := &bwrapSandbox{id: newID(), opts: o, exited: make(chan struct{}), stderr: &syncBuffer{limit: 64 << 10}}
	defer func() {
		if err != nil {
			s.teardown()
		}
	}()
	if s.state, s.stateDir, err = makeState(o.StateDir, s.id); err != nil {
		return nil, err
	}
	merged := filepath.Join(s.state, "merged")
	if err := s.mount(lowers, merged); err != nil {
		return nil, err
	}
	switch {
	case o.Endpoint != "":
		if s.endpoint, err = listenEndpoint(s.sockPath("endpoint.sock"), o.Endpoint); err != nil {
			return nil, err
		}
	case o.ServeEndpoint != nil:
		if s.endpoint, err = listenEndpointSocket(s.sockPath("endpoint.sock")); err != nil {
			return nil, err
		}
		go o.ServeEndpoint(s.endpoint)
	}
	if err := checkMounts(o.Mounts); err != nil {
		return nil, err
	}
	files, err := s.command(bwrap, helper, merged)
	defer func() {
		for _, f := range files {
			f.Close()
		}
	}()
	if err != nil {
		return nil, err
	}
	if err := s.start(ctx, rootfs); err != nil {
		return nil, err
	}
	if o.Artifacts != nil {
		host, _ := os.Hostname()
		rec, _ := json.MarshalIndent(SandboxRecord{ID: s.id, Provider: "bwrap", Rootfs: rootfs, Host: host,
			PID: s.cmd.Process.Pid, StateDir: s.state, Created: time.Now().UTC()}, "", "  ")
		if err := putArtifact(o.Artifacts, "sandbox.json", append(rec, '\n')); err != nil {
			return nil, fmt.Errorf("sandbox %s: %w", s.id, err)
		}
	}
	return s, nil
}

// bwrapInputs checks what a bwrap sandbox needs of the host and of o: root,
// the helper and bwrap binaries, and the image's root filesystem (absolute)
// with its overlay lower layers.
func bwrapInputs(o Options) (helper, bwrap, rootfs string, lowers []string, err error) {
	if os.Geteuid() != 0 {
		// bwrap without root would need a user namespace, which maps only the
		// caller's uid: no agent user, no cgroup limits.
		return "", "", "", nil, errors.New("the bwrap sandbox provider needs root (kernel overlayfs, a real unprivileged agent uid, cgroup limits); run as root or use the local provider for debugging")
	}
	if helper, err = findHelper(o.HelperPath); err != nil {
		return "", "", "", nil, err
	}
	if bwrap, err = findBwrap(o.Bwrap); err != nil {
		return "", "", "", nil, err
	}
	if fi, err := os.Stat(o.Rootfs); err != nil {
		return "", "", "", nil, fmt.Errorf("sandbox rootfs: %w", err)
	} else if !fi.IsDir() {
		return "", "", "", nil, fmt.Errorf("sandbox rootfs %q is not a directory", o.Rootfs)
	}
	if rootfs, err = filepath.Abs(o.Rootfs); err != nil {
		return "", "", "", nil, err
	}
	lowers, err = LayeredLowers(rootfs)
	return helper, bwrap, rootfs, lowers, err
}

// mount makes the sandbox's state (the overlay's directories, the command
// record, the leftovers file Sweep reads) and mounts the overlay of lowers
// at merged, creating the cgroup meanwhile when o asks for limits.
func (s *bwrapSandbox) mount(lowers []string, merged string) (err error) {
	o := s.opts
	upper, work := filepath.Join(s.state, "upper"), filepath.Join(s.state, "work")
	for _, d := range []string{upper, work, merged} {
		if err := os.Mkdir(d, 0o700); err != nil {
			return err
		}
	}
	// The overlay's root directory takes the upper dir's mode and owner:
	// give it the image's (normally 0755 root), or only root could enter /.
	if fi, err := os.Stat(lowers[0]); err == nil {
		if err := os.Chmod(upper, fi.Mode().Perm()); err != nil {
			return err
		}
		if st, ok := fi.Sys().(*syscall.Stat_t); ok {
			if err := os.Lchown(upper, int(st.Uid), int(st.Gid)); err != nil {
				return err
			}
		}
	}
	s.ctlSock = s.sockPath("ctl.sock")
	if s.rec, err = newRecorder(filepath.Join(s.state, "commands.jsonl")); err != nil {
		return err
	}
	// Record what Sweep must release before holding any of it: releasing
	// what was never made is a no-op.
	left := leftovers{Merged: merged}
	var plan cgroupPlan
	limited := o.MemoryBytes >= 0 || o.PidsMax >= 0
	if limited {
		if plan, err = planCgroup(s.id); err != nil {
			return fmt.Errorf("sandbox cgroup: %w", err)
		}
		left.Cgroups = plan.dirs
	}
	if err := writeLeftovers(s.state, left); err != nil {
		return err
	}
	// Creating a cgroup takes milliseconds per controller: do it while the
	// overlay is mounted.
	type cgResult struct {
		cg  *cgroup
		err error
	}
	cgDone := make(chan cgResult, 1)
	go func() {
		if !limited {
			cgDone <- cgResult{}
			return
		}
		cg, err := newCgroup(plan, limitOrMax(o.MemoryBytes), limitOrMax(o.PidsMax))
		cgDone <- cgResult{cg, err}
	}()
	s.ov, err = mountOverlay(lowers, upper, work, merged)
	cgr := <-cgDone
	if cgr.err == nil {
		s.cg = cgr.cg
	}
	if err != nil {
		return err
	}
	if cgr.err != nil {
		return fmt.Errorf("sandbox cgroup: %w", cgr.err)
	}
	if s.ov.fuse {
		left.Fuse = true
		return writeLeftovers(s.state, left)
	}
	return nil
}

// command prepares s.cmd: bwrap over merged with the sandbox's namespaces,
// mounts, capabilities and seccomp filter, running the helper's init. It
// returns the descriptors passed to init, for the caller to close once
// bwrap has started (or failed to).
func (s *bwrapSandbox) command(bwrap, helper, merged string) ([]*os.File, error) {
	o := s.opts
	args := []string{
		"--unshare-ipc", "--unshare-pid", "--unshare-net", "--unshare-uts",
		"--die-with-parent", "--new-session", "--hostname", "sandbox",
		"--bind", merged, "/",
		// /proc read-only: without a user namespace the sandbox's root is
		// the host's uid 0, and a writable /proc/sys would let it set
		// host-wide sysctls (kernel.core_pattern runs a program as host
		// root: an escape), as Docker's read-only /proc/sys prevents.
		"--proc", "/proc", "--remount-ro", "/proc", "--dev", "/dev",
		"--perms", "1777", "--tmpfs", "/tmp",
		"--perms", "1777", "--tmpfs", "/dev/shm",
		"--tmpfs", "/run", "--dir", "/run/kiln",
		"--ro-bind", helper, sandboxinit.HelperPath,
	}
	if s.endpoint != nil {
		args = append(args, "--ro-bind", filepath.Join(s.state, "endpoint.sock"), sandboxinit.EndpointSocket)
	}
	for _, m := range o.Mounts {
		// The directories bwrap makes for a mount point are root's alone
		// (0700) unless told otherwise: the agent must reach the binary.
		args = append(args, "--perms", "0755", "--dir", filepath.Dir(m.Target), "--ro-bind", m.Source, m.Target)
	}
	args = append(append(args, "--cap-drop", "ALL"), rootCaps()...)
	initArgs := []string{"--chdir", "/", sandboxinit.HelperPath, "init", "--agent", Agent}
	if s.endpoint != nil {
		initArgs = append(initArgs, "--listen", strconv.Itoa(o.EndpointPort))
	}
	// Init's descriptors: fd 3 its request socket (listening here, served
	// there), then the cgroup handles; bwrap passes inherited descriptors
	// on. The seccomp filter's descriptor comes last and bwrap consumes it.
	ctlFile, err := listenCtl(s.ctlSock)
	if err != nil {
		return nil, err
	}
	files := []*os.File{ctlFile}
	if s.cg != nil {
		cgFiles, err := s.cg.open()
		if err != nil {
			return files, fmt.Errorf("sandbox cgroup: %w", err)
		}
		files = append(files, cgFiles...)
		mode := "v1"
		if s.cg.v2 {
			mode = "v2"
		}
		initArgs = append(initArgs, "--cgroup", fmt.Sprintf("%s:%d", mode, len(cgFiles)))
	}
	if filter := seccompFilter(s.cg != nil && s.cg.v2); filter != nil {
		f, err := bytesFile(filter)
		if err != nil {
			return files, fmt.Errorf("sandbox seccomp filter: %w", err)
		}
		files = append(files, f)
		args = append(args, "--seccomp", strconv.Itoa(2+len(files)))
	}
	s.cmd = exec.Command(bwrap, append(args, initArgs...)...)
	s.cmd.ExtraFiles = files
	s.cmd.Env = []string{"PATH=/usr/sbin:/usr/bin:/sbin:/bin"}
	s.cmd.Stderr = s.stderr
	s.cmd.SysProcAttr = &syscall.SysProcAttr{Pdeathsig: syscall.SIGKILL}
	return files, nil
}

// start starts s.cmd and waits, up to bootTimeout, for init's ready line.
func (s *bwrapSandbox) start(ctx context.Context, rootfs string) error {
	stdout, err := s.cmd.StdoutPipe()
	if err != nil {
		return err
	}
	if err := s.cmd.Start(); err != nil {
		return fmt.Errorf("start bwrap: %w", err)
	}
	go func() { _ = s.cmd.Wait(); close(s.exited) }()
	ready := make(chan error, 1)
	go func() {
		line, err := bufio.NewReader(stdout).ReadString('\n')
		if err == nil && strings.TrimSpace(line) != sandboxinit.ReadyLine {
			err = fmt.Errorf("unexpected line %q", line)
		}
		ready <- err
		_, _ = io.Copy(io.Discard, stdout)
	}()
	timer := time.NewTimer(bootTimeout)
	defer timer.Stop()
	select {
	case err := <-ready:
		if err != nil {
			// Give bwrap a moment to exit, so its complaint is in stderr.
			select {
			case <-s.exited:
			case <-time.After(time.Second):
			}
			return fmt.Errorf("sandbox over %q did not start: %w: %s", rootfs, err, s.stderr.String())
		}
		return nil
	case <-timer.C:
		return fmt.Errorf("sandbox over %q did not start within %s: %s", rootfs, bootTimeout, s.stderr.String())
	case <-ctx.Done():
		return ctx.Err()
	}
}

// limitOrMax maps a negative (disabled) limit to "no limit" in one
// controller while the other one is in use.
func limitOrMax(v int64) int64 {
	if v < 0 {
		return 1 << 62
	}
	return v
}

// sockPath is a short name for the socket file name in the state directory:
// unix socket addresses hold at most 107 bytes, and the state directory may
// be deeper than that (a test's temp dir).
func (s *bwrapSandbox) sockPath(name string) string {
	return fmt.Sprintf("/proc/self/fd/%d/%s", s.stateDir.Fd(), name)
}

// listenCtl creates init's request socket at a host path that nothing in the
// sandbox can reach, and returns the listening socket to hand over.
func listenCtl(path string) (*os.File, error) {
	ln, err := net.ListenUnix("unix", &net.UnixAddr{Name: path, Net: "unix"})
	if err != nil {
		return nil, fmt.Errorf("sandbox control socket: %w", err)
	}
	ln.SetUnlinkOnClose(false)
	defer ln.Close()
	f, err := ln.File()
	if err != nil {
		return nil, fmt.Errorf("sandbox control socket: %w", err)
	}
	return f, nil
}

func (s *bwrapSandbox) ID() string { return s.id }

func (s *bwrapSandbox) Endpoint() string {
	if s.endpoint == nil {
		return ""
	}
	return "127.0.0.1:" + strconv.Itoa(s.opts.EndpointPort)
}

func (s *bwrapSandbox) Exec(ctx context.Context, cmd Cmd) (Result, error) {
	argv, err := cmdArgv(cmd)
	if err != nil {
		return Result{}, err
	}
	timeout := cmd.Timeout
	if timeout <= 0 {
		timeout = DefaultTimeout
	}
	started := time.Now()
	oom0, pids0 := s.cg.counters()
	resp, err := s.call(ctx, &sandboxinit.Request{
		Op: sandboxinit.OpExec, Argv: argv, User: cmd.User, Env: append(append([]string{}, s.opts.Env...), cmd.Env...),
		Dir: cmd.Dir, Stdin: cmd.Stdin, TimeoutMs: timeout.Milliseconds(), OutputLimit: s.opts.OutputLimit,
	}, timeout)
	if err != nil {
		return Result{}, err
	}
	oom1, pids1 := s.cg.counters()
	res := Result{
		ExitCode: resp.ExitCode, Stdout: resp.Stdout, Stderr: resp.Stderr,
		StdoutTruncated: resp.StdoutTruncated, StderrTruncated: resp.StderrTruncated,
		StdoutBytes: resp.StdoutBytes, StderrBytes: resp.StderrBytes,
		TimedOut: resp.TimedOut, OOMKilled: oom1 > oom0, PidsLimited: pids1 > pids0,
		Duration: time.Duration(resp.DurationNs), CPU: time.Duration(resp.CPUNs),
	}
	var execErr error
	if resp.Error != "" {
		execErr = fmt.Errorf("sandbox %s: %s", s.id, resp.Error)
	}
	s.rec.add(cmd, argv, started, res, execErr)
	if execErr != nil {
		return Result{}, execErr
	}
	return checked("bwrap", cmd, res)
}

func cmdArgv(cmd Cmd) ([]string, error) {
	switch {
	case cmd.Shell != "" && len(cmd.Argv) > 0:
		return nil, errors.New("sandbox command: set Argv or Shell, not both")
	case cmd.Shell != "":
		return []string{"bash", "-c", cmd.Shell}, nil
	case len(cmd.Argv) == 0:
		return nil, errors.New("sandbox command: empty (set Argv or Shell)")
	}
	return cmd.Argv, nil
}

// call sends one request to the in-sandbox init and waits for its answer.
func (s *bwrapSandbox) call(ctx context.Context, req *sandboxinit.Request, timeout time.Duration) (*sandboxinit.Response, error) {
	s.mu.Lock()
	closed := s.closed
	s.mu.Unlock()
	if closed {
		return nil, fmt.Errorf("sandbox %s is closed", s.id)
	}
	var d net.Dialer
	conn, err := d.DialContext(ctx, "unix", s.ctlSock)
	if err != nil {
		return nil, s.deadErr(err)
	}
	defer conn.Close()
	stop := context.AfterFunc(ctx, func() { conn.Close() })
	defer stop()
	_ = conn.SetDeadline(time.Now().Add(timeout + execSlack))
	line, err := json.Marshal(req)
	if err != nil {
		return nil, err
	}
	if _, err := conn.Write(append(line, '\n')); err != nil {
		return nil, s.callErr(ctx, err)
	}
	var resp sandboxinit.Response
	if err := json.NewDecoder(conn).Decode(&resp); err != nil {
		return nil, s.callErr(ctx, err)
	}
	return &resp, nil
}

func (s *bwrapSandbox) callErr(ctx context.Context, err error) error {
	if ctx.Err() != nil {
		return fmt.Errorf("sandbox %s: %w", s.id, ctx.Err())
	}
	return s.deadErr(err)
}

func (s *bwrapSandbox) deadErr(err error) error {
	select {
	case <-s.exited:
		// %v, not %w: once the sandbox is gone the control socket's error
		// (ENOENT, EOF) says nothing about what the caller asked for.
		return fmt.Errorf("sandbox %s has died (%v): %s", s.id, err, s.stderr.String())
	default:
		return fmt.Errorf("sandbox %s: %w", s.id, err)
	}
}

func (s *bwrapSandbox) WriteFile(ctx context.Context, p string, data []byte, perm uint32, user string) error {
	if !path.IsAbs(p) {
		return fmt.Errorf("sandbox %s: write %q: path must be absolute", s.id, p)
	}
	resp, err := s.call(ctx, &sandboxinit.Request{
		Op: sandboxinit.OpWriteFile, Argv: []string{p, strconv.FormatUint(uint64(perm&0o7777), 8)},
		User: user, Stdin: data, TimeoutMs: DefaultTimeout.Milliseconds(), OutputLimit: 4096,
	}, DefaultTimeout)
	if err != nil {
		return err
	}
	if resp.Error != "" || resp.ExitCode != 0 {
		return fmt.Errorf("sandbox %s: write %q as %q: %s%s", s.id, p, userName(user), resp.Error, strings.TrimSpace(string(resp.Stderr)))
	}
	return nil
}

// maxReadFile bounds ReadFile: the content travels in one JSON message.
const maxReadFile = 256 << 20

func (s *bwrapSandbox) ReadFile(ctx context.Context, p string) ([]byte, error) {
	if !path.IsAbs(p) {
		return nil, fmt.Errorf("sandbox %s: read %q: path must be absolute", s.id, p)
	}
	resp, err := s.call(ctx, &sandboxinit.Request{
		Op: sandboxinit.OpReadFile, Argv: []string{p}, User: Root,
		TimeoutMs: DefaultTimeout.Milliseconds(), OutputLimit: maxReadFile,
	}, DefaultTimeout)
	if err != nil {
		return nil, err
	}
	if resp.Error != "" || resp.ExitCode != 0 {
		return nil, fmt.Errorf("sandbox %s: read %q: %s%s", s.id, p, resp.Error, strings.TrimSpace(string(resp.Stderr)))
	}
	if resp.StdoutTruncated {
		return nil, fmt.Errorf("sandbox %s: read %q: larger than %d bytes", s.id, p, maxReadFile)
	}
	return resp.Stdout, nil
}

func (s *bwrapSandbox) Kill(ctx context.Context, user string) error {
	resp, err := s.call(ctx, &sandboxinit.Request{Op: sandboxinit.OpKill, User: user}, DefaultTimeout)
	if err != nil {
		return err
	}
	if resp.Error != "" {
		return fmt.Errorf("sandbox %s: %s", s.id, resp.Error)
	}
	return nil
}

func userName(u string) string {
	if u == "" {
		return Root
	}
	return u
}

func (s *bwrapSandbox) Close() error {
	s.closeOnce.Do(func() {
		var errs []error
		if s.opts.Artifacts != nil {
			if err := saveArtifacts(s, s.opts, s.rec); err != nil {
				errs = append(errs, err)
			}
		}
		s.mu.Lock()
		s.closed = true
		s.mu.Unlock()
		errs = append(errs, s.teardown())
		s.closeErr = errors.Join(errs...)
	})
	return s.closeErr
}

// teardown kills every sandbox process and removes all sandbox state; it is
// also the cleanup of a failed boot, so every step tolerates its part
// missing.
func (s *bwrapSandbox) teardown() error {
	var errs []error
	if s.cmd != nil && s.cmd.Process != nil {
		// bwrap's pid 1 in the sandbox dies with it (--die-with-parent), which
		// kills every process of the pid namespace.
		_ = s.cmd.Process.Kill()
		<-s.exited
	}
	if s.endpoint != nil {
		s.endpoint.Close()
	}
	if err := s.cg.remove(); err != nil {
		errs = append(errs, err)
	}
	if err := s.ov.unmount(); err != nil {
		errs = append(errs, err)
	}
	if s.rec != nil {
		s.rec.close()
	}
	if s.stateDir != nil {
		s.stateDir.Close()
	}
	if len(errs) > 0 {
		// The leftovers record stays, and the lock is gone: a later Sweep
		// tries again.
		return fmt.Errorf("sandbox %s: %w (left for Sweep, which kiln-grade and kiln-rollout run when they start)", s.id, errors.Join(errs...))
	}
	if s.state != "" {
		if err := os.RemoveAll(s.state); err != nil {
			return fmt.Errorf("remove sandbox state: %w", err)
		}
	}
	return nil
}

// saveArtifacts copies the command records and the configured in-sandbox
// files to the sink; unreadable files are skipped (they may legitimately not
// exist), and so are those left when o.ArtifactTimeout runs out; write
// failures are returned.
func saveArtifacts(sb Sandbox, o Options, rec *recorder) error {
	var errs []error
	if err := rec.save(o.Artifacts); err != nil {
		errs = append(errs, fmt.Errorf("sandbox %s: %w", sb.ID(), err))
	}
	ctx, cancel := context.WithTimeout(context.Background(), o.ArtifactTimeout)
	defer cancel()
	for i, f := range o.ArtifactFiles {
		data, err := sb.ReadFile(ctx, f)
		if err != nil && ctx.Err() != nil {
			o.Log.Warn("sandbox artifact files not saved: ArtifactTimeout ran out", "sandbox", sb.ID(),
				"timeout", o.ArtifactTimeout, "files", o.ArtifactFiles[i:])
			break
		}
		if err != nil {
			o.Log.Debug("sandbox artifact file not saved", "sandbox", sb.ID(), "file", f, "err", err)
			continue
		}
		if err := putArtifact(o.Artifacts, "files/"+path.Base(f), data); err != nil {
			errs = append(errs, fmt.Errorf("sandbox %s: %w", sb.ID(), err))
		}
	}
	return errors.Join(errs...)
}

// syncBuffer keeps the first limit bytes of bwrap's stderr for error
// messages.
type syncBuffer struct {
	mu    sync.Mutex
	b     []byte
	limit int
}

func (b *syncBuffer) Write(p []byte) (int, error) {
	b.mu.Lock()
	defer b.mu.Unlock()
	if room := b.limit - len(b.b); room > 0 {
		b.b = append(b.b, p[:min(room, len(p))]...)
	}
	return len(p), nil
}

func (b *syncBuffer) String() string {
	b.mu.Lock()
	defer b.mu.Unlock()
	return strings.TrimSpace(string(b.b))
}
