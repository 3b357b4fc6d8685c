package train

import "github.com/kilnrl/kiln/gpu"

// trainerDefaults are the trainer's defaults (gpu/kiln_gpu/defaults.json,
// docs/train.md §3) in plan.json's types: kiln-train's flags take them as
// their defaults, so the two sides never hold two literals.
type trainerDefaults struct {
	Loss        LossConfig      `json:"loss"`
	Optimizer   OptimizerConfig `json:"optimizer"`
	Temperature float64         `json:"temperature"`
}

// defaults decodes them; the file is built in, so an error is a bug that
// TestFlagDefaultsAreTheTrainers catches first.
func defaults() trainerDefaults {
	var d trainerDefaults
	if err := gpu.DecodeDefaults(&d); err != nil {
		panic(err)
	}
	return d
}
