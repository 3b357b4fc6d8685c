package sandbox

import (
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"sync"
	"syscall"
	"time"

	"github.com/kilnrl/kiln/internal/sandbox/sandboxinit"
)

// localSandbox runs commands directly on the host, in Options.Rootfs, as the
// calling user: no isolation, no limits, Cmd.User is ignored, and paths are
// host paths. For debugging only; Boot logs a warning saying so.
type localSandbox struct {
	id    string
	opts  Options
	dir   string
	state string
	rec   *recorder

	mu   sync.Mutex
	sids []int // the sessions of the commands started, for Kill

	closeOnce sync.Once
	closeErr  error
}

func bootLocal(_ context.Context, o Options) (_ Sandbox, err error) {
	if len(o.Mounts) > 0 {
		return nil, errors.New("the local sandbox provider cannot bind mounts (Options.Mounts); use bwrap")
	}
	if o.ServeEndpoint != nil {
		return nil, errors.New("the local sandbox provider has no endpoint socket to serve (Options.ServeEndpoint); use Endpoint, or bwrap")
	}
	dir, err := filepath.Abs(o.Rootfs)
	if err != nil {
		return nil, err
	}
	if fi, err := os.Stat(dir); err != nil {
		return nil, fmt.Errorf("local sandbox directory: %w", err)
	} else if !fi.IsDir() {
		return nil, fmt.Errorf("local sandbox directory %q is not a directory", o.Rootfs)
	}
	if lowers, err := LayeredLowers(dir); err == nil && (len(lowers) != 1 || lowers[0] != dir) {
		return nil, fmt.Errorf("local sandbox directory %q is the placeholder of a layered bundle, which only the bwrap provider mounts; use bwrap, or import the image with kiln-images import --layout rootfs", o.Rootfs)
	}
	s := &localSandbox{id: newID(), opts: o, dir: dir}
	if s.state, err = os.MkdirTemp(o.StateDir, "kiln-local-sandbox-"); err != nil {
		return nil, err
	}
	if s.rec, err = newRecorder(filepath.Join(s.state, "commands.jsonl")); err != nil {
		os.RemoveAll(s.state)
		return nil, err
	}
	o.Log.Warn("local sandbox: commands run on the host as the current user with no isolation and no limits; use only for debugging",
		"sandbox", s.id, "dir", dir)
	if o.Artifacts != nil {
		host, _ := os.Hostname()
		rec, _ := json.MarshalIndent(SandboxRecord{ID: s.id, Provider: "local", Rootfs: dir, Host: host, Created: time.Now().UTC()}, "", "  ")
		if err := putArtifact(o.Artifacts, "sandbox.json", append(rec, '\n')); err != nil {
			s.rec.close()
			os.RemoveAll(s.state)
			return nil, fmt.Errorf("sandbox %s: %w", s.id, err)
		}
	}
	return s, nil
}

func (s *localSandbox) ID() string       { return s.id }
func (s *localSandbox) Endpoint() string { return s.opts.Endpoint }

func (s *localSandbox) Exec(ctx context.Context, cmd Cmd) (Result, error) {
	argv, err := cmdArgv(cmd)
	if err != nil {
		return Result{}, err
	}
	timeout := cmd.Timeout
	if timeout <= 0 {
		timeout = DefaultTimeout
	}
	c := exec.Command(argv[0], argv[1:]...)
	c.Dir = cmd.Dir
	if c.Dir == "" {
		c.Dir = s.dir
	}
	c.Env = append(append(os.Environ(), s.opts.Env...), cmd.Env...)
	c.Stdin = bytes.NewReader(cmd.Stdin)
	stdout, stderr := sandboxinit.NewCappedBuffer(s.opts.OutputLimit), sandboxinit.NewCappedBuffer(s.opts.OutputLimit)
	c.Stdout, c.Stderr = stdout, stderr
	c.SysProcAttr = &syscall.SysProcAttr{Setsid: true}
	c.WaitDelay = 500 * time.Millisecond
	started := time.Now()
	if err := c.Start(); err != nil {
		err = fmt.Errorf("sandbox %s: start %q: %w", s.id, argv[0], err)
		s.rec.add(cmd, argv, started, Result{ExitCode: 127}, err)
		return Result{}, err
	}
	s.mu.Lock()
	s.sids = append(s.sids, c.Process.Pid)
	s.mu.Unlock()
	done := make(chan struct{})
	go func() { _ = c.Wait(); close(done) }()
	timer := time.NewTimer(timeout)
	defer timer.Stop()
	timedOut := false
	select {
	case <-done:
	case <-timer.C:
		timedOut = true
		_ = syscall.Kill(-c.Process.Pid, syscall.SIGKILL)
		<-done
	case <-ctx.Done():
		_ = syscall.Kill(-c.Process.Pid, syscall.SIGKILL)
		<-done
		return Result{}, fmt.Errorf("sandbox %s: %w", s.id, ctx.Err())
	}
	res := Result{
		ExitCode: exitStatus(c.ProcessState), Stdout: stdout.Bytes(), Stderr: stderr.Bytes(),
		StdoutTruncated: stdout.Truncated(), StderrTruncated: stderr.Truncated(),
		StdoutBytes: stdout.Total(), StderrBytes: stderr.Total(), Duration: time.Since(started),
	}
	if ps := c.ProcessState; ps != nil {
		res.CPU = ps.UserTime() + ps.SystemTime()
	}
	if timedOut {
		res.ExitCode, res.TimedOut = TimeoutExitCode, true
	}
	s.rec.add(cmd, argv, started, res, nil)
	return checked("local", cmd, res)
}

func exitStatus(ps *os.ProcessState) int {
	if ws, ok := ps.Sys().(syscall.WaitStatus); ok && ws.Signaled() {
		return 128 + int(ws.Signal())
	}
	return ps.ExitCode()
}

func (s *localSandbox) WriteFile(_ context.Context, p string, data []byte, perm uint32, _ string) error {
	if err := os.MkdirAll(filepath.Dir(p), 0o755); err != nil {
		return fmt.Errorf("sandbox %s: write %q: %w", s.id, p, err)
	}
	if err := os.WriteFile(p, data, os.FileMode(perm)); err != nil {
		return fmt.Errorf("sandbox %s: write %q: %w", s.id, p, err)
	}
	if err := os.Chmod(p, os.FileMode(perm)); err != nil {
		return fmt.Errorf("sandbox %s: write %q: %w", s.id, p, err)
	}
	return nil
}

func (s *localSandbox) ReadFile(_ context.Context, p string) ([]byte, error) {
	b, err := os.ReadFile(p)
	if err != nil {
		return nil, fmt.Errorf("sandbox %s: read %q: %w", s.id, p, err)
	}
	return b, nil
}

// Kill kills the process groups of the commands' sessions (each command
// leads one, Setsid), whatever user is asked: there is one user here.
func (s *localSandbox) Kill(context.Context, string) error {
	s.mu.Lock()
	defer s.mu.Unlock()
	for _, sid := range s.sids {
		_ = syscall.Kill(-sid, syscall.SIGKILL)
	}
	return nil
}

func (s *localSandbox) Close() error {
	s.closeOnce.Do(func() {
		var errs []error
		if s.opts.Artifacts != nil {
			errs = append(errs, saveArtifacts(s, s.opts, s.rec))
		}
		s.rec.close()
		errs = append(errs, os.RemoveAll(s.state))
		s.closeErr = errors.Join(errs...)
	})
	return s.closeErr
}
