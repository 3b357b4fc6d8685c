package train

import (
	"os"
	"path/filepath"
	"testing"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
)

// kiln-train prints its summary (loss, clip fraction, grad norm, logprob
// difference, tokens) and warns when the committed weights are the base's:
// a run on the fake trainer's own checkpoint writes the same bytes again.
func TestSummaryAndUnchangedWeightsWarning(t *testing.T) {
	w := newWorld(t)
	args := []string{"--trajectories", w.trajectories.String(), "--advantages", w.advantages.String()}
	out, errs, code := w.run(t, append(args, "--model", w.model, "--out", "ckpt")...)
	require.Equal(t, 0, code, errs)
	assert.Contains(t, errs, "train: 2 steps, 17 tokens per step; loss 0 (first) 0.1 (last); clip fraction 0; grad norm 1 (max 1); logprob difference 0\n")
	assert.NotContains(t, errs, "WARN")
	_, errs, code = w.run(t, append(args, "--model", lastLine(out), "--out", "ckpt2")...)
	require.Equal(t, 0, code, errs)
	assert.Contains(t, errs, "train: WARNING: the committed weights equal the base's (max tensor difference 0)")
	assert.Contains(t, errs, `level=WARN msg="the trained weights equal the base's`)
	assert.NotContains(t, errs, "every advantage")
}

func TestZeroAdvantagesWarning(t *testing.T) {
	w := newWorld(t)
	segs := fixture()
	for i := range segs {
		segs[i].TopPOffsets, segs[i].TopPIDs, segs[i].TopPLogProbs = nil, nil, nil
		segs[i].Advantage = 0
	}
	traj := putSegments(t, w.st, "trajectories-z", segs)
	adv := putAdvantages(t, w.st, "advantages-z", traj, segs)
	_, errs, code := w.run(t, "--trajectories", traj.String(), "--advantages", adv.String(), "--model", w.model, "--out", "ckpt")
	require.Equal(t, 0, code, errs)
	assert.Contains(t, errs, `level=WARN msg="every advantage of the input is 0`)
	assert.Contains(t, errs, "train: WARNING: every advantage of the input is 0")
}

func writeST(t *testing.T, path string, tensors ...Tensor) {
	t.Helper()
	f, err := os.Create(path)
	require.NoError(t, err)
	require.NoError(t, WriteSafetensors(f, tensors, nil))
	require.NoError(t, f.Close())
}

func TestWeightsUnchanged(t *testing.T) {
	base, out := t.TempDir(), t.TempDir()
	writeST(t, filepath.Join(base, "model.safetensors"), Tensor{"a", []float32{1, 2, 3}}, Tensor{"b", []float32{4}})
	shard := "model-00001-of-00001.safetensors"
	index := `{"weight_map":{"a":"` + shard + `","b":"` + shard + `"}}`
	require.NoError(t, os.WriteFile(filepath.Join(out, "model.safetensors.index.json"), []byte(index), 0o644))
	for _, c := range []struct {
		name    string
		tensors []Tensor
		want    bool
	}{
		{"the same bytes", []Tensor{{"a", []float32{1, 2, 3}}, {"b", []float32{4}}}, true},
		{"one value moved", []Tensor{{"a", []float32{1, 2, 3.0000002}}, {"b", []float32{4}}}, false},
		{"the last tensor moved", []Tensor{{"a", []float32{1, 2, 3}}, {"b", []float32{4.5}}}, false},
		{"another dtype", []Tensor{{"a", []int32{1, 2, 3}}, {"b", []float32{4}}}, false},
		{"another shape", []Tensor{{"a", []float32{1, 2}}, {"b", []float32{4}}}, false},
	} {
		writeST(t, filepath.Join(out, shard), c.tensors...)
		got, err := WeightsUnchanged(out, base)
		require.NoError(t, err, c.name)
		assert.Equal(t, c.want, got, c.name)
	}
	// a tensor the base lacks is a change; a base without safetensors is an error
	require.NoError(t, os.WriteFile(filepath.Join(out, "model.safetensors.index.json"), []byte(`{"weight_map":{"a":"`+shard+`","c":"`+shard+`"}}`), 0o644))
	writeST(t, filepath.Join(out, shard), Tensor{"a", []float32{1, 2, 3}}, Tensor{"c", []float32{4}})
	got, err := WeightsUnchanged(out, base)
	require.NoError(t, err)
	assert.False(t, got)
	_, err = WeightsUnchanged(out, t.TempDir())
	assert.Error(t, err)
}

func TestSummaryLines(t *testing.T) {
	s := Summary{Steps: []map[string]any{
		{"loss": 0.5, "pg_clipfrac": 0.1, "grad_norm": 2.0, "train_rollout_logprob_abs_diff": 1e-6, "train_rollout_logprob_max_abs_diff": 4e-6, "tokens": 100.0},
		{"loss": 0.25, "pg_clipfrac": 0.3, "grad_norm": 4.0, "train_rollout_logprob_abs_diff": 3e-6, "train_rollout_logprob_max_abs_diff": 2e-6, "tokens": 300.0},
	}}
	assert.Equal(t, []string{"train: 2 steps, 200 tokens per step; loss 0.5 (first) 0.25 (last); clip fraction 0.2; grad norm 3 (max 4); logprob difference 2e-06 (max 4e-06)"}, s.Lines())
	s.ZeroAdvantages, s.Unchanged = true, true
	assert.Len(t, s.Lines(), 3)
}
