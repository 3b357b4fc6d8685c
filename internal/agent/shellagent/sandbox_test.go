package shellagent_test

import (
	"context"
	"os"
	"os/exec"
	"path/filepath"
	"runtime"
	"strings"
	"testing"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/kilnrl/kiln/internal/agent/adapter"
	"github.com/kilnrl/kiln/internal/sandbox"
	"github.com/kilnrl/kiln/internal/sandbox/sandboxtest"
)

// kiln-agent as the rollout stage will run it: the static binary copied
// into a real bwrap sandbox over the base image, run as the agent user,
// reaching the host's adapter only through the sandbox's forwarded
// endpoint. The model reads the file, fixes it and answers; the fix is in
// the sandbox and the turns are the adapter's records.
func TestInABwrapSandbox(t *testing.T) {
	sandboxtest.Require(t)
	dir := t.TempDir()
	helper, err := sandboxtest.BuildHelper(dir)
	require.NoError(t, err)
	agentBin := buildAgent(t, dir)

	s := newStack(t, steps(t,
		step{out: bash("cat calc.go; id -un")},
		step{out: call("edit", "path", "calc.go", "old_str", "return a - b", "new_str", "return a + b"),
			want: []string{"return a - b", "agent\n[exit code 0]"}},
		step{out: "Fixed.", want: []string{"edited calc.go"}},
	), adapter.Options{})
	endpoint := strings.TrimSuffix(strings.TrimPrefix(s.url, "http://"), "/v1")
	sb := sandboxtest.Boot(t, helper, sandbox.Options{Endpoint: endpoint})

	ctx := context.Background()
	bin, err := os.ReadFile(agentBin)
	require.NoError(t, err)
	require.NoError(t, sb.WriteFile(ctx, "/tmp/kiln/kiln-agent", bin, 0o755, ""))
	require.NoError(t, sb.WriteFile(ctx, "/tmp/repo/calc.go", []byte(buggy), 0o644, sandbox.Agent))
	require.NoError(t, sb.WriteFile(ctx, "/tmp/task.md", []byte("Add subtracts."), 0o644, sandbox.Agent))

	res, err := sb.Exec(ctx, sandbox.Cmd{
		Argv: []string{"/tmp/kiln/kiln-agent", "--base-url", "http://" + sb.Endpoint() + "/v1", "--model", "m",
			"--task-file", "/tmp/task.md", "--workdir", "/tmp/repo", "--log", "/tmp/agent.jsonl", "--timeout", "1m"},
		User: sandbox.Agent, Env: []string{"KILN_AGENT_API_KEY=sb-1"}, Timeout: 2 * time.Minute,
	})
	require.NoError(t, err)
	require.Equal(t, 0, res.ExitCode, "stdout %s\nstderr %s", res.Stdout, res.Stderr)
	assert.Equal(t, "Fixed.\n", string(res.Stdout))
	got, err := sb.ReadFile(ctx, "/tmp/repo/calc.go")
	require.NoError(t, err)
	assert.Equal(t, strings.Replace(buggy, "a - b", "a + b", 1), string(got))
	lb, err := sb.ReadFile(ctx, "/tmp/agent.jsonl")
	require.NoError(t, err)
	assert.Len(t, ofKind(events(t, lb), "tool"), 2)
	turns, err := s.ad.Finish("sb-1")
	require.NoError(t, err)
	assert.Len(t, turns, 3)
}

// An image with nothing in it but the users (no libc, no shell): kiln-agent still runs,
// and a bash call is an error result the model reads, not a crash.
func TestInAnEmptyImage(t *testing.T) {
	sandboxtest.Require(t)
	dir := t.TempDir()
	helper, err := sandboxtest.BuildHelper(dir)
	require.NoError(t, err)
	agentBin := buildAgent(t, dir)
	root := filepath.Join(dir, "rootfs")
	for _, d := range []string{"etc", "tmp", "work"} {
		require.NoError(t, os.MkdirAll(filepath.Join(root, d), 0o755))
	}
	// The sandbox's users are read from /etc/passwd and /etc/group.
	require.NoError(t, os.WriteFile(filepath.Join(root, "etc", "passwd"), []byte("root:x:0:0:root:/:/bin/sh\n"), 0o644))
	require.NoError(t, os.WriteFile(filepath.Join(root, "etc", "group"), []byte("root:x:0:\n"), 0o644))
	require.NoError(t, os.Chmod(filepath.Join(root, "tmp"), 0o1777))
	require.NoError(t, os.Chmod(filepath.Join(root, "work"), 0o777))

	s := newStack(t, steps(t,
		step{out: bash("ls")},
		step{out: "No shell here.", want: []string{"error: bash: cannot run /bin/sh"}},
	), adapter.Options{})
	endpoint := strings.TrimSuffix(strings.TrimPrefix(s.url, "http://"), "/v1")
	sb := sandboxtest.Boot(t, helper, sandbox.Options{Rootfs: root, Endpoint: endpoint})
	ctx := context.Background()
	bin, err := os.ReadFile(agentBin)
	require.NoError(t, err)
	require.NoError(t, sb.WriteFile(ctx, "/tmp/kiln-agent", bin, 0o755, ""))
	require.NoError(t, sb.WriteFile(ctx, "/tmp/task.md", []byte("List the files."), 0o644, ""))
	res, err := sb.Exec(ctx, sandbox.Cmd{
		Argv: []string{"/tmp/kiln-agent", "--base-url", "http://" + sb.Endpoint() + "/v1", "--model", "m",
			"--task-file", "/tmp/task.md", "--workdir", "/work"},
		User: sandbox.Agent, Env: []string{"KILN_AGENT_API_KEY=empty"}, Timeout: time.Minute,
	})
	require.NoError(t, err)
	require.Equal(t, 0, res.ExitCode, "stdout %s\nstderr %s", res.Stdout, res.Stderr)
	assert.Equal(t, "No shell here.\n", string(res.Stdout))
	turns, err := s.ad.Finish("empty")
	require.NoError(t, err)
	assert.Len(t, turns, 2)
}

// buildAgent builds cmd/kiln-agent into dir as make build does
// (CGO_ENABLED=0: static) and returns its path.
func buildAgent(t *testing.T, dir string) string {
	t.Helper()
	out := filepath.Join(dir, "kiln-agent")
	cmd := exec.Command(goCmd(), "build", "-o", out, "github.com/kilnrl/kiln/cmd/kiln-agent")
	cmd.Env = append(os.Environ(), "CGO_ENABLED=0")
	b, err := cmd.CombinedOutput()
	require.NoError(t, err, string(b))
	return out
}

// goCmd is the go command of the toolchain running the tests.
func goCmd() string {
	goBin := filepath.Join(runtime.GOROOT(), "bin", "go")
	if _, err := os.Stat(goBin); err != nil {
		return "go"
	}
	return goBin
}
