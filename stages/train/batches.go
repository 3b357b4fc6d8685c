package train

import (
	"bytes"
	"encoding/json"
	"fmt"
	"math"
	"os"
	"path/filepath"
	"strconv"
)

// PlanFormat tags plan.json (docs/train-stage.md §4).
const PlanFormat = "kiln-train-plan/1"

// LossConfig is plan.json's "loss" (docs/train.md §3; docs/train-stage.md §4).
type LossConfig struct {
	Objective      string   `json:"objective"`
	EpsClip        float64  `json:"eps_clip"`
	EpsClipHigh    *float64 `json:"eps_clip_high"`
	EpsClipC       *float64 `json:"eps_clip_c"`
	Correction     *string  `json:"correction"`
	CorrectionLow  float64  `json:"correction_low"`
	CorrectionHigh float64  `json:"correction_high"`
	Reduction      string   `json:"reduction"`
	KLCoef         float64  `json:"kl_coef"`
	EntropyCoef    float64  `json:"entropy_coef"`
	ScoreCentering bool     `json:"score_centering"`
	// ScoreCenteringPath is "top-k" when the spans are the recorded top-k
	// heads (docs/train-stage.md §5); left out, the trainer reads them as
	// top-p nuclei.
	ScoreCenteringPath string `json:"score_centering_path,omitempty"`
	// OldLogprobs is PPO's old policy (docs/train.md §13): "recompute"
	// (the trainer's logprobs with the weights before the run's first
	// optimizer step) or "rollout" (the sampler's). It changes the result,
	// so it is part of the version id with the rest of the loss.
	OldLogprobs string `json:"old_logprobs"`
}

// OptimizerConfig is plan.json's "optimizer": AdamW with gradient clipping.
type OptimizerConfig struct {
	LR          float64    `json:"lr"`
	WeightDecay float64    `json:"weight_decay"`
	Betas       [2]float64 `json:"betas"`
	Eps         float64    `json:"eps"`
	GradClip    float64    `json:"grad_clip"`
}

// PlanStep is one optimizer step of plan.json.
type PlanStep struct {
	Index         int      `json:"index"`
	Rollouts      int      `json:"rollouts"`
	Segments      int      `json:"segments"`
	Tokens        int64    `json:"tokens"`
	TrainedTokens int64    `json:"trained_tokens"`
	Divisor       float64  `json:"divisor"`
	MicroBatches  []string `json:"micro_batches"`
}

// Plan is plan.json: everything the trainer needs besides the micro-batch
// files it names (docs/train-stage.md §4).
type Plan struct {
	Format          string          `json:"format"`
	Model           string          `json:"model"`
	ResumeFrom      *string         `json:"resume_from"`
	Out             string          `json:"out"`
	Seed            int64           `json:"seed"`
	Temperature     float64         `json:"temperature"`
	GlobalBatchSize int             `json:"global_batch_size"`
	Loss            LossConfig      `json:"loss"`
	Optimizer       OptimizerConfig `json:"optimizer"`
	Steps           []PlanStep      `json:"steps"`
	DroppedRollouts int             `json:"dropped_rollouts"`
	// Dtype is the trainer's compute dtype, an optional field
	// (docs/train.md §9); omitted: float32.
	Dtype string `json:"dtype,omitempty"`
}

// Batching says how segments become steps and micro-batches.
type Batching struct {
	GlobalBatchSize int
	MaxTokens       int // per micro-batch; <= 0: one micro-batch per step
	Packing         Packing
	Reduction       Reduction
	// Epochs is how many times the steps run, in the same order (PPO
	// epochs); <= 1: once.
	Epochs int
	// MaxContext is the model's context (max_position_embeddings); a
	// segment longer is an error. 0: unchecked.
	MaxContext int
}

// Layout is the packed schedule: per step, its micro-batches as indices
// into the segments, and the step's divisor.
type Layout struct {
	Steps   []Step
	MBs     [][][]int // [step][micro-batch] -> segment indices
	Dropped int
}

// BuildLayout schedules and packs segs (docs/train-stage.md §3).
func BuildLayout(segs []Segment, b Batching) (*Layout, error) {
	if b.MaxContext > 0 {
		for i := range segs {
			if n := len(segs[i].Tokens); n > b.MaxContext {
				return nil, fmt.Errorf("rollout %d segment %d has %d tokens, more than the model's context of %d (max_position_embeddings): drop it upstream (kiln-advantages --drop-truncated, or a shorter --max-context at rollout) or train a model with a longer context",
					segs[i].RolloutID, segs[i].Segment, n, b.MaxContext)
			}
		}
	}
	steps, dropped, err := Schedule(segs, b.GlobalBatchSize)
	if err != nil {
		return nil, err
	}
	l := &Layout{Steps: steps, Dropped: dropped}
	for _, st := range steps {
		lengths := make([]int, len(st.Segments))
		for j, i := range st.Segments {
			lengths[j] = len(segs[i].Tokens)
		}
		var mbs [][]int
		for _, bin := range Pack(lengths, b.MaxTokens, b.Packing) {
			mb := make([]int, len(bin))
			for k, j := range bin {
				mb[k] = st.Segments[j]
			}
			mbs = append(mbs, mb)
		}
		l.MBs = append(l.MBs, mbs)
	}
	return l, nil
}

// mbPath is the plan-relative path of a micro-batch file.
func mbPath(step, mb int) string { return fmt.Sprintf("step-%05d/mb-%05d.safetensors", step, mb) }

