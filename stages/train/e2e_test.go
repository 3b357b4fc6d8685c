package train

import (
	"context"
	"io"
	"testing"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/kilnrl/kiln/formats/dataset"
	"github.com/kilnrl/kiln/formats/records"
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

// Top-k heads through the stage into the real trainer: with
// --score-centering-path top-k the recorded heads (K ids a response token,
// full-vocabulary logprobs) become the spans, and the plan tells the
// trainer to read them as heads (docs/train-stage.md §5).
func TestRealTrainerTopK(t *testing.T) {
	if testing.Short() {
		t.Skip("trains a model on CPU")
	}
	ge := gputest.Find(t)
	w := newWorld(t)
	segs := fixture()
	const k = 2
	traj := put(t, w.st, "trajectories-topk", records.TrajectoriesKind(), nil, len(segs), func(wr io.Writer) error {
		enc, err := records.NewTrajectoryEncoder(wr, records.ArrowOptions{})
		if err != nil {
			return err
		}
		for _, s := range segs {
			var ids []int32
			var lps []float32
			for _, tok := range s.Tokens[len(s.Tokens)-int(s.ResponseLength):] {
				ids = append(ids, tok, tok+1)
				lps = append(lps, -2.5, -3.5)
			}
			tr := records.Trajectory{RolloutID: s.RolloutID, Index: s.RolloutID, Segment: s.Segment, Tokens: s.Tokens, ResponseLength: s.ResponseLength,
				LossMask: s.LossMask, RolloutLogProbs: s.RolloutLogProbs,
				Replay: records.Replay{TopKTokenIDs: ids, TopKLogProbs: lps, TopK: k}}
			if err := enc.Write(tr); err != nil {
				return err
			}
		}
		return enc.Close()
	})
	adv := putAdvantages(t, w.st, "advantages-topk", traj, segs)

	// The segments the stage reads carry the heads as K-wide spans.
	ctx := context.Background()
	tv, err := dataset.OpenString(ctx, w.st, traj.String())
	require.NoError(t, err)
	av, err := dataset.OpenString(ctx, w.st, adv.String())
	require.NoError(t, err)
	joined, _, err := ReadJoined(ctx, tv, av, true)
	require.NoError(t, err)
	for _, s := range joined {
		require.Len(t, s.TopPOffsets, int(s.ResponseLength)+1)
		assert.Equal(t, int32(k)*s.ResponseLength, s.TopPOffsets[s.ResponseLength])
		assert.Len(t, s.TopPIDs, k*int(s.ResponseLength))
	}

	tiny := ge.Tiny(t)
	stdout, stderr, code := w.run(t, "--python", ge.Python, "--gpu-dir", ge.Dir, "--trajectories", traj.String(), "--advantages", adv.String(),
		"--model", tiny, "--out", "tiny-topk", "--objective", "reinforce", "--score-centering", "--score-centering-path", "top-k", "--lr", "1e-4")
	require.Equal(t, 0, code, "stderr:\n%s", stderr)
	v, err := dataset.OpenString(ctx, w.st, lastLine(stdout))
	require.NoError(t, err)
	assert.Len(t, v.Metrics["step_metrics"].(map[string]any)["loss"], 2)

	_, _, code = w.run(t, "--python", ge.Python, "--gpu-dir", ge.Dir, "--trajectories", traj.String(), "--advantages", adv.String(),
		"--model", tiny, "--out", "tiny-topk", "--score-centering-path", "top-q")
	assert.Equal(t, 2, code)
}
