package rollout

import (
	"bytes"
	"context"
	"errors"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"runtime"
	"strings"
	"sync/atomic"
	"syscall"
	"testing"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/kilnrl/kiln/fixtures"
	"github.com/kilnrl/kiln/formats/dataset"
	"github.com/kilnrl/kiln/internal/sandbox"
)

// rolloutBinary builds cmd/kiln-rollout beside the shell agent in
// w.tools (where the built binary finds it).
func rolloutBinary(t *testing.T, w *runWorld) string {
	t.Helper()
	bin := filepath.Join(w.tools, "kiln-rollout")
	cmd := exec.Command(filepath.Join(runtime.GOROOT(), "bin", "go"), "build", "-o", bin, "github.com/kilnrl/kiln/cmd/kiln-rollout")
	out, err := cmd.CombinedOutput()
	require.NoError(t, err, string(out))
	return bin
}

// rolloutCommand is the built kiln-rollout running `run` over w's tasks
// against the engine at url into name, with extra flags; its sandboxes'
// state directories go under tmp (TMPDIR) when tmp is not "".
func rolloutCommand(bin string, w *runWorld, url, name, tmp string, extra ...string) *exec.Cmd {
	args := []string{"run", "--store", w.storeDir, "--tasks", w.tasks, "--images", w.images, "--bundles", w.bundles,
		"--engine", url, "--mode", "generate", "--tokenizer-dir", w.tokenizer, "--weights-version", "w-test", "--out", name}
	cmd := exec.Command(bin, append(args, extra...)...)
	cmd.Env = append(os.Environ(), "PATH="+w.tools+string(os.PathListSeparator)+os.Getenv("PATH"))
	if tmp != "" {
		cmd.Env = append(cmd.Env, "TMPDIR="+tmp)
	}
	return cmd
}

