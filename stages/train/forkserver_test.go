package train

import (
	"context"
	"net"
	"path/filepath"
	"testing"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/kilnrl/kiln/formats/dataset"
	"github.com/kilnrl/kiln/internal/testenv"
	"github.com/kilnrl/kiln/internal/testenv/gputest"
)

// kiln-train --trainer-socket runs the plan on a warm trainer
// (kiln_gpu.forkserver; docs/train-stage.md §8.1) and commits exactly what
// a trainer process would: the same version, the same weights and
// optimizer state, byte for byte. Needs the gpu venv: skips without,
// fails under CI=true.
func TestRealTrainerForkserver(t *testing.T) {
	if testing.Short() {
		t.Skip("trains a model on CPU")
	}
	ge := gputest.Find(t)
	w := newWorld(t)
	tiny := ge.Tiny(t)
	sock := filepath.Join(t.TempDir(), "trainer.sock")
	ctx, cancel := context.WithCancel(context.Background())
	srv := ge.Command(ctx, "-m", "kiln_gpu.forkserver", "--socket", sock, "--preload", tiny)
	var log testenv.Buffer
	srv.Stderr = &log
	require.NoError(t, srv.Start())
	t.Cleanup(func() { cancel(); srv.Wait() })
	deadline := time.Now().Add(2 * time.Minute)
	for {
		c, err := net.Dial("unix", sock)
		if err == nil {
			c.Close()
			break
		}
		require.True(t, time.Now().Before(deadline), "the forkserver did not listen on %s: %v", sock, err)
		time.Sleep(100 * time.Millisecond)
	}

	args := func(out string, extra ...string) []string {
		return append([]string{"--python", ge.Python, "--gpu-dir", ge.Dir, "--trajectories", w.trajectories.String(),
			"--advantages", w.advantages.String(), "--model", tiny, "--lr", "1e-4", "--seed", "3", "--out", out}, extra...)
	}
	files := func(out string, extra ...string) (string, map[string]string) {
		t.Helper()
		stdout, stderr, code := w.run(t, args(out, extra...)...)
		require.Equal(t, 0, code, "stderr:\n%s", stderr)
		v, err := dataset.OpenString(context.Background(), w.st, lastLine(stdout))
		require.NoError(t, err)
		fs, err := ReadCheckpointFiles(context.Background(), v)
		require.NoError(t, err)
		sums := map[string]string{}
		for _, f := range fs {
			sums[f.Name] = f.SHA256
		}
		return v.Ref().Version, sums
	}
	vp, direct := files("by-process")
	assert.NotContains(t, log.String(), ": run ")
	vs, warm := files("by-socket", "--trainer-socket", sock)
	assert.Regexp(t, `run \d+: .*/plan\.json\n.*run \d+: exit 0`, log.String(), "the run went through the socket")
	assert.Equal(t, vp, vs, "the socket is not in the version id")
	for _, name := range []string{"model-00001-of-00001.safetensors", "optimizer.pt", "config.json"} {
		require.NotEmpty(t, direct[name], name)
		assert.Equal(t, direct[name], warm[name], "%s: a warm run trains what a process does", name)
	}

	_, stderr, code := w.run(t, args("torchrun", "--trainer-socket", sock, "--launcher", "torchrun", "--nproc", "2")...)
	assert.Equal(t, 2, code)
	assert.Contains(t, stderr, "--trainer-socket runs the trainer in one process")
	gone := filepath.Join(t.TempDir(), "none.sock")
	_, stderr, code = w.run(t, args("none", "--trainer-socket", gone)...)
	assert.NotEqual(t, 0, code)
	assert.Contains(t, stderr, "python -m kiln_gpu.forkserver --socket "+gone)
}
