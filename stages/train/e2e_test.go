package train

import (
	"bytes"
	"context"
	"encoding/json"
	"io"
	"math"
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
	// --old-logprobs recompute (the default): step 1 trains with the
	// weights that define the old policy, so its ratio is 1 exactly; step 2
	// trains other rollouts with the weights step 1 moved, against old
	// logprobs from before step 1, so its ratio is not 1 (with old = sg(lp)
	// at every step it would be).
	kl := sm["ppo_kl"].([]any)
	assert.Zero(t, kl[0])
	assert.Zero(t, sm["pg_clipfrac"].([]any)[0])
	assert.NotZero(t, kl[1], "step 2's ppo_kl: the old policy must be the weights before step 1")

	// --old-logprobs rollout: the old policy is the sampler's. The
	// fixture's rollout logprobs (-0.5) are far above the tiny model's
	// (about -12), so old - lp = roll - lp > 0 on every trained token and
	// step 1's ppo_kl, the reduction of roll - lp, equals the reduction of
	// |lp - roll|, train_rollout_logprob_abs_diff (docs/train.md §3.3).
	stdout, stderr, code = w.run(t, args("--model", tiny, "--out", "tiny-ckpt-rollout-old", "--old-logprobs", "rollout")...)
	require.Equal(t, 0, code, "stderr:\n%s", stderr)
	vr, err := dataset.OpenString(ctx, w.st, lastLine(stdout))
	require.NoError(t, err)
	smr := vr.Metrics["step_metrics"].(map[string]any)
	klr, diff := smr["ppo_kl"].([]any)[0].(float64), smr["train_rollout_logprob_abs_diff"].([]any)[0].(float64)
	assert.Greater(t, diff, 5.0)
	assert.InEpsilon(t, diff, klr, 1e-9, "step 1 ppo_kl under --old-logprobs rollout")

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
	sm := v.Metrics["step_metrics"].(map[string]any)
	assert.Len(t, sm["loss"], 2)
	// every recorded nucleus has mass 0.9 + 0.1
	for i, m := range sm["sc_sampler_head_mass"].([]any) {
		assert.InDelta(t, 1, m, 1e-6, "step %d sc_sampler_head_mass", i)
	}
	checkSCMetrics(t, ge, tiny, segs, "top-p", sm)
}

// scReference computes step 1's score-centering metrics (docs/train.md
// §8.3, no correction, temperature 1, rollout reduction, G = 2) with the
// base model, per segment, from the formulas: independent of the
// trainer's packed path and of objectives.py. The input is the step's
// segments as JSON on stdin.
const scReference = `
import json, sys, torch
from transformers import AutoModelForCausalLM
d = json.load(sys.stdin)
m = AutoModelForCausalLM.from_pretrained(d["model"], dtype=torch.float64)
D = {}
for s in d["segments"]:
    D[s["rollout"]] = D.get(s["rollout"], 0) + sum(s["mask"])
out = {"sc_correction": 0.0, "sc_sampler_head_mass": 0.0, "sc_train_head_mass": 0.0}
with torch.no_grad():
    for s in d["segments"]:
        toks, n = s["tokens"], s["response_length"]
        lp_full = torch.log_softmax(m(input_ids=torch.tensor([toks])).logits[0, len(toks) - n - 1:-1], -1)
        for i in range(n):
            if not s["mask"][i]:
                continue
            ids = torch.tensor(s["ids"][i])
            q = torch.tensor(s["probs"][i], dtype=torch.float64)
            lp = lp_full[i, ids]
            if d["path"] == "top-p":
                lps = torch.log_softmax(lp, 0)
                c = float(((q / q.sum() - lps.exp()) * lps).sum())
            else:
                P, Q = float(lp.exp().sum()), float(q.sum())
                rho = max(1 - Q, 1e-6) / max(1 - P, 1e-6)
                c = float(((q - rho * lp.exp()) * lp).sum())
            k = 1.0 / D[s["rollout"]] / len(D)
            out["sc_correction"] += c * k
            out["sc_sampler_head_mass"] += float(q.sum()) * k
            out["sc_train_head_mass"] += float(lp.exp().sum()) * k
print(json.dumps(out))
`

