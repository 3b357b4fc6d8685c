package grade

import (
	"bytes"
	"context"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"sync"
	"syscall"
	"testing"
	"time"

	"github.com/stretchr/testify/require"

	"github.com/kilnrl/kiln/internal/sandbox"
	"github.com/kilnrl/kiln/internal/testenv"
)

// hostSandbox is a sandbox.Sandbox that runs commands with bash on the
// host, for the grading-logic tests (docs/data-and-grading.md §6 "Grading" drives the
// reference's grader through a shell fake the same way). It records every
// command; user management (useradd, chown to agent) is recorded but not
// run, since the host has no agent user. Tests point the workdir and the
// grader's scratch directories at temporary host directories.
type hostSandbox struct {
	mu    sync.Mutex
	execs []sandbox.Cmd
	// fail, if set, is returned by Exec for commands containing it.
	fail   string
	closed bool
}

func (h *hostSandbox) ID() string       { return "host" }
func (h *hostSandbox) Endpoint() string { return "" }
func (h *hostSandbox) Close() error {
	h.mu.Lock()
	defer h.mu.Unlock()
	h.closed = true
	return nil
}

func (h *hostSandbox) isClosed() bool {
	h.mu.Lock()
	defer h.mu.Unlock()
	return h.closed
}

func (h *hostSandbox) commands() []sandbox.Cmd {
	h.mu.Lock()
	defer h.mu.Unlock()
	return append([]sandbox.Cmd(nil), h.execs...)
}

func (h *hostSandbox) Exec(ctx context.Context, cmd sandbox.Cmd) (sandbox.Result, error) {
	h.mu.Lock()
	h.execs = append(h.execs, cmd)
	h.mu.Unlock()
	if h.fail != "" && strings.Contains(cmd.Shell, h.fail) {
		return sandbox.Result{}, os.ErrClosed
	}
	if strings.Contains(cmd.Shell, "useradd") || strings.Contains(cmd.Shell, "chown -R agent") {
		return sandbox.Result{}, nil
	}
	timeout := cmd.Timeout
	if timeout <= 0 {
		timeout = sandbox.DefaultTimeout
	}
	c := exec.Command("bash", "-c", cmd.Shell)
	c.SysProcAttr = &syscall.SysProcAttr{Setpgid: true}
	var stdout, stderr bytes.Buffer
	c.Stdout, c.Stderr = &stdout, &stderr
	start := time.Now()
	if err := c.Start(); err != nil {
		return sandbox.Result{}, err
	}
	done := make(chan error, 1)
	go func() { done <- c.Wait() }()
	res := sandbox.Result{}
	select {
	case <-done:
	case <-time.After(timeout):
		syscall.Kill(-c.Process.Pid, syscall.SIGKILL)
		<-done
		res.TimedOut = true
	case <-ctx.Done():
		syscall.Kill(-c.Process.Pid, syscall.SIGKILL)
		<-done
		return res, ctx.Err()
	}
	res.ExitCode = c.ProcessState.ExitCode()
	if res.TimedOut {
		res.ExitCode = sandbox.TimeoutExitCode
	}
	res.Stdout, res.Stderr, res.Duration = stdout.Bytes(), stderr.Bytes(), time.Since(start)
	return res, nil
}

func (h *hostSandbox) WriteFile(_ context.Context, path string, data []byte, perm uint32, _ string) error {
	if err := os.MkdirAll(filepath.Dir(path), 0o755); err != nil {
		return err
	}
	return os.WriteFile(path, data, os.FileMode(perm))
}

func (h *hostSandbox) ReadFile(_ context.Context, path string) ([]byte, error) {
	return os.ReadFile(path)
}

// Kill kills nothing: grading never calls it.
func (h *hostSandbox) Kill(context.Context, string) error { return nil }

// hostGrader returns a grader whose sandboxes are hostSandboxes, with its
// scratch directories under a test directory, and a pointer to the boot
// count and the last sandbox booted.
type hostBoots struct {
	n    int
	last *hostSandbox
	fail string
	// reset are host repositories restored to their commit at each boot:
	// a real sandbox starts from the image every time.
	reset []string
}

func hostGrader(t *testing.T, timeout time.Duration) (*Grader, *hostBoots) {
	t.Helper()
	needTools(t, "bash", "git", "patch", "tar", "python3")
	scratch := t.TempDir()
	boots := &hostBoots{}
	g := &Grader{
		Boot: func(context.Context, sandbox.Options) (sandbox.Sandbox, error) {
			for _, dir := range boots.reset {
				for _, args := range [][]string{{"checkout", "-q", "--", "."}, {"clean", "-qfdx"}} {
					if out, err := exec.Command("git", append([]string{"-C", dir}, args...)...).CombinedOutput(); err != nil {
						t.Errorf("reset %s: %v: %s", dir, err, out)
					}
				}
			}
			boots.n++
			boots.last = &hostSandbox{fail: boots.fail}
			return boots.last, nil
		},
		Timeout: timeout, Scratch: scratch, SWEProDir: filepath.Join(scratch, "workspace", "swepro_eval"),
	}
	return g, boots
}

// needTools fails the test under CI=true when a host tool is missing, and
// skips it with an install hint otherwise.
func needTools(t *testing.T, tools ...string) {
	t.Helper()
	for _, tool := range tools {
		if _, err := exec.LookPath(tool); err != nil {
			testenv.SkipOrFail(t, "%s is not installed; run scripts/install-test-deps.sh", tool)
		}
	}
}

// gitRepo creates a repository at a new directory with files committed.
func gitRepo(t *testing.T, files map[string]string) string {
	t.Helper()
	needTools(t, "git")
	dir := filepath.Join(t.TempDir(), "repo dir") // a space, to exercise quoting
	require.NoError(t, os.MkdirAll(dir, 0o755))
	for name, body := range files {
		p := filepath.Join(dir, name)
		require.NoError(t, os.MkdirAll(filepath.Dir(p), 0o755))
		require.NoError(t, os.WriteFile(p, []byte(body), 0o644))
	}
	git(t, dir, "init", "-q", "-b", "main")
	git(t, dir, "add", "-A")
	git(t, dir, "-c", "user.name=t", "-c", "user.email=t@t", "commit", "-q", "-m", "base")
	return dir
}

func git(t *testing.T, dir string, args ...string) string {
	t.Helper()
	out, err := exec.Command("git", append([]string{"-C", dir}, args...)...).CombinedOutput()
	require.NoError(t, err, "git %v: %s", args, out)
	return string(out)
}

// diffOf returns the diff an edit makes to a copy of repo (the agent's
// patch), leaving repo untouched.
func diffOf(t *testing.T, repo string, edit map[string]string) string {
	t.Helper()
	cp := filepath.Join(t.TempDir(), "agent")
	out, err := exec.Command("cp", "-a", repo, cp).CombinedOutput()
	require.NoError(t, err, string(out))
	for name, body := range edit {
		p := filepath.Join(cp, name)
		require.NoError(t, os.MkdirAll(filepath.Dir(p), 0o755))
		require.NoError(t, os.WriteFile(p, []byte(body), 0o644))
	}
	git(t, cp, "add", "-A")
	return git(t, cp, "diff", "--cached", "--binary")
}
