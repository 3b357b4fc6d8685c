package train

import (
	"bytes"
	"flag"
	"os"
	"os/exec"
	"path/filepath"
	"testing"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/kilnrl/kiln/internal/testenv/gputest"
)

var update = flag.Bool("update", false, "rewrite the golden files")

// fixture is a small plan input: 5 rollouts, one with three segments, one
// over the cap, top-p replay data on every segment.
func fixture() []Segment {
	segs := []Segment{seg(10, 0, 6, 3, 2), seg(11, 0, 5, 2, 2), seg(10, 1, 4, 2, 1), seg(12, 0, 12, 4, 3), seg(10, 2, 3, 1, 1), seg(13, 0, 4, 2, 1), seg(14, 0, 5, 3, 3)}
	for i := range segs {
		s := &segs[i]
		s.TopPOffsets = make([]int32, s.ResponseLength+1)
		for r := 0; r < int(s.ResponseLength); r++ {
			n := int32(r%2 + 1) // 1 or 2 candidates a row
			s.TopPOffsets[r+1] = s.TopPOffsets[r] + n
			for k := int32(0); k < n; k++ {
				s.TopPIDs = append(s.TopPIDs, 1000*int32(i)+int32(r)*10+k)
				s.TopPLogProbs = append(s.TopPLogProbs, -0.25*float32(k+1))
			}
		}
	}
	return withD(segs)
}

func fixturePlan(t *testing.T, dir string) (*Plan, []Segment, *Layout) {
	segs := fixture()
	l, err := BuildLayout(segs, Batching{GlobalBatchSize: 2, MaxTokens: 10, Packing: FirstFitDecreasing, Reduction: ReduceRollout, MaxContext: 4096})
	require.NoError(t, err)
	high := 0.28
	p := &Plan{Format: PlanFormat, Model: "/models/base", Out: filepath.Join(dir, "out"), Seed: 7, Temperature: 0.6, GlobalBatchSize: 2,
		Loss:      LossConfig{Objective: "ppo", EpsClip: 0.2, EpsClipHigh: &high, CorrectionLow: 0, CorrectionHigh: 2, Reduction: "rollout", OldLogprobs: "recompute"},
		Optimizer: OptimizerConfig{LR: 1e-6, Betas: [2]float64{0.9, 0.999}, Eps: 1e-8, GradClip: 1}}
	p.FillSteps(segs, l, ReduceRollout)
	return p, segs, l
}

// The plan of the fixture, byte for byte (testdata/plan.golden.json; -update
// rewrites it).
func TestPlanGolden(t *testing.T) {
	p, _, _ := fixturePlan(t, "/work")
	got, err := MarshalPlan(p)
	require.NoError(t, err)
	golden := filepath.Join("testdata", "plan.golden.json")
	if *update {
		require.NoError(t, os.WriteFile(golden, got, 0o644))
	}
	want, err := os.ReadFile(golden)
	require.NoError(t, err)
	assert.Equal(t, string(want), string(got))
}

// Every micro-batch of the fixture read back (Go reader): the tensors of
// docs/train-stage.md §5.
func TestMicroBatchTensors(t *testing.T) {
	dir := t.TempDir()
	p, segs, l := fixturePlan(t, dir)
	require.NoError(t, WriteBatches(dir, p, segs, l, ReduceRollout))
	// Step 0 holds rollouts 10 and 11 (segments 0, 1, 2, 4); step 1
	// rollouts 12 and 13; rollout 14 is dropped.
	assert.Equal(t, 1, p.DroppedRollouts)
	require.Len(t, p.Steps, 2)
	seen := 0
	for s, ps := range p.Steps {
		for _, mb := range ps.MicroBatches {
			data, err := os.ReadFile(filepath.Join(dir, mb))
			require.NoError(t, err)
			ts, meta, err := ReadSafetensors(data)
			require.NoError(t, err)
			assert.Equal(t, "kiln-train-mb/1", meta["format"])
			off := ts["seq_offsets"].([]int64)
			rl := ts["response_lengths"].([]int32)
			toks := ts["tokens"].([]int32)
			mask := ts["loss_mask"].([]uint8)
			adv := ts["advantages"].([]float32)
			den := ts["denominators"].([]float32)
			ridx := ts["rollout_index"].([]int32)
			tpo := ts["top_p_offsets"].([]int64)
			tpi := ts["top_p_ids"].([]int32)
			tpp := ts["top_p_probs"].([]float32)
			require.Len(t, off, len(rl)+1)
			assert.Equal(t, int64(len(toks)), off[len(off)-1])
			r := 0
			for k := range rl {
				// Find the segment by its first token (100*rollout + 0).
				first := toks[off[k]]
				var sg *Segment
				for i := range segs {
					if segs[i].Tokens[0] == first && int64(len(segs[i].Tokens)) == off[k+1]-off[k] {
						sg = &segs[i]
					}
				}
				require.NotNil(t, sg)
				seen++
				assert.Equal(t, sg.Tokens, toks[off[k]:off[k+1]])
				assert.Equal(t, sg.ResponseLength, rl[k])
				assert.Equal(t, sg.LossMask, mask[r:r+int(rl[k])])
				for j := 0; j < int(rl[k]); j++ {
					assert.Equal(t, float32(sg.Advantage), adv[r+j])
				}
				assert.Equal(t, float32(sg.RolloutTrainedTokens), den[k])
				assert.Equal(t, sg.RolloutID, l.Steps[s].Rollouts[ridx[k]])
				for j := 0; j < int(rl[k]); j++ {
					lo, hi := tpo[r+j], tpo[r+j+1]
					assert.Equal(t, sg.TopPIDs[sg.TopPOffsets[j]:sg.TopPOffsets[j+1]], tpi[lo:hi])
				}
				r += int(rl[k])
			}
			assert.Len(t, mask, r)
			assert.Len(t, tpo, r+1)
			assert.Len(t, tpp, len(tpi))
			assert.InDelta(t, 0.7788008, tpp[0], 1e-6) // exp(-0.25)
		}
	}
	assert.Equal(t, 6, seen)
}

