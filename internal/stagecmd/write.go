package stagecmd

import (
	"context"
	"fmt"
	"io"
	"log/slog"
	"maps"
	"slices"

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
	// Adopt, if set, is dataset.Spec.Adopt: which rows an earlier
	// attempt's receipts keep when the writer resumes.
	Adopt func(keys []string) bool
}

// Produce writes the part's shards through w and returns stage metrics.
// It must skip rows for which w.Done reports true when it uses row keys.
type Produce func(ctx context.Context, w *dataset.Writer) (metrics map[string]any, err error)

// ProduceAll is Produce for several versions written together: ws are
// the writers of WriteAll's outputs, in order.
type ProduceAll func(ctx context.Context, ws []*dataset.Writer) (metrics map[string]any, err error)

// Write runs the write-a-version flow shared by every writing command, on
// the same code path whether or not it only prints the version: compute
// the version id; stop there for --print-version; if that version is
// already committed, only move the dataset's latest pointer to it;
// otherwise produce this part and commit (which moves the pointer too).
// The reference is always the last line written to stdout.
func Write(ctx context.Context, st store.Store, out Output, stdout io.Writer, log *slog.Logger, produce Produce) (dataset.Result, error) {
	res, err := WriteAll(ctx, st, []Output{out}, Together{}, stdout, log, func(ctx context.Context, ws []*dataset.Writer) (map[string]any, error) {
		return produce(ctx, ws[0])
	})
	if err != nil {
		return dataset.Result{}, err
	}
	return res[0], nil
}

// Together says how the versions of one WriteAll depend on each other.
type Together struct {
	// Opened, if set, is called with each output's writer as soon as it
	// is open, before the next output's is: a later output's Adopt may
	// read what an earlier writer holds.
	Opened func(i int, w *dataset.Writer) error
	// CommitOrder lists the outputs' indexes in the order their versions
	// commit (nil: in order).
	CommitOrder []int
	// Metrics are merged into every part's metrics, whether or not this
	// run produced rows (a run that only completes the commits of an
	// earlier one still names them).
	Metrics map[string]any
}

// WriteAll is Write for several versions that one run of a command writes
// together (kiln-rollout run: rollouts, turns, trajectories), one part of
// each. --print-version is outs[0]'s flag and prints every reference. The
// writers are opened in order; outs[0] is the version whose rows of a
// batch are written last, so when its part is already written the run
// produces nothing and only completes the others' commits from their
// receipts (CorruptError when those are gone). The references are printed
// in the order of outs, as the last lines of stdout, and returned so.
func WriteAll(ctx context.Context, st store.Store, outs []Output, tg Together, stdout io.Writer, log *slog.Logger, produce ProduceAll) ([]dataset.Result, error) {
	res := make([]dataset.Result, len(outs))
	specs := make([]dataset.Spec, len(outs))
	for i, out := range outs {
		if err := dataset.CheckName(out.Name); err != nil {
			return nil, UsageError{err}
		}
		specs[i] = dataset.Spec{Name: out.Name, Kind: out.Kind, Identity: out.Identity, Part: out.Part, Build: Build(),
			Hook: out.Hook, LatestIf: out.LatestIf, Adopt: out.Adopt}
	}
	if outs[0].PrintVersion {
		for i, spec := range specs {
			version, err := spec.Identity.Version()
			if err != nil {
				return nil, err
			}
			res[i].Ref = dataset.Ref{Name: spec.Name, Version: version}
			fmt.Fprintln(stdout, res[i].Ref)
		}
		return res, nil
	}
	ws := make([]*dataset.Writer, len(outs))
	for i, spec := range specs {
		w, err := dataset.NewWriter(ctx, st, spec)
		if err != nil {
			return nil, err
		}
		ws[i] = w
		if tg.Opened != nil {
			if err := tg.Opened(i, w); err != nil {
				return nil, err
			}
		}
	}
	first, part := ws[0], outs[0].Part
	finished := func(w *dataset.Writer) bool { return w.Existing() != nil || w.PartDone() }
	var metrics map[string]any
	switch {
	case first.Existing() != nil && !slices.ContainsFunc(ws, func(w *dataset.Writer) bool { return !finished(w) }):
		log.Info("already committed; nothing to compute (latest moves to it)", "ref", first.Ref().String())
	case finished(first) && !slices.ContainsFunc(ws, func(w *dataset.Writer) bool { return !finished(w) }):
		log.Info("part already written by an earlier attempt", "ref", first.Ref().String(), "part", part.String())
	case finished(first):
		for _, w := range ws[1:] {
			if v := first.Existing(); v != nil && v.Rows > 0 && !finished(w) && w.Resumed() == 0 {
				return nil, CorruptError{Err: fmt.Errorf("%s is committed but %s is not, and the row receipts that would complete it are gone (kiln gc?): "+
					"remove the versions written together (kiln forget) and rerun", first.Ref(), w.Ref())}
			}
		}
		log.Info("part already written; completing the versions written with it", "ref", first.Ref().String(), "part", part.String())
	default:
		if n := first.Resumed(); n > 0 {
			log.Info("resuming", "ref", first.Ref().String(), "part", part.String(), "rows_done", n)
		}
		var err error
		if metrics, err = produce(ctx, ws); err != nil {
			return nil, err
		}
	}
	if len(tg.Metrics) > 0 {
		if metrics == nil {
			metrics = map[string]any{}
		}
		maps.Copy(metrics, tg.Metrics)
	}
	order := tg.CommitOrder
	if order == nil {
		order = make([]int, len(ws))
		for i := range order {
			order[i] = i
		}
	}
	for _, i := range order {
		r, err := ws[i].Commit(ctx, metrics)
		if err != nil {
			return nil, err
		}
		res[i] = r
		report(log, r, part)
	}
	for _, r := range res {
		fmt.Fprintln(stdout, r.Ref)
	}
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
