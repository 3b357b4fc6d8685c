package gpu

import (
	"context"
	"encoding/json"
	"testing"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/kilnrl/kiln/internal/testenv/gputest"
)

// TestDecodeDefaults: defaults.json decodes into a value with its fields,
// and a value lacking one is refused (kiln-train's flags must know every
// default the trainer has).
func TestDecodeDefaults(t *testing.T) {
	var all map[string]any
	require.NoError(t, DecodeDefaults(&all))
	assert.Equal(t, 0.2, all["loss"].(map[string]any)["eps_clip"])
	var partial struct {
		Temperature float64 `json:"temperature"`
	}
	assert.ErrorContains(t, DecodeDefaults(&partial), `unknown field "loss"`)
}

// pythonDefaults prints, as JSON in defaults.json's shape, the defaults the
// trainer actually uses: an Objective built from a plan whose "loss" is
// empty, and the AdamW kiln_gpu.train builds from a plan's "optimizer"
// holding only the required lr and grad_clip.
const pythonDefaults = `
import json, torch
from kiln_gpu.batches import Plan
from kiln_gpu.train import build_optimizer, objective_from_plan
from kiln_gpu.defaults import DEFAULTS
plan = Plan.__new__(Plan)
plan.path, plan.loss, plan.temperature = "plan.json", {}, 1.0
o = objective_from_plan(plan)
b = o.base
opt = build_optimizer(torch.nn.Linear(1, 1), {"lr": DEFAULTS["optimizer"]["lr"], "grad_clip": DEFAULTS["optimizer"]["grad_clip"]}).defaults
print(json.dumps({
  "loss": {"objective": o.objective, "eps_clip": b.eps_clip, "eps_clip_high": b.eps_clip_high,
           "eps_clip_c": b.eps_clip_c, "correction": b.correction, "correction_low": b.correction_low,
           "correction_high": b.correction_high, "reduction": b.reduction, "kl_coef": o.kl_coef,
           "entropy_coef": o.entropy_coef, "score_centering": o.score_centering,
           "score_centering_path": o.sc_path, "old_logprobs": o.old_logprobs},
  "optimizer": {"lr": opt["lr"], "weight_decay": opt["weight_decay"], "betas": list(opt["betas"]),
                "eps": opt["eps"], "grad_clip": DEFAULTS["optimizer"]["grad_clip"]},
  "temperature": DEFAULTS["temperature"]}))
`

// TestPythonReadsTheSameDefaults: the trainer, given a plan that leaves
// every default out, uses exactly the values of the file kiln-train's
// flags default to (stages/train's TestFlagDefaultsAreTheTrainers), so the
// two sides cannot drift apart. Needs gpu/'s venv.
func TestPythonReadsTheSameDefaults(t *testing.T) {
	env := gputest.Find(t)
	out, err := env.Command(context.Background(), "-c", pythonDefaults).Output()
	require.NoError(t, err, "python: %s", out)
	var py, want map[string]any
	require.NoError(t, json.Unmarshal(out, &py), "%s", out)
	require.NoError(t, DecodeDefaults(&want))
	assert.Equal(t, want, py)
}
