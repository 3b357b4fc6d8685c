package stagecmd

import (
	"context"
	"fmt"
	"io"
	"log/slog"

	"github.com/kilnrl/kiln/formats/dataset"
	"github.com/kilnrl/kiln/formats/records"
	"github.com/kilnrl/kiln/formats/store"
)

// Output describes the version a writing command produces.
type Output struct {
	Name     string
	Kind     records.Kind
	Identity dataset.Identity
	Part     dataset.Part
	// PrintVersion: print the reference and do nothing else.
	PrintVersion bool
	Hook         func(point string)
	// LatestIf, if set, is dataset.Spec.LatestIf: the latest pointer
	// moves to the version only if it accepts the pointer as it stands.
	LatestIf func(ctx context.Context, cur *dataset.Latest) (bool, error)
}

// Produce writes the part's shards through w and returns stage metrics.
// It must skip rows for which w.Done reports true when it uses row keys.
type Produce func(ctx context.Context, w *dataset.Writer) (metrics map[string]any, err error)

// Write runs the write-a-version flow shared by every writing command, on
// the same code path whether or not it only prints the version: compute
// the version id; stop there for --print-version; if that version is
// already committed, only move the dataset's latest pointer to it;
// otherwise produce this part and commit (which moves the pointer too).
// The reference is always the last line written to stdout.
func Write(ctx context.Context, st store.Store, out Output, stdout io.Writer, log *slog.Logger, produce Produce) (dataset.Result, error) {
	if err := dataset.CheckName(out.Name); err != nil {
		return dataset.Result{}, UsageError{err}
	}
	spec := dataset.Spec{Name: out.Name, Kind: out.Kind, Identity: out.Identity, Part: out.Part, Build: Build(), Hook: out.Hook, LatestIf: out.LatestIf}
	if out.PrintVersion {
		version, err := spec.Identity.Version()
		if err != nil {
			return dataset.Result{}, err
		}
		ref := dataset.Ref{Name: out.Name, Version: version}
		fmt.Fprintln(stdout, ref)
		return dataset.Result{Ref: ref}, nil
	}
	w, err := dataset.NewWriter(ctx, st, spec)
	if err != nil {
		return dataset.Result{}, err
	}
	var metrics map[string]any
	switch {
	case w.Existing() != nil:
		log.Info("already committed; nothing to compute (latest moves to it)", "ref", w.Ref().String())
	case w.PartDone():
		log.Info("part already written by an earlier attempt", "ref", w.Ref().String(), "part", out.Part.String())
	default:
		if n := w.Resumed(); n > 0 {
			log.Info("resuming", "ref", w.Ref().String(), "part", out.Part.String(), "rows_done", n)
		}
		if metrics, err = produce(ctx, w); err != nil {
			return dataset.Result{}, err
		}
	}
	res, err := w.Commit(ctx, metrics)
	if err != nil {
		return dataset.Result{}, err
	}
	report(log, res, out.Part)
	fmt.Fprintln(stdout, res.Ref)
	return res, nil
}

func report(log *slog.Logger, res dataset.Result, part dataset.Part) {
	switch {
	case res.Pending:
		log.Info("part written; the version commits when its last part lands", "ref", res.Ref.String(), "part", part.String())
	case res.Committed:
		log.Info("committed", "ref", res.Ref.String(), "rows", res.Version.Rows, "bytes", res.Version.Bytes, "shards", len(res.Version.Shards))
	case res.Existed:
		// An ordinary rerun: Write said "already committed"; nothing to add.
	default:
		log.Info("another run committed this version first; reporting it", "ref", res.Ref.String())
	}
}
