package rollout

import (
	"bytes"
	"context"
	"errors"
	"os"
	"os/exec"
	"path/filepath"
	"runtime"
	"syscall"
	"testing"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/kilnrl/kiln/fixtures"
	"github.com/kilnrl/kiln/formats/dataset"
)

// TestRunSIGTERM sends SIGTERM to a built kiln-rollout binary while every
// agent hangs (Slurm preemption, docs/rollout.md §2.6): it exits 130,
// commits no version (every run was preempted: none is written), and the
// rerun runs every run and commits all three datasets.
func TestRunSIGTERM(t *testing.T) {
	w := newRunWorld(t)
	bin := filepath.Join(w.tools, "kiln-rollout")
	build := exec.Command(filepath.Join(runtime.GOROOT(), "bin", "go"), "build", "-o", bin, "github.com/kilnrl/kiln/cmd/kiln-rollout")
	out, err := build.CombinedOutput()
	require.NoError(t, err, string(out))

	model := newScriptedModel(w.set, func(fixtures.Task, int) behaviour { return hang })
	url := startEngine(t, model.script)
	name := "rollout/sigterm"
	cmd := exec.Command(bin, "run", "--store", w.storeDir, "--tasks", w.tasks, "--images", w.images, "--bundles", w.bundles,
		"--engine", url, "--mode", "generate", "--tokenizer-dir", w.tokenizer, "--samples", "1", "--weights-version", "w-test",
		"--budget", "2m", "-j", "16", "--out", name)
	cmd.Env = append(os.Environ(), "PATH="+w.tools+string(os.PathListSeparator)+os.Getenv("PATH"))
	var stderr bytes.Buffer
	cmd.Stdout, cmd.Stderr = &stderr, &stderr
	require.NoError(t, cmd.Start())
	done := make(chan error, 1)
	go func() { done <- cmd.Wait() }()
	// Every agent has made its model call and hangs.
	deadline := time.Now().Add(90 * time.Second)
	for len(model.behaviours()) < len(w.set.Tasks) && time.Now().Before(deadline) {
		time.Sleep(100 * time.Millisecond)
	}
	require.Len(t, model.behaviours(), len(w.set.Tasks), stderr.String())
	require.NoError(t, cmd.Process.Signal(syscall.SIGTERM))
	select {
	case err = <-done:
	case <-time.After(60 * time.Second):
		_ = cmd.Process.Kill()
		t.Fatalf("kiln-rollout did not stop within 60 s of SIGTERM:\n%s", stderr.String())
	}
	var ee *exec.ExitError
	require.True(t, errors.As(err, &ee), "%v\n%s", err, stderr.String())
	assert.Equal(t, 130, ee.ExitCode(), stderr.String())
	for _, kind := range []string{"rollouts", "turns", "trajectories"} {
		_, err := dataset.OpenString(context.Background(), w.st, name+"/"+kind)
		assert.Error(t, err, "%s committed after SIGTERM", kind)
	}

	// The rerun runs them all.
	fix := newScriptedModel(w.set, func(fixtures.Task, int) behaviour { return lookAround })
	o := w.options(startEngine(t, fix.script))
	o.Samples = 1
	res, err, logs := w.run(t, context.Background(), name, o, nil)
	require.NoError(t, err, logs)
	rows := readRollouts(t, w.st, res.Rollouts.Ref)
	require.Len(t, rows, len(w.set.Tasks))
	for _, r := range rows {
		assert.Nil(t, r.AbortReason, r.TaskID)
	}
}