// checkSCMetrics holds step 1's score-centering metrics of a real-trainer
// run on segs (the fixture's first two rollouts train step 1) to
// scReference, and checks each is a value a bug would move: the tiny
// model's head mass is far below the sampler's.
func checkSCMetrics(t *testing.T, ge gputest.Env, tiny string, segs []Segment, path string, sm map[string]any) {
	t.Helper()
	type row struct {
		Rollout        int64       `json:"rollout"`
		Tokens         []int32     `json:"tokens"`
		ResponseLength int32       `json:"response_length"`
		Mask           []int       `json:"mask"` // not []uint8, which JSON writes as base64
		IDs            [][]int32   `json:"ids"`
		Probs          [][]float64 `json:"probs"`
	}
	in := struct {
		Model    string `json:"model"`
		Path     string `json:"path"`
		Segments []row  `json:"segments"`
	}{Model: tiny, Path: path}
	step1 := map[int64]bool{}
	for _, s := range segs {
		if len(step1) < 2 || step1[s.RolloutID] {
			step1[s.RolloutID] = true
		} else {
			continue
		}
		r := row{Rollout: s.RolloutID, Tokens: s.Tokens, ResponseLength: s.ResponseLength}
		for _, m := range s.LossMask {
			r.Mask = append(r.Mask, int(m))
		}
		for i := 0; i < int(s.ResponseLength); i++ {
			var ids []int32
			var ps []float64
			for j := s.TopPOffsets[i]; j < s.TopPOffsets[i+1]; j++ {
				ids = append(ids, s.TopPIDs[j])
				ps = append(ps, float64(float32(math.Exp(float64(s.TopPLogProbs[j])))))
			}
			r.IDs, r.Probs = append(r.IDs, ids), append(r.Probs, ps)
		}
		in.Segments = append(in.Segments, r)
	}
	b, err := json.Marshal(in)
	require.NoError(t, err)
	cmd := ge.Command(context.Background(), "-c", scReference)
	cmd.Stdin = bytes.NewReader(b)
	var errb bytes.Buffer
	cmd.Stderr = &errb
	out, err := cmd.Output()
	require.NoError(t, err, "the SC reference: %s", errb.String())
	var want map[string]float64
	require.NoError(t, json.Unmarshal(out, &want))
	for k, v := range want {
		got, ok := sm[k].([]any)[0].(float64)
		require.True(t, ok, "step metric %s: %v", k, sm[k])
		assert.InDelta(t, v, got, 1e-5, "step 1 %s (%s)", k, path)
	}
	assert.Less(t, want["sc_train_head_mass"], 1e-2*want["sc_sampler_head_mass"])
	assert.NotZero(t, want["sc_correction"])
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
	sm := v.Metrics["step_metrics"].(map[string]any)
	assert.Len(t, sm["loss"], 2)
	// every head holds e^-2.5 + e^-3.5 of the sampler's mass
	q := float64(float32(math.Exp(-2.5))) + float64(float32(math.Exp(-3.5)))
	for i, m := range sm["sc_sampler_head_mass"].([]any) {
		assert.InDelta(t, q, m, 1e-6, "step %d sc_sampler_head_mass", i)
	}
	heads := make([]Segment, len(segs))
	for i, s := range segs {
		heads[i] = s
		heads[i].TopPOffsets, heads[i].TopPIDs, heads[i].TopPLogProbs = []int32{0}, nil, nil
		for _, tok := range s.Tokens[len(s.Tokens)-int(s.ResponseLength):] {
			heads[i].TopPIDs = append(heads[i].TopPIDs, tok, tok+1)
			heads[i].TopPLogProbs = append(heads[i].TopPLogProbs, -2.5, -3.5)
			heads[i].TopPOffsets = append(heads[i].TopPOffsets, int32(len(heads[i].TopPIDs)))
		}
	}
	checkSCMetrics(t, ge, tiny, heads, "top-k", sm)

	_, _, code = w.run(t, "--python", ge.Python, "--gpu-dir", ge.Dir, "--trajectories", traj.String(), "--advantages", adv.String(),
		"--model", tiny, "--out", "tiny-topk", "--score-centering-path", "top-q")
	assert.Equal(t, 2, code)
}
