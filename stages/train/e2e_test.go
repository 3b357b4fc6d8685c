package train

import (
	"context"
	"testing"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/kilnrl/kiln/formats/dataset"
	"github.com/kilnrl/kiln/internal/testenv/gputest"
)

// The stage with the real trainer (gpu/kiln_gpu/train.py) on the tiny
// Qwen3 checkpoint, on CPU: two steps commit a checkpoint of §6.1 with a
// metric per step; that checkpoint as --model and --resume-from trains
// again from its weights and optimizer state; torchrun with two processes
// commits too. Needs the gpu venv and the
// Qwen3 tokenizer (scripts/install-gpu-deps.sh): skips without, fails
// under CI=true.
func TestRealTrainerTiny(t *testing.T) {
	if testing.Short() {
		t.Skip("trains a model on CPU")
	}
	ge := gputest.Find(t)
	py, gpu := ge.Python, ge.Dir
	w := newWorld(t)
	tiny := ge.Tiny(t)

	ctx := context.Background()
	args := func(extra ...string) []string {
		return append([]string{"--python", py, "--gpu-dir", gpu, "--trajectories", w.trajectories.String(), "--advantages", w.advantages.String(),
			"--lr", "1e-4", "--seed", "3"}, extra...)
	}
	stdout, stderr, code := w.run(t, args("--model", tiny, "--out", "tiny-ckpt")...)
	require.Equal(t, 0, code, "stderr:\n%s", stderr)
	ref := lastLine(stdout)
	v, err := dataset.OpenString(ctx, w.st, ref)
	require.NoError(t, err)
	files, err := ReadCheckpointFiles(ctx, v)
	require.NoError(t, err)
	names := map[string]bool{}
	for _, f := range files {
		names[f.Name] = true
	}
	for _, want := range []string{"config.json", "model.safetensors.index.json", "model-00001-of-00001.safetensors", "tokenizer.json",
		"tokenizer_config.json", "generation_config.json", "metrics.jsonl", "optimizer.pt", "trainer_state.json"} {
		assert.True(t, names[want], "checkpoint lacks %s: %v", want, names)
	}
	sm := v.Metrics["step_metrics"].(map[string]any)
	require.Len(t, sm["loss"], 2)
	require.Len(t, sm["grad_norm"], 2)
	// On-policy first step: the trainer's logprobs are the old ones.
	assert.InDelta(t, 0, sm["ppo_kl"].([]any)[0], 1e-6)

	stdout, stderr, code = w.run(t, args("--model", ref, "--resume-from", ref, "--out", "tiny-ckpt-2")...)
	require.Equal(t, 0, code, "stderr:\n%s", stderr)
	v2, err := dataset.OpenString(ctx, w.st, lastLine(stdout))
	require.NoError(t, err)
	assert.Contains(t, v2.Inputs, v.Ref())
	assert.Equal(t, ref, v2.Metrics["resume_from"])

	// Two processes under torchrun (gloo on CPU) train the same plan.
	stdout, stderr, code = w.run(t, args("--model", tiny, "--out", "tiny-ckpt-torchrun", "--launcher", "torchrun", "--nproc", "2")...)
	require.Equal(t, 0, code, "stderr:\n%s", stderr)
	v3, err := dataset.OpenString(ctx, w.st, lastLine(stdout))
	require.NoError(t, err)
	loss3 := v3.Metrics["step_metrics"].(map[string]any)["loss"].([]any)
	require.Len(t, loss3, 2)
	for i, l := range sm["loss"].([]any) {
		assert.InDelta(t, l, loss3[i], 1e-4, "step %d loss, one process vs two", i)
	}
}

// Top-p replay through the stage into the real trainer: every response
// position records a nucleus of its sampled token and the next id, and
// the trainer runs score-centered REINFORCE over it (docs/train-stage.md
// §5).
func TestRealTrainerTopP(t *testing.T) {
	if testing.Short() {
		t.Skip("trains a model on CPU")
	}
	ge := gputest.Find(t)
	py, gpu := ge.Python, ge.Dir
	w := newWorld(t)
	segs := fixture()
	for i := range segs {
		s := &segs[i]
		s.TopPOffsets, s.TopPIDs, s.TopPLogProbs = make([]int32, 1, s.ResponseLength+1), nil, nil
		resp := s.Tokens[len(s.Tokens)-int(s.ResponseLength):]
		for _, tok := range resp {
			s.TopPIDs = append(s.TopPIDs, tok, tok+1)
			s.TopPLogProbs = append(s.TopPLogProbs, -0.1053605, -2.3025851) // 0.9, 0.1
			s.TopPOffsets = append(s.TopPOffsets, int32(len(s.TopPIDs)))
		}
	}
	traj := putSegments(t, w.st, "trajectories-topp", segs)
	adv := putAdvantages(t, w.st, "advantages-topp", traj, segs)
	tiny := ge.Tiny(t)
	stdout, stderr, code := w.run(t, "--python", py, "--gpu-dir", gpu, "--trajectories", traj.String(), "--advantages", adv.String(),
		"--model", tiny, "--out", "tiny-topp", "--objective", "reinforce", "--score-centering", "--lr", "1e-4")
	require.Equal(t, 0, code, "stderr:\n%s", stderr)
	v, err := dataset.OpenString(context.Background(), w.st, lastLine(stdout))
	require.NoError(t, err)
	assert.Len(t, v.Metrics["step_metrics"].(map[string]any)["loss"], 2)
}
