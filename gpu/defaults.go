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

// DecodeDefaults decodes kiln_gpu/defaults.json, as built in, into v (plan.json's
// "loss" and "optimizer", docs/train-stage.md §4, and "temperature"),
// refusing a field v does not have.
func DecodeDefaults(v any) error {
	dec := json.NewDecoder(bytes.NewReader(defaultsJSON))
	dec.DisallowUnknownFields()
	if err := dec.Decode(v); err != nil {
		return fmt.Errorf("gpu/kiln_gpu/defaults.json: %w", err)
	}
	return nil
}
