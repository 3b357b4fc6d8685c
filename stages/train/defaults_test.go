package train

import (
	"testing"

	"github.com/stretchr/testify/assert"
	"github.com/urfave/cli/v2"
)

// TestFlagDefaultsAreTheTrainers: each loss and optimizer flag defaults to
// the trainer's own default (gpu/kiln_gpu/defaults.json, which
// gpu's TestPythonReadsTheSameDefaults checks the trainer reads), never to a
// second literal.
func TestFlagDefaultsAreTheTrainers(t *testing.T) {
	d := defaults()
	want := map[string]any{
		"objective": d.Loss.Objective, "eps-clip": d.Loss.EpsClip, "old-logprobs": d.Loss.OldLogprobs,
		"correction": "none", "correction-low": d.Loss.CorrectionLow, "correction-high": d.Loss.CorrectionHigh,
		"reduction": d.Loss.Reduction, "kl-coef": d.Loss.KLCoef, "entropy-coef": d.Loss.EntropyCoef,
		"score-centering-path": d.Loss.ScoreCenteringPath, "lr": d.Optimizer.LR,
		"weight-decay": d.Optimizer.WeightDecay, "grad-clip": d.Optimizer.GradClip, "temperature": d.Temperature,
	}
	assert.Nil(t, d.Loss.Correction, "defaults.json's correction: the flag's default is none")
	seen := 0
	for _, f := range new(Flags).Flags() {
		name := f.Names()[0]
		w, ok := want[name]
		if !ok {
			continue
		}
		seen++
		var got any
		switch f := f.(type) {
		case *cli.StringFlag:
			got = f.Value
		case *cli.Float64Flag:
			got = f.Value
		}
		assert.Equal(t, w, got, "--%s", name)
	}
	assert.Equal(t, len(want), seen, "every defaulted loss and optimizer flag exists")
}
