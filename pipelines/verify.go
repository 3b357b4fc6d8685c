package pipelines

import (
	"bytes"
	"context"
	"errors"
	"fmt"
	"io"
	"strings"
	"sync"

	"github.com/kilnrl/kiln/formats/dataset"
)

// ErrNotDeterministic is what Verify's error wraps when a rerun wrote other
// content than the target's recorded output (kiln verify exits 4 on it).
var ErrNotDeterministic = errors.New("NOT deterministic")

// Verify reruns the done target name, whose output is a dataset, into a
// scratch dataset (OUT-verify; OUT-verify/NAME for each output OUT/NAME of
// a target with several), compares the two versions' shard content
// hashes, and returns the rerun's refs. A scratch dataset an earlier
// verify left is removed first (a committed one would be found and the
// stage not rerun), and again after a match; after a difference (an error
// wrapping ErrNotDeterministic) it is kept for inspection. The recipe's
// output goes to output.
func (p *Plan) Verify(ctx context.Context, name string, output io.Writer) ([]string, error) {
	t := p.Target(name)
	if t == nil {
		return nil, fmt.Errorf("verify: no target %q in %s", name, p.Spec.Name)
	}
	if !t.Done || t.Out == "" || t.Ref == "" {
		return nil, fmt.Errorf("verify %s: it must be done and write a dataset (--out); state: %s", t.Name, t.Why)
	}
	scratch := t.Out + "-verify"
	vt := *t
	vt.Out = scratch
	vt.Recipe = make([]string, len(t.Recipe))
	for i, l := range t.Recipe {
		vt.Recipe[i] = strings.ReplaceAll(strings.ReplaceAll(l, "--out="+t.Out, "--out="+scratch), "--out "+t.Out, "--out "+scratch)
	}
	var scratches []string
	for _, o := range t.Outputs {
		name, _, _ := strings.Cut(o, "@")
		scratches = append(scratches, scratch+strings.TrimPrefix(name, t.Out))
	}
	for _, sc := range scratches {
		if err := dataset.Drop(ctx, p.opts.Store, sc); err != nil && !errors.Is(err, dataset.ErrNotFound) {
			return nil, fmt.Errorf("verify %s: removing the scratch dataset %s an earlier verify left: %w", t.Name, sc, err)
		}
	}
	outs, err := p.runShards(ctx, &vt, RunOptions{Output: output}, new(sync.Mutex), new(bytes.Buffer), nil)
	if err != nil {
		return nil, fmt.Errorf("verify %s: rerunning it: %w", t.Name, err)
	}
	if len(outs) != len(t.Outputs) {
		return outs, fmt.Errorf("verify %s: %w: it wrote %s, the rerun %s (kept for inspection)", t.Name, ErrNotDeterministic, strings.Join(t.Outputs, " "), strings.Join(outs, " "))
	}
	for i := range outs {
		if err := p.sameContent(ctx, t.Name, t.Outputs[i], outs[i]); err != nil {
			return outs, err
		}
	}
	for _, sc := range scratches {
		if err := dataset.Drop(ctx, p.opts.Store, sc); err != nil {
			return outs, fmt.Errorf("verify %s: the rerun matched, but removing its scratch dataset %s failed: %w", t.Name, sc, err)
		}
	}
	return outs, nil
}

// sameContent compares two versions' shard content hashes (Verify).
func (p *Plan) sameContent(ctx context.Context, target, want, got string) error {
	a, err := dataset.OpenString(ctx, p.opts.Store, want)
	if err != nil {
		return err
	}
	b, err := dataset.OpenString(ctx, p.opts.Store, got)
	if err != nil {
		return err
	}
	if len(a.Shards) != len(b.Shards) {
		return fmt.Errorf("verify %s: %w: %s has %d shards, the rerun %s %d (kept for inspection)", target, ErrNotDeterministic, want, len(a.Shards), got, len(b.Shards))
	}
	for i := range a.Shards {
		if a.Shards[i].SHA256 != b.Shards[i].SHA256 {
			return fmt.Errorf("verify %s: %w: shard %d of %s differs from the rerun %s (kept for inspection)", target, ErrNotDeterministic, i, want, got)
		}
	}
	return nil
}
