package sync

import (
	"context"
	"fmt"
	"math"

	"github.com/kilnrl/kiln/formats/dataset"
	"github.com/kilnrl/kiln/formats/records"
	"github.com/kilnrl/kiln/formats/store"
	"github.com/kilnrl/kiln/internal/stagecmd"
)

// Manifest metric keys of a weights version (docs/sync.md §1.3).
const (
	metricNumber          = "weights_number"
	metricFull            = "full"
	metricFullReason      = "full_reason"
	metricBase            = "base"
	metricBaseNumber      = "base_number"
	metricDeltasSinceFull = "deltas_since_full"
	metricEncoding        = "encoding"
	metricTensors         = "tensors"
	metricChangedTensors  = "changed_tensors"
	metricTotalBytes      = "total_bytes"
	metricChangedBytes    = "changed_bytes"
	metricStoredBytes     = "stored_bytes"
	metricDensity         = "density"
	metricSource          = "source"
	metricGeneratedWith   = "generated_with_weights"
)

// weightsVersion is one committed weights version, read whole: what its
// manifest says about its place in the chain, and every row.
type weightsVersion struct {
	Ref        dataset.Ref
	V          *dataset.Version
	Number     int64
	Full       bool
	FullReason string
	// Base is the version id this delta applies to ("" for a full
	// version), BaseNumber its weights number.
	Base            string
	BaseNumber      int64
	DeltasSinceFull int
	// Entries are the version's rows in order (docs/records.md §12).
	Entries []records.WeightsEntry
}

// openWeights reads the weights version ref names (pinned: a bare name is
// resolved by the caller, who must say which version it means). A missing
// version satisfies dataset.ErrNotFound (exit 3); a version of another
// kind is a usage error naming it; a manifest whose weights metrics are
// missing or malformed, or rows that fail their checks, satisfy
// dataset.ErrCorrupt (exit 4).
func openWeights(ctx context.Context, st store.Store, ref dataset.Ref) (*weightsVersion, error) {
	if !ref.Pinned() {
		return nil, fmt.Errorf("weights %q: not pinned to a version (name@version)", ref.String())
	}
	v, err := dataset.Open(ctx, st, ref)
	if err != nil {
		return nil, err
	}
	if k := v.Kind().Name; k != records.WeightsKind().Name {
		return nil, stagecmd.Usagef("%s holds %s records, not weights: name a version kiln-sync publish committed", v.Ref(), k)
	}
	w := &weightsVersion{Ref: v.Ref(), V: v}
	corrupt := func(format string, args ...any) error {
		return fmt.Errorf("weights %s: manifest metrics: %s: %w", ref, fmt.Sprintf(format, args...), dataset.ErrCorrupt)
	}
	m := v.Metrics
	num := func(key string) (int64, error) {
		f, ok := m[key].(float64)
		if !ok || f < 0 || f != math.Trunc(f) || f > 1<<53 {
			return 0, corrupt("%s is %v, want a whole number ≥ 0", key, m[key])
		}
		return int64(f), nil
	}
	if w.Number, err = num(metricNumber); err != nil {
		return nil, err
	}
	if w.Number < 1 {
		return nil, corrupt("%s is %d, want ≥ 1", metricNumber, w.Number)
	}
	full, ok := m[metricFull].(bool)
	if !ok {
		return nil, corrupt("%s is %v, want a bool", metricFull, m[metricFull])
	}
	w.Full = full
	w.FullReason, _ = m[metricFullReason].(string)
	w.Base, _ = m[metricBase].(string)
	if w.BaseNumber, err = num(metricBaseNumber); err != nil {
		return nil, err
	}
	dsf, err := num(metricDeltasSinceFull)
	if err != nil {
		return nil, err
	}
	w.DeltasSinceFull = int(dsf)
	switch {
	case full && (w.Base != "" || w.BaseNumber != 0 || w.DeltasSinceFull != 0):
		return nil, corrupt("a full version with base %q, base_number %d, deltas_since_full %d", w.Base, w.BaseNumber, w.DeltasSinceFull)
	case !full && (w.Base == "" || w.BaseNumber < 1 || w.BaseNumber >= w.Number || w.DeltasSinceFull < 1):
		return nil, corrupt("a delta with base %q, base_number %d (its number %d), deltas_since_full %d", w.Base, w.BaseNumber, w.Number, w.DeltasSinceFull)
	}
	err = v.EachShard(ctx, func(_ int, data []byte) error {
		// EachShard has checked the shard's sha256: a row that fails to
		// decode was written wrong, not damaged on the way.
		if err := records.EachWeightsEntry(data, func(e records.WeightsEntry) error {
			w.Entries = append(w.Entries, e)
			return nil
		}); err != nil {
			return fmt.Errorf("%w: %w", err, dataset.ErrCorrupt)
		}
		return nil
	})
	if err != nil {
		return nil, fmt.Errorf("weights %s: rows: %w", ref, err)
	}
	if err := w.checkRows(); err != nil {
		return nil, fmt.Errorf("weights %s: rows: %w: %w", ref, err, dataset.ErrCorrupt)
	}
	return w, nil
}

// checkRows checks what the record kind cannot: rows in their order (by
// file, files before tensors, then offset), each tensor's file present as
// a file row, no name twice, and a full version storing everything whole.
func (w *weightsVersion) checkRows() error {
	files := map[string]bool{}
	tensors := map[string]bool{}
	for i := range w.Entries {
		e := &w.Entries[i]
		if i > 0 && !entryLess(&w.Entries[i-1], e) {
			return fmt.Errorf("row %d (%s %q) is out of order", i, e.Entry, e.Name)
		}
		switch e.Entry {
		case records.EntryFile:
			if files[e.Name] {
				return fmt.Errorf("file %q listed twice", e.Name)
			}
			files[e.Name] = true
		case records.EntryTensor:
			if !files[e.File] {
				return fmt.Errorf("tensor %q lives in %q, which has no file row", e.Name, e.File)
			}
			if tensors[e.Name] {
				return fmt.Errorf("tensor %q listed twice", e.Name)
			}
			tensors[e.Name] = true
		}
		if w.Full && e.Encoding != records.EncStored {
			return fmt.Errorf("a full version's %s %q has encoding %q", e.Entry, e.Name, e.Encoding)
		}
	}
	return nil
}

// entryLess is the rows' order (docs/records.md §12): by file, then the
// file's own row before its tensors, then tensors by offset.
func entryLess(a, b *records.WeightsEntry) bool {
	if a.File != b.File {
		return a.File < b.File
	}
	if a.Entry != b.Entry {
		return a.Entry == records.EntryFile
	}
	return a.Offset < b.Offset
}

// tensors indexes the version's tensor rows by name.
func (w *weightsVersion) tensors() map[string]*records.WeightsEntry {
	out := map[string]*records.WeightsEntry{}
	for i := range w.Entries {
		if e := &w.Entries[i]; e.Entry == records.EntryTensor {
			out[e.Name] = e
		}
	}
	return out
}

// files indexes the version's file rows by path.
func (w *weightsVersion) files() map[string]*records.WeightsEntry {
	out := map[string]*records.WeightsEntry{}
	for i := range w.Entries {
		if e := &w.Entries[i]; e.Entry == records.EntryFile {
			out[e.Name] = e
		}
	}
	return out
}