// FillSteps sets p.Steps from the layout (file names, counts, divisors).
func (p *Plan) FillSteps(segs []Segment, l *Layout, r Reduction) {
	p.Steps = make([]PlanStep, len(l.Steps))
	p.DroppedRollouts = l.Dropped
	for s, st := range l.Steps {
		_, div := Denominators(segs, st, r)
		ps := PlanStep{Index: s, Rollouts: len(st.Rollouts), Segments: len(st.Segments), Divisor: div, MicroBatches: []string{}}
		for _, i := range st.Segments {
			ps.Tokens += int64(len(segs[i].Tokens))
			ps.TrainedTokens += segs[i].Trained()
		}
		for m := range l.MBs[s] {
			ps.MicroBatches = append(ps.MicroBatches, mbPath(s, m))
		}
		p.Steps[s] = ps
	}
}

// RepeatEpochs makes the plan run its steps n times in the same order
// (PPO epochs, docs/train-stage.md §4): the copies name the same
// micro-batch files, with indices continuing after the last step's.
func (p *Plan) RepeatEpochs(n int) {
	one := len(p.Steps)
	for e := 1; e < n; e++ {
		for _, st := range p.Steps[:one] {
			st.Index += e * one
			p.Steps = append(p.Steps, st)
		}
	}
}

// MarshalPlan is plan.json's bytes: indented, ending in a newline.
func MarshalPlan(p *Plan) ([]byte, error) {
	var buf bytes.Buffer
	enc := json.NewEncoder(&buf)
	enc.SetEscapeHTML(false)
	enc.SetIndent("", "  ")
	if err := enc.Encode(p); err != nil {
		return nil, err
	}
	return buf.Bytes(), nil
}

// MicroBatchTensors are the tensors of one micro-batch (docs/train-stage.md
// §5): the segments mb (indices into segs) of step st.
func MicroBatchTensors(segs []Segment, st Step, mb []int, r Reduction) []Tensor {
	pos := make(map[int64]int32, len(st.Rollouts))
	for k, id := range st.Rollouts {
		pos[id] = int32(k)
	}
	stepDenom, _ := Denominators(segs, st, r)
	denomOf := make(map[int]float32, len(st.Segments))
	for j, i := range st.Segments {
		denomOf[i] = stepDenom[j]
	}
	var T, R, P int
	topP := len(mb) > 0 && segs[mb[0]].TopPOffsets != nil
	probs := topP && segs[mb[0]].TopPLogProbs != nil
	for _, i := range mb {
		T += len(segs[i].Tokens)
		R += int(segs[i].ResponseLength)
		P += len(segs[i].TopPIDs)
	}
	tokens := make([]int32, 0, T)
	offsets := make([]int64, 1, len(mb)+1)
	rl := make([]int32, 0, len(mb))
	mask := make([]uint8, 0, R)
	lps := make([]float32, 0, R)
	adv := make([]float32, 0, R)
	denom := make([]float32, 0, len(mb))
	ridx := make([]int32, 0, len(mb))
	var tpOff []int64
	var tpIDs []int32
	var tpProbs []float32
	if topP {
		tpOff = make([]int64, 1, R+1)
		tpIDs = make([]int32, 0, P)
		if probs {
			tpProbs = make([]float32, 0, P)
		}
	}
	for _, i := range mb {
		s := &segs[i]
		tokens = append(tokens, s.Tokens...)
		offsets = append(offsets, int64(len(tokens)))
		rl = append(rl, s.ResponseLength)
		mask = append(mask, s.LossMask...)
		lps = append(lps, s.RolloutLogProbs...)
		a := float32(s.Advantage)
		for range s.ResponseLength {
			adv = append(adv, a)
		}
		denom = append(denom, denomOf[i])
		ridx = append(ridx, pos[s.RolloutID])
		if topP {
			base := int64(len(tpIDs))
			for _, o := range s.TopPOffsets[1:] {
				tpOff = append(tpOff, base+int64(o))
			}
			tpIDs = append(tpIDs, s.TopPIDs...)
			for _, lp := range s.TopPLogProbs {
				tpProbs = append(tpProbs, float32(math.Exp(float64(lp))))
			}
		}
	}
	out := []Tensor{
		{"tokens", tokens}, {"seq_offsets", offsets}, {"response_lengths", rl}, {"loss_mask", mask},
		{"rollout_logprobs", lps}, {"advantages", adv}, {"denominators", denom}, {"rollout_index", ridx},
	}
	if topP {
		out = append(out, Tensor{"top_p_offsets", tpOff}, Tensor{"top_p_ids", tpIDs})
		if probs {
			out = append(out, Tensor{"top_p_probs", tpProbs})
		}
	}
	return out
}

// WriteBatches writes plan.json and every micro-batch file into dir.
func WriteBatches(dir string, p *Plan, segs []Segment, l *Layout, r Reduction) error {
	for s, st := range l.Steps {
		if err := os.MkdirAll(filepath.Join(dir, fmt.Sprintf("step-%05d", s)), 0o755); err != nil {
			return err
		}
		for m, mb := range l.MBs[s] {
			meta := map[string]string{"format": "kiln-train-mb/1", "step": strconv.Itoa(s), "micro_batch": strconv.Itoa(m)}
			if err := writeSafetensorsFile(filepath.Join(dir, mbPath(s, m)), MicroBatchTensors(segs, st, mb, r), meta); err != nil {
				return err
			}
		}
	}
	b, err := MarshalPlan(p)
	if err != nil {
		return err
	}
	return os.WriteFile(filepath.Join(dir, "plan.json"), b, 0o644)
}
