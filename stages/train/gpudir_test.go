package train

import (
	"bytes"
	"os"
	"path/filepath"
	"strconv"
	"testing"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/kilnrl/kiln/internal/stagecmd"
)

// A gpu/kiln_gpu/train.py planted in a parent of the working directory
// never runs: without --gpu-dir or $KILN_GPU_DIR kiln-train looks only
// beside its binary, BIN/../gpu (docs/train-stage.md §8). The layouts: a
// binary with no gpu/ beside it (refused, exit 2), make build's
// REPO/bin/kiln-train beside REPO/gpu, and a symlink to that binary from
// another directory (both run the real trainer).
func TestDefaultGPUDirIgnoresWorkingDirectory(t *testing.T) {
	w := newWorld(t)
	root := t.TempDir()
	marker := filepath.Join(root, "planted-trainer-ran")
	plant := filepath.Join(root, "shared", "gpu", "kiln_gpu")
	require.NoError(t, os.MkdirAll(plant, 0o755))
	require.NoError(t, os.WriteFile(filepath.Join(plant, "__init__.py"), nil, 0o644))
	require.NoError(t, os.WriteFile(filepath.Join(plant, "train.py"),
		[]byte("open("+strconv.Quote(marker)+", 'w').write('planted')\n"), 0o644))
	below := filepath.Join(root, "shared", "jobs", "step-3")
	require.NoError(t, os.MkdirAll(below, 0o755))
	t.Chdir(below)
	t.Setenv("KILN_GPU_DIR", "")

	// REPO/bin/kiln-train and REPO/gpu (the fake trainer), as make build lays them out
	repo := filepath.Join(root, "repo")
	require.NoError(t, os.MkdirAll(filepath.Join(repo, "bin"), 0o755))
	require.NoError(t, os.WriteFile(filepath.Join(repo, "bin", "kiln-train"), []byte("binary"), 0o755))
	require.NoError(t, os.Symlink(w.fakeGPU, filepath.Join(repo, "gpu")))
	require.NoError(t, os.MkdirAll(filepath.Join(root, "usr", "bin"), 0o755))
	linked := filepath.Join(root, "usr", "bin", "kiln-train")
	require.NoError(t, os.Symlink(filepath.Join(repo, "bin", "kiln-train"), linked))
	lone := filepath.Join(root, "opt", "bin", "kiln-train")

	t.Cleanup(func() { executable = os.Executable })
	run := func(exe, out string) (string, int) {
		executable = func() (string, error) { return exe, nil }
		var stdout, stderr bytes.Buffer
		env := &stagecmd.Env{Stdout: &stdout, Stderr: &stderr, Log: stagecmd.NewLogger(&stderr, false)}
		code := stagecmd.Main(App(env), []string{"kiln-train", "--store", w.st.Root(), "--python", "python3",
			"--cache-dir", w.cache, "--work-dir", w.work, "--global-batch-size", "2", "--max-tokens-per-microbatch", "10",
			"--trajectories", w.trajectories.String(), "--advantages", w.advantages.String(), "--model", w.model, "--out", out}, &stderr)
		return stderr.String(), code
	}

	errs, code := run(lone, "ckpt-lone")
	assert.NoFileExists(t, marker, "the trainer planted above the working directory ran")
	assert.Equal(t, stagecmd.ExitUsage, code, errs)
	assert.Contains(t, errs, "pass --gpu-dir REPO/gpu (or set KILN_GPU_DIR)")

	for _, exe := range []string{filepath.Join(repo, "bin", "kiln-train"), linked} {
		errs, code = run(exe, "ckpt-"+filepath.Base(filepath.Dir(filepath.Dir(exe))))
		assert.NoFileExists(t, marker, "the trainer planted above the working directory ran")
		assert.Equal(t, 0, code, errs)
		assert.Contains(t, errs, "trainer: fake trainer: loading", "binary %s", exe)
	}
}
