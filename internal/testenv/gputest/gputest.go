// Package gputest finds gpu/'s Python environment for Go tests that run the
// PyTorch side (docs/train.md §1): the venv scripts/install-gpu-deps.sh
// builds, the gpu/ directory of this repository, the tiny Qwen3 checkpoint
// (docs/train.md §5) and the policy server (docs/serve.md §1). What is
// missing skips the test, or fails it under CI=true (testenv.SkipOrFail).
package gputest

import (
	"bufio"
	"bytes"
	"context"
	"os"
	"os/exec"
	"path/filepath"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/kilnrl/kiln/internal/testenv"
)

// Env is gpu/'s environment: the venv's interpreter and the gpu/ directory
// (put on PYTHONPATH so `-m kiln_gpu.X` runs this checkout's code).
type Env struct{ Python, Dir string }

// Find returns the environment, skipping (failing under CI=true) when the
// venv is missing.
func Find(t testing.TB) Env {
	t.Helper()
	home, _ := os.UserHomeDir()
	b, err := os.ReadFile(filepath.Join(home, ".cache", "kiln", "gpu-venv-current"))
	if err != nil {
		testenv.SkipOrFail(t, "no gpu venv (~/.cache/kiln/gpu-venv-current): run scripts/install-gpu-deps.sh")
	}
	py := filepath.Join(strings.TrimSpace(string(b)), "bin", "python")
	if _, err := os.Stat(py); err != nil {
		testenv.SkipOrFail(t, "gpu venv python %q: %v: run scripts/install-gpu-deps.sh", py, err)
	}
	dir, err := gpuDir()
	if err != nil {
		t.Fatalf("finding gpu/: %v", err)
	}
	return Env{Python: py, Dir: dir}
}

// gpuDir is gpu/ beside the go.mod above the working directory (a test's
// working directory is its package's).
func gpuDir() (string, error) {
	d, err := os.Getwd()
	if err != nil {
		return "", err
	}
	for {
		if _, err := os.Stat(filepath.Join(d, "go.mod")); err == nil {
			return filepath.Join(d, "gpu"), nil
		}
		up := filepath.Dir(d)
		if up == d {
			return "", os.ErrNotExist
		}
		d = up
	}
}

// Command is python with args, gpu/ on PYTHONPATH.
func (e Env) Command(ctx context.Context, args ...string) *exec.Cmd {
	cmd := exec.CommandContext(ctx, e.Python, args...)
	cmd.Env = append(os.Environ(), "PYTHONPATH="+e.Dir)
	return cmd
}

// Tiny builds the tiny Qwen3 checkpoint with the real Qwen3 tokenizer into
// a temporary directory and returns it; a missing tokenizer skips (fails
// under CI=true). extra are more flags of kiln_gpu.tiny (e.g.
// --max-position-embeddings).
func (e Env) Tiny(t testing.TB, extra ...string) string {
	t.Helper()
	home, _ := os.UserHomeDir()
	if os.Getenv("KILN_QWEN3_TOKENIZER") == "" {
		if _, err := os.Stat(filepath.Join(home, ".cache", "kiln", "qwen3-tokenizer-current")); err != nil {
			testenv.SkipOrFail(t, "no Qwen3 tokenizer (~/.cache/kiln/qwen3-tokenizer-current): run scripts/install-gpu-deps.sh")
		}
	}
	dir := filepath.Join(t.TempDir(), "tiny")
	out, err := e.Command(context.Background(), append([]string{"-m", "kiln_gpu.tiny", "--out", dir}, extra...)...).CombinedOutput()
	if err != nil {
		t.Fatalf("python -m kiln_gpu.tiny: %v\n%s", err, out)
	}
	return dir
}

// Serve starts python -m kiln_gpu.serve on the checkpoint ckpt, named
// "tiny", with extra flags, and returns its base URL once it listens. The
// server stops at the test's cleanup; its log is printed when the test
// failed.
func (e Env) Serve(t testing.TB, ckpt string, extra ...string) string {
	t.Helper()
	dir := t.TempDir()
	portFile := filepath.Join(dir, "port")
	ctx, cancel := context.WithCancel(context.Background())
	args := append([]string{"-m", "kiln_gpu.serve", "--model", ckpt, "--port", "0", "--port-file", portFile, "--served-model-name", "tiny"}, extra...)
	srv := e.Command(ctx, args...)
	// serve.py's --api-key defaults to $KILN_ENGINE_API_KEY: a key in the
	// developer's environment must not guard the tests' servers; a test
	// that wants one passes --api-key.
	env := srv.Env[:0:0]
	for _, kv := range srv.Env {
		if !strings.HasPrefix(kv, "KILN_ENGINE_API_KEY=") {
			env = append(env, kv)
		}
	}
	srv.Env = env
	logf, err := os.Create(filepath.Join(dir, "serve.log"))
	if err != nil {
		t.Fatal(err)
	}
	srv.Stdout, srv.Stderr = logf, logf
	if err := srv.Start(); err != nil {
		t.Fatalf("starting kiln_gpu.serve: %v", err)
	}
	exited := make(chan struct{})
	go func() { _ = srv.Wait(); close(exited) }()
	t.Cleanup(func() {
		cancel()
		<-exited
		_ = logf.Close()
		if t.Failed() {
			b, _ := os.ReadFile(logf.Name())
			t.Logf("serve.log:\n%s", b)
		}
	})
	deadline := time.Now().Add(120 * time.Second)
	for time.Now().Before(deadline) {
		if b, err := os.ReadFile(portFile); err == nil {
			sc := bufio.NewScanner(bytes.NewReader(b))
			if sc.Scan() {
				if p, err := strconv.Atoi(strings.TrimSpace(sc.Text())); err == nil {
					return "http://127.0.0.1:" + strconv.Itoa(p)
				}
			}
		}
		select {
		case <-exited:
			t.Fatalf("kiln_gpu.serve exited before writing %s", portFile)
		case <-time.After(100 * time.Millisecond):
		}
	}
	t.Fatalf("kiln_gpu.serve did not write %s within 120s", portFile)
	return ""
}
