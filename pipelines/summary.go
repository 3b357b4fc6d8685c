package pipelines

import (
	"context"
	"fmt"
	"time"

	"github.com/kilnrl/kiln/formats/dataset"
)

// Summary is one target's progress as data (kiln status --summary and
// --json): its state, its committed outputs with their manifests' metrics
// (whatever the stage put there: kiln-rollout's runs and aborts,
// kiln-grade's rewards, kiln-train's losses and weights...), its wall time
// from the record, and the failure of its last build. Nothing in it is
// stage-specific; a step's summary is the summaries of the targets whose
// Step is that step.
type Summary struct {
	Target string `json:"target"`
	// Step is the target's step index (-1: not a step target).
	Step int    `json:"step"`
	Done bool   `json:"done"`
	Why  string `json:"why"`
	Ref  string `json:"ref,omitempty"`
	// Outputs are the target's committed outputs, Ref last; nil for a
	// target that is not done or writes no dataset.
	Outputs []OutputSummary `json:"outputs,omitempty"`
	// Start, End and WallSeconds come from the recorded build of the
	// target's current key (zero when it is done by --print-version with
	// no record, or not done).
	Start       time.Time `json:"start,omitzero"`
	End         time.Time `json:"end,omitzero"`
	WallSeconds float64   `json:"wall_s,omitempty"`
	// Failure is the last build's failure when the target is not done.
	Failure *Failure `json:"failure,omitempty"`
}

// OutputSummary is one committed output: its ref, row count and the
// metrics its manifest carries.
type OutputSummary struct {
	Ref     string         `json:"ref"`
	Rows    int64          `json:"rows"`
	Metrics map[string]any `json:"metrics,omitempty"`
}

// Summary reads t's summary from the store: the manifests of its outputs
// (only with metrics; without, the record alone), its recorded build and
// its failure record.
func (p *Plan) Summary(ctx context.Context, t *Target, metrics bool) (*Summary, error) {
	s := &Summary{Target: t.Name, Step: t.Step, Done: t.Done, Why: t.Why, Ref: t.Ref}
	if !t.Done {
		f, err := p.LastFailure(ctx, t.Name)
		if err != nil {
			return nil, err
		}
		s.Failure = f
		return s, nil
	}
	e := t.recorded
	if e == nil && !t.Service {
		last, err := p.Last(ctx, t.Name)
		if err != nil {
			return nil, err
		}
		if last != nil && last.Ref == t.Ref && t.Ref != "" {
			e = last
		}
	}
	if e != nil {
		s.Start, s.End = e.Start, e.End
		s.WallSeconds = e.End.Sub(e.Start).Seconds()
	}
	if !metrics {
		return s, nil
	}
	for _, o := range t.Outputs {
		v, err := dataset.OpenString(ctx, p.opts.Store, o)
		if err != nil {
			return nil, fmt.Errorf("summary of %s: reading its output %s: %w", t.Name, o, err)
		}
		s.Outputs = append(s.Outputs, OutputSummary{Ref: o, Rows: v.Rows, Metrics: v.Metrics})
	}
	return s, nil
}