// A top-p micro-batch of a single response token: its top_p_offsets
// slice is made with capacity R+1 = 2 (a mutation survivor R-1 made it
// 0, less than its length 1, which panics only here).
func TestMicroBatchTensorsTopPOneResponseToken(t *testing.T) {
	segs := []Segment{{RolloutID: 7, Tokens: []int32{5, 6, 9}, ResponseLength: 1, LossMask: []uint8{1},
		RolloutLogProbs: []float32{-0.5}, Advantage: 1.5, RolloutTrainedTokens: 1,
		TopPOffsets: []int32{0, 2}, TopPIDs: []int32{9, 4}, TopPLogProbs: []float32{-0.25, -1.5}}}
	st := Step{Rollouts: []int64{7}, Segments: []int{0}}
	var ts []Tensor
	require.NotPanics(t, func() { ts = MicroBatchTensors(segs, st, []int{0}, ReduceRollout) })
	got := map[string]any{}
	var names []string
	for _, x := range ts {
		got[x.Name] = x.Data
		names = append(names, x.Name)
	}
	assert.Equal(t, []string{"tokens", "seq_offsets", "response_lengths", "loss_mask", "rollout_logprobs", "advantages",
		"denominators", "rollout_index", "top_p_offsets", "top_p_ids", "top_p_probs"}, names)
	assert.Equal(t, []int32{5, 6, 9}, got["tokens"])
	assert.Equal(t, []int64{0, 3}, got["seq_offsets"])
	assert.Equal(t, []int32{1}, got["response_lengths"])
	assert.Equal(t, []uint8{1}, got["loss_mask"])
	assert.Equal(t, []float32{-0.5}, got["rollout_logprobs"])
	assert.Equal(t, []float32{1.5}, got["advantages"])
	assert.Equal(t, []float32{1}, got["denominators"])
	assert.Equal(t, []int32{0}, got["rollout_index"])
	assert.Equal(t, []int64{0, 2}, got["top_p_offsets"])
	assert.Equal(t, []int32{9, 4}, got["top_p_ids"])
	assert.InDeltaSlice(t, []float32{0.7788008, 0.22313017}, got["top_p_probs"], 1e-6) // exp(-0.25), exp(-1.5)
}

// The Python safetensors library (the gpu venv's) reads the files as the
// Go reader does: same names, dtypes, shapes and values.
func TestSafetensorsPython(t *testing.T) {
	py := gputest.Find(t).Python
	dir := t.TempDir()
	tensors := []Tensor{
		{"tokens", []int32{1, -2, 151643}}, {"seq_offsets", []int64{0, 3, 1 << 40}},
		{"loss_mask", []uint8{0, 1, 1}}, {"rollout_logprobs", []float32{-0.5, -1e-7, -20}},
		{"empty", []int32{}},
	}
	path := filepath.Join(dir, "mb.safetensors")
	require.NoError(t, writeSafetensorsFile(path, tensors, map[string]string{"format": "kiln-train-mb/1"}))
	script := `
import json, sys
from safetensors.numpy import load_file
from safetensors import safe_open
t = load_file(sys.argv[1])
with safe_open(sys.argv[1], "np") as f:
    meta = f.metadata()
print(json.dumps({"meta": meta, "t": {k: [str(v.dtype), list(v.shape), v.tolist()] for k, v in sorted(t.items())}}))
`
	out, err := exec.Command(py, "-c", script, path).CombinedOutput()
	require.NoError(t, err, "%s", out)
	assert.JSONEq(t, `{"meta":{"format":"kiln-train-mb/1"},"t":{
		"empty":["int32",[0],[]],
		"loss_mask":["uint8",[3],[0,1,1]],
		"rollout_logprobs":["float32",[3],[-0.5,-1.0000000116860974e-07,-20.0]],
		"seq_offsets":["int64",[3],[0,3,1099511627776]],
		"tokens":["int32",[3],[1,-2,151643]]}}`, string(bytes.TrimSpace(out)))

	// A whole micro-batch of the fixture, loaded by Python, matches the Go reader.
	p, segs, l := fixturePlan(t, dir)
	require.NoError(t, WriteBatches(dir, p, segs, l, ReduceRollout))
	mb := filepath.Join(dir, p.Steps[0].MicroBatches[0])
	out, err = exec.Command(py, "-c", `
import json, sys
from safetensors.numpy import load_file
print(json.dumps({k: v.tolist() for k, v in load_file(sys.argv[1]).items()}))`, mb).CombinedOutput()
	require.NoError(t, err, "%s", out)
	data, err := os.ReadFile(mb)
	require.NoError(t, err)
	ts, _, err := ReadSafetensors(data)
	require.NoError(t, err)
	var fromPy map[string][]float64
	require.NoError(t, jsonUnmarshal(out, &fromPy))
	assert.Len(t, fromPy, len(ts))
	for name, v := range ts {
		assert.Equal(t, asFloats(v), fromPy[name], name)
	}
}
