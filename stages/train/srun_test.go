package train

import (
	"context"
	"os"
	"path/filepath"
	"sort"
	"strings"
	"testing"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/kilnrl/kiln/formats/dataset"
	"github.com/kilnrl/kiln/internal/testenv/slurmtest"
)

// TestSrunLauncherOnSlurm runs kiln-train --launcher srun --nproc 2 on
// the real one-node Slurm cluster of internal/testenv/slurmtest (the one
// pipelines/slurm's end-to-end test submits to), with the fake trainer:
// srun starts two tasks in one job step, the shim maps SLURM_PROCID,
// SLURM_NTASKS and SLURM_LOCALID onto RANK, WORLD_SIZE and LOCAL_RANK,
// both see the rendezvous kiln-train chose, and the checkpoint rank 0
// saved is committed. Before, only --dry-run printed the srun command.
func TestSrunLauncherOnSlurm(t *testing.T) {
	c := slurmtest.Start(t)
	w := newWorld(t)
	ranks := filepath.Join(t.TempDir(), "ranks")
	t.Setenv("SLURM_CONF", c.Conf)
	t.Setenv("KILN_FAKE_RANKS", ranks)
	t.Setenv("MASTER_ADDR", "")
	t.Setenv("MASTER_PORT", "")
	out, errs, code := w.run(t, "--trajectories", w.trajectories.String(), "--advantages", w.advantages.String(), "--model", w.model,
		"--out", "ckpt", "--launcher", "srun", "--nproc", "2")
	require.Equal(t, 0, code, "stderr: %s\n%s", errs, c.Logs())
	ref := lastLine(out)
	require.True(t, strings.HasPrefix(ref, "ckpt@"), out)
	assert.Contains(t, errs, `msg=trainer command="srun --ntasks 2 --kill-on-bad-exit=1 sh -c`)

	b, err := os.ReadFile(ranks)
	require.NoError(t, err, "the trainer's tasks recorded nothing")
	lines := strings.Split(strings.TrimSpace(string(b)), "\n")
	sort.Strings(lines)
	require.Len(t, lines, 2, "want one line per srun task:\n%s", b)
	var job, master string
	for i, l := range lines {
		// RANK WORLD_SIZE LOCAL_RANK SLURM_JOB_ID SLURM_STEP_ID SLURM_PROCID MASTER_ADDR MASTER_PORT
		f := strings.Fields(l)
		require.Len(t, f, 8, "task line %q", l)
		rank := string(rune('0' + i))
		assert.Equal(t, []string{rank, "2", rank}, f[:3], "task %d's RANK WORLD_SIZE LOCAL_RANK: %q", i, l)
		assert.Equal(t, rank, f[5], "task %d's SLURM_PROCID: %q", i, l)
		assert.NotEqual(t, "-", f[3], "task %d ran outside a Slurm job: %q", i, l)
		assert.NotEqual(t, "-", f[6], "task %d has no MASTER_ADDR: %q", i, l)
		assert.NotEqual(t, "-", f[7], "task %d has no MASTER_PORT: %q", i, l)
		if i == 0 {
			job, master = f[3]+"."+f[4], f[6]+":"+f[7]
		} else {
			assert.Equal(t, job, f[3]+"."+f[4], "the tasks ran in different job steps")
			assert.Equal(t, master, f[6]+":"+f[7], "the tasks saw different rendezvous")
		}
	}
	v, err := dataset.OpenString(context.Background(), w.st, ref)
	require.NoError(t, err)
	assert.EqualValues(t, 2, v.Metrics["steps"])
}
