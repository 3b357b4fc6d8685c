// Package gpu is what the Go side reads of gpu/'s PyTorch trainer: its
// defaults, defined once in kiln_gpu/defaults.json, which kiln-train's
// flags take as their defaults and the trainer (kiln_gpu/defaults.py)
// fills a plan's missing fields from (docs/train.md §3).
package gpu

import (
	"bytes"
	_ "embed"
	"encoding/json"
	"fmt"
)

//go:embed kiln_gpu/defaults.json
var defaultsJSON []byte

// Defaults are the trainer's defaults: plan.json's "loss" and "optimizer"
// fields (docs/train-stage.md §4) and the sampling temperature.
type Defaults struct {
	Loss struct {
		Objective          string   `json:"objective"`
		EpsClip            float64  `json:"eps_clip"`
		EpsClipHigh        *float64 `json:"eps_clip_high"`
		EpsClipC           *float64 `json:"eps_clip_c"`
		Correction         *string  `json:"correction"`
		CorrectionLow      float64  `json:"correction_low"`
		CorrectionHigh     float64  `json:"correction_high"`
		Reduction          string   `json:"reduction"`
		KLCoef             float64  `json:"kl_coef"`
		EntropyCoef        float64  `json:"entropy_coef"`
		ScoreCentering     bool     `json:"score_centering"`
		ScoreCenteringPath string   `json:"score_centering_path"`
		OldLogprobs        string   `json:"old_logprobs"`
	} `json:"loss"`
	Optimizer struct {
		LR          float64    `json:"lr"`
		WeightDecay float64    `json:"weight_decay"`
		Betas       [2]float64 `json:"betas"`
		Eps         float64    `json:"eps"`
		GradClip    float64    `json:"grad_clip"`
	} `json:"optimizer"`
	Temperature float64 `json:"temperature"`
}

// TrainDefaults decodes kiln_gpu/defaults.json as built in. Every field
// must be known on both sides: a field Go does not know panics here (the
// file is part of the binary, so TestDefaults catches it first).
func TrainDefaults() Defaults {
	var d Defaults
	dec := json.NewDecoder(bytes.NewReader(defaultsJSON))
	dec.DisallowUnknownFields()
	if err := dec.Decode(&d); err != nil {
		panic(fmt.Sprintf("gpu/kiln_gpu/defaults.json: %v", err))
	}
	return d
}
