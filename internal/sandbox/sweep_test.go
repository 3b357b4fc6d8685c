package sandbox_test

import (
	"bufio"
	"context"
	"encoding/json"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/stretchr/testify/require"

	"github.com/kilnrl/kiln/internal/sandbox"
	"github.com/kilnrl/kiln/internal/sandbox/sandboxtest"
)

const (
	sweepChildEnv    = "KILN_SWEEP_CHILD_STATE"
	sweepChildHelper = "KILN_SWEEP_CHILD_HELPER"
)

// TestSweepChild is not a test: it is the process TestSweep kills. It boots
// a sandbox in the given state directory, says so, and waits to be killed.
func TestSweepChild(t *testing.T) {
	state := os.Getenv(sweepChildEnv)
	if state == "" {
		t.Skip("the sandbox owner TestSweep kills")
	}
	root := sandboxtest.Require(t)
	sb, err := sandbox.Boot(context.Background(), sandbox.Options{Rootfs: root, HelperPath: os.Getenv(sweepChildHelper), StateDir: state})
	require.NoError(t, err)
	_, err = sb.Exec(context.Background(), sandbox.Cmd{Shell: "echo hi > /root/mark"})
	require.NoError(t, err)
	fmt.Println("ready")
	time.Sleep(time.Hour)
}

// A sandbox whose owner is SIGKILLed leaves its overlay mount, cgroups and
// state behind; Sweep releases exactly those and spares a live sandbox in
// the same state directory.
func TestSweep(t *testing.T) {
	root := sandboxtest.Require(t)
	state := t.TempDir()

	live := sandboxtest.Boot(t, helper, sandbox.Options{Rootfs: root, StateDir: state})

	cmd := exec.Command(os.Args[0], "-test.run=^TestSweepChild$", "-test.count=1")
	cmd.Env = append(os.Environ(), sweepChildEnv+"="+state, sweepChildHelper+"="+helper)
	cmd.Stderr = os.Stderr
	out, err := cmd.StdoutPipe()
	require.NoError(t, err)
	require.NoError(t, cmd.Start())
	sc := bufio.NewScanner(out)
	ready := false
	for sc.Scan() {
		if sc.Text() == "ready" {
			ready = true
			break
		}
	}
	require.True(t, ready, "the child did not boot its sandbox")
	require.NoError(t, cmd.Process.Signal(syscall.SIGKILL))
	_ = cmd.Wait()

	// The dead owner's state: a directory with its leftovers record.
	var dead string
	entries, err := os.ReadDir(state)
	require.NoError(t, err)
	for _, e := range entries {
		dir := filepath.Join(state, e.Name())
		if _, err := os.Stat(filepath.Join(dir, "leftovers.json")); err != nil {
			continue
		}
		if f, err := os.Open(dir); err == nil {
			locked := syscall.Flock(int(f.Fd()), syscall.LOCK_EX|syscall.LOCK_NB) != nil
			if !locked {
				syscall.Flock(int(f.Fd()), syscall.LOCK_UN)
				dead = dir
			}
			f.Close()
		}
	}
	require.NotEmpty(t, dead, "the killed sandbox's state directory")
	var l struct {
		Merged  string
		Cgroups []string
	}
	b, err := os.ReadFile(filepath.Join(dead, "leftovers.json"))
	require.NoError(t, err)
	require.NoError(t, json.Unmarshal(b, &l))
	require.True(t, mounted(t, l.Merged), "the overlay outlives its owner")
	require.NotEmpty(t, l.Cgroups)
	for _, cg := range l.Cgroups {
		require.DirExists(t, cg, "the cgroup outlives its owner")
	}

	n, err := sandbox.Sweep(context.Background(), state, nil)
	require.NoError(t, err)
	require.Equal(t, 1, n, "exactly the dead sandbox is released")
	require.False(t, mounted(t, l.Merged), "overlay still mounted")
	for _, cg := range l.Cgroups {
		require.NoDirExists(t, cg)
	}
	require.NoDirExists(t, dead)

	// The live sandbox is untouched and still works.
	res, err := live.Exec(context.Background(), sandbox.Cmd{Shell: "echo alive"})
	require.NoError(t, err)
	require.Equal(t, "alive\n", string(res.Stdout))
	n, err = sandbox.Sweep(context.Background(), state, nil)
	require.NoError(t, err)
	require.Zero(t, n)
}

// mounted reports whether path is a mount point of this mount namespace.
func mounted(t *testing.T, path string) bool {
	b, err := os.ReadFile("/proc/self/mountinfo")
	require.NoError(t, err)
	for _, line := range strings.Split(string(b), "\n") {
		if f := strings.Fields(line); len(f) > 4 && f[4] == path {
			return true
		}
	}
	return false
}
