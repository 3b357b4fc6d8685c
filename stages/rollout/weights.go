package rollout

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"math"
	"slices"
	"strconv"
	"strings"
	"sync"

	"github.com/kilnrl/kiln/formats/dataset"
	"github.com/kilnrl/kiln/formats/records"
	"github.com/kilnrl/kiln/formats/store"
	"github.com/kilnrl/kiln/internal/agent/engine"
	"github.com/kilnrl/kiln/internal/enginectl"
	"github.com/kilnrl/kiln/internal/stagecmd"
)

// The weights version is checked where it is used (docs/sync.md §5): a run
// stage given --weights REF asks every engine which weights number it
// serves before any sandbox boots, and aborts a run any of whose tokens an
// engine reports generated with another.

// pinnedWeights is the --weights version a run stage uses: its pinned
// reference and its weights number N (the manifest's weights_number,
// docs/sync.md §1.3), which is what an engine serving it reports as its
// weight_version.
type pinnedWeights struct {
	ref    dataset.Ref
	number int64
}

// openWeights opens the --weights version ref (pinned) and reads its
// weights number.
func openWeights(ctx context.Context, st store.Store, ref dataset.Ref) (*pinnedWeights, error) {
	v, err := dataset.OpenKind(ctx, st, ref, records.WeightsKind(), "--weights")
	if errors.Is(err, dataset.ErrKindMismatch) {
		return nil, fmt.Errorf("%w: pass a version kiln-sync published (kiln-sync publish --out NAME), or record what the engines serve with --weights-version", err)
	}
	if err != nil {
		return nil, err
	}
	n, ok := weightsNumber(v.Metrics["weights_number"])
	if !ok {
		return nil, stagecmd.BadInputf("--weights %s: its manifest has no weights number (metrics.weights_number is %v): publish the weights with kiln-sync, which numbers every version",
			v.Ref(), v.Metrics["weights_number"])
	}
	return &pinnedWeights{ref: v.Ref(), number: n}, nil
}

// weightsNumber reads a weights number as manifests hold one: a JSON
// number (float64 once decoded) that is a whole number ≥ 0, or its decimal
// string (as a run stage records it, see addMetrics).
func weightsNumber(v any) (int64, bool) {
	switch x := v.(type) {
	case float64:
		if x >= 0 && x == math.Trunc(x) && x < 1<<53 {
			return int64(x), true
		}
	case int64:
		return x, x >= 0
	case int:
		return int64(x), x >= 0
	case json.Number:
		n, err := x.Int64()
		return n, err == nil && n >= 0
	case string:
		n, err := strconv.ParseInt(x, 10, 64)
		return n, err == nil && n >= 0
	}
	return 0, false
}

// addMetrics adds the weights to a part's manifest metrics: "weights" the
// pinned reference and "weights_number" N as a decimal string. A string,
// because the dataset layer sums numeric metrics across the parts of a
// sharded run (dataset.Writer.Commit), and N must read the same from a
// version of any number of parts. Without --weights, metrics is returned
// as it is.
func (w *pinnedWeights) addMetrics(metrics map[string]any) map[string]any {
	if w == nil {
		return metrics
	}
	if metrics == nil {
		metrics = map[string]any{}
	}
	metrics["weights"] = w.ref.String()
	metrics["weights_number"] = strconv.FormatInt(w.number, 10)
	return metrics
}

// sameVersion reports whether an engine's weights version names number:
// the same decimal integer, or the same text.
func sameVersion(served string, number int64) bool {
	served = strings.TrimSpace(served)
	if n, err := strconv.ParseInt(served, 10, 64); err == nil {
		return n == number
	}
	return served == strconv.FormatInt(number, 10)
}

// checkServedWeights asks every engine (in parallel, each call with
// enginectl's deadline) which weights number it serves, and fails unless
// every one serves w's: an engine serving another, or none, is named
// with what it serves and what to do. Replay engines are not asked: their
// answers are a recording's.
func checkServedWeights(ctx context.Context, engines []string, w *pinnedWeights, o RunOptions) error {
	why := make([]string, len(engines))
	var wg sync.WaitGroup
	for i, url := range engines {
		wg.Add(1)
		go func() {
			defer wg.Done()
			served, err := enginectl.ServedVersion(ctx, url, enginectl.Options{Protocol: o.EngineProtocol, APIKey: o.EngineAPIKey})
			switch {
			case err != nil:
				why[i] = fmt.Sprintf("%s: cannot tell which weights it serves: %v", url, err)
			case !sameVersion(served, w.number):
				why[i] = fmt.Sprintf("%s serves weights number %s, not %d", url, served, w.number)
			}
		}()
	}
	wg.Wait()
	var bad []string
	for _, s := range why {
		if s != "" {
			bad = append(bad, s)
		}
	}
	if len(bad) == 0 {
		return nil
	}
	if err := ctx.Err(); err != nil {
		return err
	}
	return fmt.Errorf("--weights %s is weights number %d, but %d of %d engines do not serve it, so no run was started: %s; "+
		"make every engine serve it (kiln-sync reload --engine URL... --version %d --path DIR, after kiln-sync pull --weights %s --to DIR; or the combined kiln-sync) and rerun, "+
		"or pass --weights for the version they serve",
		w.ref, w.number, len(bad), len(engines), strings.Join(bad, "; "), w.number, w.ref)
}

// weightsChangedError is the cause of a run ended because a model call's
// tokens were generated with other weights than the run's --weights
// (abort weights_changed).
type weightsChangedError struct {
	turn int      // the session's model call, from 0
	seen []string // the versions its tokens report, each once, in order
	want *pinnedWeights
}

func (e *weightsChangedError) Error() string {
	return fmt.Sprintf("turn %d was generated with weights version %s, but the run asked for weights number %d (%s): an engine loaded other weights while the run went (a kiln-sync reload during the rollouts?)",
		e.turn, strings.Join(e.seen, ", "), e.want.number, e.want.ref)
}

// observeWeights is the engine clients' Observe when --weights is given:
// it numbers each session's generations and ends the session's run
// (weightsChangedError, the first one only) when any token's version is
// not the --weights number. A generation without weight versions (an
// engine that does not report them, docs/engine-wire.md §10.4) is not
// checked; one outside a session (the probe) is ignored.
func (f *front) observeWeights(req *engine.GenerateRequest, g *engine.Generation) {
	f.mu.Lock()
	defer f.mu.Unlock()
	s := f.sessions[req.SessionID]
	if s == nil || f.weights == nil {
		return
	}
	turn := s.calls
	s.calls++
	if s.weightsChanged || len(g.WeightVersions) == 0 {
		return
	}
	var seen []string
	changed := false
	for i, v := range g.WeightVersions {
		if i > 0 && v == g.WeightVersions[i-1] {
			continue // a run of one version, the common case
		}
		changed = changed || !sameVersion(v, f.weights.number)
		if !slices.Contains(seen, v) {
			seen = append(seen, v)
		}
	}
	if !changed {
		return
	}
	s.weightsChanged = true
	if s.abort != nil {
		s.abort(&weightsChangedError{turn: turn, seen: seen, want: f.weights})
	}
}