// TestRunSIGTERM sends SIGTERM to a built kiln-rollout binary while every
// agent hangs (Slurm preemption, docs/rollout.md §2.6): it exits 130,
// commits no version (every run was preempted: none is written), and the
// rerun runs every run and commits all three datasets.
func TestRunSIGTERM(t *testing.T) {
	w := newRunWorld(t)
	bin := rolloutBinary(t, w)

	model := newScriptedModel(w.set, func(fixtures.Task, int) behaviour { return hang })
	url := startEngine(t, model.script)
	name := "rollout/sigterm"
	cmd := rolloutCommand(bin, w, url, name, "", "--samples", "1", "--budget", "2m", "-j", "16")
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
	var err error
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

// slowCommand is the bash call of the runs that finish in the first
// batch of TestRunSIGKILL: long enough that they finish after the stage's
// batch timer (flushRunsEvery, docs/rollout.md §2.5), so that their batch
// is written while the other runs still hang.
func slowCommand() string { return fmt.Sprintf("sleep %d", int(flushRunsEvery/time.Second)+1) }

// TestRunSIGKILL kills a built kiln-rollout binary with SIGKILL mid-run
// (docs/rollout.md §2.6), once before any batch is receipted and once
// after one is, and reruns the same command line against the same engine:
// the rerun runs only what no receipted batch holds (the receipted runs
// keep their rows, started before the kill; every other row started
// after it), commits the version ids --print-version named before the
// first invocation (and an uninterrupted invocation into another name
// commits), and the committed versions verify whole with every
// run once in each. Until the rerun commits, no version of the three is
// readable. The rerun releases the killed invocation's sandboxes.
func TestRunSIGKILL(t *testing.T) {
	w := newRunWorld(t)
	bin := rolloutBinary(t, w)
	ctx := context.Background()
	cases := []struct {
		name    string
		samples int
		// first is the behaviour of a task's nth session while the first
		// invocation runs.
		first func(nth int) behaviour
		// batched: kill once a batch is receipted (else once every run
		// made its model call, before any batch).
		batched bool
	}{
		{name: "before any batch", samples: 1, first: func(int) behaviour { return hang }},
		{name: "after a batch", samples: 2, batched: true, first: func(nth int) behaviour {
			if nth == 0 {
				return snoop // slowCommand, then a final answer
			}
			return hang
		}},
	}
	for _, c := range cases {
		t.Run(c.name, func(t *testing.T) {
			var rerun atomic.Bool
			model := newScriptedModel(w.set, func(_ fixtures.Task, nth int) behaviour {
				if rerun.Load() {
					return lookAround
				}
				return c.first(nth)
			})
			model.snoop = func([]string) string { return slowCommand() }
			url := startEngine(t, model.script)
			name := "rollout/sigkill-" + strings.ReplaceAll(c.name, " ", "-")
			runs := c.samples * len(w.set.Tasks)
			tmp := t.TempDir()
			t.Cleanup(func() { _, _ = sandbox.Sweep(ctx, tmp, nil) }) // before tmp is removed
			flags := []string{"--samples", fmt.Sprint(c.samples), "--budget", "2m", "-j", fmt.Sprint(runs)}

			out, err := rolloutCommand(bin, w, url, name, tmp, append(flags, "--print-version")...).Output()
			require.NoError(t, err)
			want := strings.Fields(string(out))
			require.Len(t, want, 3, string(out))
			refs := make([]dataset.Ref, 3)
			for i, s := range want {
				refs[i], err = dataset.ParseRef(s)
				require.NoError(t, err)
			}
			receipted := func() map[string]bool {
				keys, err := dataset.ReceiptedRows(ctx, w.st, refs[0], dataset.Part{})
				require.NoError(t, err)
				runKeys := map[string]bool{}
				for k := range keys {
					if !strings.HasPrefix(k, batchKeyPrefix) {
						runKeys[k] = true
					}
				}
				return runKeys
			}

			cmd := rolloutCommand(bin, w, url, name, tmp, flags...)
			var stderr bytes.Buffer
			cmd.Stdout, cmd.Stderr = &stderr, &stderr
			require.NoError(t, cmd.Start())
			done := make(chan error, 1)
			go func() { done <- cmd.Wait() }()
			deadline := time.Now().Add(150 * time.Second)
			ready := func() bool {
				if c.batched {
					return len(receipted()) > 0
				}
				return len(model.behaviours()) == runs
			}
			for !ready() && time.Now().Before(deadline) {
				select {
				case err := <-done:
					t.Fatalf("kiln-rollout ended before it was killed: %v\n%s", err, stderr.String())
				case <-time.After(100 * time.Millisecond):
				}
			}
			require.True(t, ready(), "not ready to kill after 150 s:\n%s", stderr.String())
			require.NoError(t, cmd.Process.Signal(syscall.SIGKILL))
			err = <-done
			killedAt := time.Now()
			var ee *exec.ExitError
			require.True(t, errors.As(err, &ee), "%v", err)
			assert.Equal(t, syscall.SIGKILL, ee.Sys().(syscall.WaitStatus).Signal())

			kept := receipted()
			if c.batched {
				assert.NotEmpty(t, kept)
				assert.Less(t, len(kept), runs, "every run was receipted before the kill")
			} else {
				assert.Empty(t, kept)
			}
			// Nothing of the killed invocation is readable as a version.
			for i, kind := range []string{"rollouts", "turns", "trajectories"} {
				_, err := dataset.OpenString(ctx, w.st, name+"/"+kind)
				assert.Error(t, err, "%s readable after SIGKILL", kind)
				_, err = dataset.Open(ctx, w.st, refs[i])
				assert.Error(t, err, "%s readable after SIGKILL", refs[i])
			}

			// The same command line again completes the stage.
			rerun.Store(true)
			cmd = rolloutCommand(bin, w, url, name, tmp, flags...)
			var rerr bytes.Buffer
			cmd.Stderr = &rerr
			out, err = cmd.Output()
			require.NoError(t, err, rerr.String())
			lines := strings.Split(strings.TrimSpace(string(out)), "\n")
			require.GreaterOrEqual(t, len(lines), 3, string(out))
			assert.Equal(t, want, lines[len(lines)-3:], "the rerun committed other versions than the first invocation's")
			if len(kept) > 0 {
				assert.Contains(t, rerr.String(), fmt.Sprintf("%d resumed from an earlier attempt", len(kept)))
			} else {
				assert.NotContains(t, rerr.String(), "resumed from an earlier attempt")
			}

			// The rerun released the killed invocation's sandboxes (their
			// overlay mounts, cgroups and state directories) and closed its own.
			left, err := filepath.Glob(filepath.Join(tmp, "kiln-sandbox-*"))
			require.NoError(t, err)
			assert.Empty(t, left, "sandboxes of the killed invocation were not released")

			for _, ref := range refs {
				v, err := dataset.Open(ctx, w.st, ref)
				require.NoError(t, err, ref.String())
				require.NoError(t, dataset.Verify(ctx, v, nil), ref.String())
			}
			rows := readRollouts(t, w.st, refs[0])
			require.Len(t, rows, runs, rerr.String())
			seen := map[int64]bool{}
			for _, r := range rows {
				assert.False(t, seen[r.Index], "rollout %d twice", r.Index)
				seen[r.Index] = true
				assert.Nil(t, r.AbortReason, "%s sample %d: %s", r.TaskID, r.Sample, deref(r.AbortReason))
				if kept[fmt.Sprintf("run-%d", r.Index)] {
					assert.True(t, r.StartedAt.Before(killedAt), "rollout %d: a receipted run was run again", r.Index)
					assert.EqualValues(t, 2, r.Turns, "rollout %d: the slow run's bash call and its answer", r.Index)
				} else {
					assert.True(t, r.StartedAt.After(killedAt.Add(-time.Second)), "rollout %d: not receipted, yet not run again", r.Index)
				}
			}
			turnRuns := map[int64]bool{}
			for _, tr := range readTurns(t, w.st, refs[1]) {
				turnRuns[tr.RolloutID] = true
			}
			segRuns := map[int64]bool{}
			for _, s := range readSegments(t, w.st, refs[2]) {
				segRuns[s.RolloutID] = true
			}
			assert.Len(t, turnRuns, runs)
			assert.Len(t, segRuns, runs)

			// An uninterrupted invocation of the same arguments into another
			// name commits the same version ids.
			out, err = rolloutCommand(bin, w, url, name+"-clean", tmp, flags...).Output()
			require.NoError(t, err)
			clean := strings.Fields(string(out))
			require.GreaterOrEqual(t, len(clean), 3, string(out))
			for i, s := range clean[len(clean)-3:] {
				ref, err := dataset.ParseRef(s)
				require.NoError(t, err)
				assert.Equal(t, refs[i].Version, ref.Version, "%s: the uninterrupted run's version differs", s)
			}
		})
	}
}
