package dataset

import (
	"context"
	"errors"
	"fmt"
	"slices"
	"sort"
	"strings"
	"time"

	"github.com/kilnrl/kiln/formats/store"
)

// ForgetOptions say which versions of a dataset Forget keeps.
type ForgetOptions struct {
	// KeepLast keeps the KeepLast versions committed last (by the store's
	// clock). 0 keeps only what the rules below keep.
	KeepLast int
	// KeepReferenced also keeps every version in the lineage of any
	// committed version of any other dataset in the store, not only of
	// the kept versions of this one.
	KeepReferenced bool
	// DryRun decides and reports without removing anything.
	DryRun bool
}

// Forget reasons a version is kept.
const (
	KeepLatest  = "latest"       // the version the bare name means
	KeepLastN   = "last"         // one of the KeepLast versions committed last
	KeepLineage = "lineage"      // an input, directly or not, of a kept version
	KeepRefd    = "referenced"   // an input of another dataset's version (KeepReferenced)
	KeepMoved   = "latest-moved" // the latest pointer moved to it while Forget ran
)

// ForgetDecision is what Forget does with one version.
type ForgetDecision struct {
	Ref       Ref
	Committed time.Time
	// Keep: the version stays, for Reasons (Keep* constants; "lineage" and
	// "referenced" with the version that needs it: "lineage of a@v").
	Keep    bool
	Reasons []string
	// Files and Bytes are what the version holds in the store (what
	// forgetting it frees): shards, receipts, attachments, the manifest.
	Files int
	Bytes int64
}

// Forget removes old committed versions of name, like restic's forget and
// prune together: it keeps the version the bare name means (its latest
// pointer's, else the newest), the opts.KeepLast committed last, and every
// version of name in the lineage (inputs, recursively, across datasets) of
// a kept one — with KeepReferenced, of any committed version of any other
// dataset in the store too — and removes every other version whole: shards,
// receipts, attachments and manifest. fn is called with every decision,
// newest committed first, once it is carried out (a removed version after
// its removal). Every decision is made before anything is removed.
//
// A version is removed receipts first (so no rerun of its stage adopts its
// shards), then its manifest (from then on it does not exist for readers),
// then the rest; a crash in between leaves files that GC collects as an
// uncommitted version's. Forget refuses to run (removing nothing) when it
// cannot read a manifest it would need to decide, or the latest pointer.
// Right before removing a version it reads the pointer again and keeps the
// version if the pointer has moved to it. A rerun of a forgotten version's
// stage that found it committed just before it was removed may still move
// the pointer to it afterwards: Forget checks the pointer again at the end,
// moves it back to the latest it kept (RepairLatest) and returns an error
// saying to rerun that stage, which commits it anew. Forget refuses
// (ErrCorrupt, nothing removed) while the pointer names a version that is
// not committed.
func Forget(ctx context.Context, st store.Store, name string, opts ForgetOptions, fn func(ForgetDecision)) error {
	if err := CheckName(name); err != nil {
		return err
	}
	if opts.KeepLast < 0 {
		return fmt.Errorf("forget %s: keep-last %d is negative", name, opts.KeepLast)
	}
	// The whole store is listed only when its every version is a root.
	prefix := name
	if opts.KeepReferenced {
		prefix = ""
	}
	everything, err := List(ctx, st, prefix)
	if err != nil {
		return fmt.Errorf("forget %s: %w", name, err)
	}
	var mine []Summary
	for _, s := range everything {
		if s.Ref.Name == name {
			mine = append(mine, s)
		}
	}
	if len(mine) == 0 {
		return fmt.Errorf("forget %s: %w in %s: no committed version (kiln ls lists the datasets there)", name, ErrNotFound, st.URI())
	}
	latest := mine[0].Ref.Version // List: newest first
	if l, err := ReadLatest(ctx, st, name); err == nil {
		latest = l.Version
	} else if !errors.Is(err, ErrNotFound) {
		return fmt.Errorf("forget %s: cannot tell which version is latest, so nothing was removed: %w", name, err)
	}
	// A pointer on a version that is not committed (hand-edited, or caught
	// mid-repair after a racing forget) keeps nothing: deciding from it
	// would remove every other version, the one it should name among them.
	if !slices.ContainsFunc(mine, func(s Summary) bool { return s.Ref.Version == latest }) {
		return fmt.Errorf("forget %s: its latest pointer names %s@%s, which is not committed, so nothing was removed: rerun the stage that made the version you want latest (which moves the pointer), then forget again: %w",
			name, name, latest, ErrCorrupt)
	}
	reasons := map[string][]string{}
	keep := func(version, why string) {
		for _, r := range reasons[version] {
			if r == why {
				return
			}
		}
		reasons[version] = append(reasons[version], why)
	}
	keep(latest, KeepLatest)
	for i, s := range mine {
		if i < opts.KeepLast {
			keep(s.Ref.Version, fmt.Sprintf("%s %d", KeepLastN, opts.KeepLast))
		}
	}
	// Walk the lineage from the roots: the kept versions of name (their
	// lineage is needed), and with KeepReferenced every other dataset's.
	type root struct {
		ref Ref
		why string
	}
	var roots []root
	for _, s := range mine {
		if len(reasons[s.Ref.Version]) > 0 {
			roots = append(roots, root{s.Ref, KeepLineage})
		}
	}
	if opts.KeepReferenced {
		for _, s := range everything {
			if s.Ref.Name != name {
				roots = append(roots, root{s.Ref, KeepRefd})
			}
		}
	}
	inputs := map[string][]Ref{} // manifests read so far
	readInputs := func(r Ref) ([]Ref, error) {
		if in, ok := inputs[r.String()]; ok {
			return in, nil
		}
		v, err := openVersion(ctx, st, r.Name, r.Version)
		if errors.Is(err, ErrNotFound) {
			inputs[r.String()] = nil // forgotten or never there: nothing to keep
			return nil, nil
		}
		if err != nil {
			return nil, fmt.Errorf("forget %s: cannot read the lineage of %s, so nothing was removed: %w", name, r, err)
		}
		inputs[r.String()] = v.Inputs
		return v.Inputs, nil
	}
	for _, rt := range roots {
		seen := map[string]bool{rt.ref.String(): true}
		queue := []Ref{rt.ref}
		for len(queue) > 0 {
			r := queue[0]
			queue = queue[1:]
			in, err := readInputs(r)
			if err != nil {
				return err
			}
			for _, i := range in {
				if !i.Pinned() || seen[i.String()] {
					continue
				}
				seen[i.String()] = true
				if i.Name == name && i != rt.ref {
					keep(i.Version, fmt.Sprintf("%s of %s", rt.why, rt.ref))
				}
				queue = append(queue, i)
			}
		}
	}

	var decisions []ForgetDecision
	files := map[string][]store.Info{}
	for _, s := range mine {
		d := ForgetDecision{Ref: s.Ref, Committed: s.Committed, Reasons: reasons[s.Ref.Version]}
		d.Keep = len(d.Reasons) > 0
		if !d.Keep {
			if err := st.List(ctx, versionDir(name, s.Ref.Version), func(info store.Info) error {
				files[s.Ref.Version] = append(files[s.Ref.Version], info)
				d.Files++
				d.Bytes += info.Size
				return nil
			}); err != nil {
				return fmt.Errorf("forget %s: listing %s: %w", name, s.Ref, err)
			}
		}
		decisions = append(decisions, d)
	}
	report := func(d ForgetDecision) {
		if fn != nil {
			fn(d)
		}
	}
	var forgotten []string
	for _, d := range decisions {
		if d.Keep || opts.DryRun {
			report(d)
			continue
		}
		if l, err := ReadLatest(ctx, st, name); err == nil && l.Version == d.Ref.Version {
			d.Keep, d.Reasons, d.Files, d.Bytes = true, []string{KeepMoved}, 0, 0
			report(d)
			continue
		}
		if err := removeVersion(ctx, st, d.Ref, files[d.Ref.Version]); err != nil {
			return fmt.Errorf("forget %s: %w (rerun forget to finish; kiln gc collects what is left)", name, err)
		}
		report(d)
		forgotten = append(forgotten, d.Ref.Version)
	}
	if l, err := ReadLatest(ctx, st, name); err == nil && slices.Contains(forgotten, l.Version) {
		// The writer's own check after its move (stillCommitted) may have
		// run before the removal: the pointer is moved off here, back to
		// the latest this forget kept.
		now, rerr := RepairLatest(ctx, st, name, latest, ThisProcess("forget"))
		if rerr != nil {
			return fmt.Errorf("forget %s: a writer moved latest to %s while it was being removed, and the pointer could not be moved off it (rerun forget): %w", name, l.Ref(), rerr)
		}
		return fmt.Errorf("forget %s: a writer moved latest to %s while it was being removed; latest is back on %s@%s: rerun the stage that made it (%s), which commits it again",
			name, l.Ref(), name, now, l.By)
	}
	return nil
}

// Drop removes the dataset name whole: its latest pointer first (so the
// bare name means nothing while the rest goes), then every version,
// committed or not, each in removeVersion's order. It is for a scratch
// dataset its caller made and nothing else reads (kiln verify's rerun):
// unlike Forget it keeps nothing, not even what other datasets' lineage
// names. Datasets whose names only start with name are not touched. A
// name with nothing in the store is ErrNotFound; a crash part way leaves
// files that GC collects or a rerun of Drop removes.
func Drop(ctx context.Context, st store.Store, name string) error {
	if err := CheckName(name); err != nil {
		return err
	}
	versions := map[string][]store.Info{}
	var order []string
	prefix := name + "/_v/"
	if err := st.List(ctx, prefix, func(info store.Info) error {
		v, _, _ := strings.Cut(strings.TrimPrefix(info.Key, prefix), "/")
		if _, ok := versions[v]; !ok {
			order = append(order, v)
		}
		versions[v] = append(versions[v], info)
		return nil
	}); err != nil {
		return fmt.Errorf("drop %s: %w", name, err)
	}
	if len(order) == 0 {
		if _, err := st.Stat(ctx, latestKey(name)); errors.Is(err, store.ErrNotExist) {
			return fmt.Errorf("drop %s: %w in %s", name, ErrNotFound, st.URI())
		}
	}
	if err := st.Delete(ctx, latestKey(name)); err != nil && !errors.Is(err, store.ErrNotExist) {
		return fmt.Errorf("drop %s: removing its latest pointer: %w", name, err)
	}
	for _, v := range order {
		if err := removeVersion(ctx, st, Ref{Name: name, Version: v}, versions[v]); err != nil {
			return fmt.Errorf("drop %s: %w", name, err)
		}
	}
	return nil
}

// removeVersion deletes one version's files in the order that keeps every
// intermediate state safe: receipts (nothing can adopt the shards), the
// manifest (the version is gone for readers), then the rest.
func removeVersion(ctx context.Context, st store.Store, r Ref, files []store.Info) error {
	dir := versionDir(r.Name, r.Version)
	rank := func(key string) int {
		switch rest := strings.TrimPrefix(key, dir); {
		case strings.HasPrefix(rest, "parts/") || strings.HasPrefix(rest, "rows/"):
			return 0
		case rest == "manifest.json":
			return 1
		}
		return 2
	}
	sort.SliceStable(files, func(i, j int) bool { return rank(files[i].Key) < rank(files[j].Key) })
	for _, f := range files {
		if err := st.Delete(ctx, f.Key); err != nil && !errors.Is(err, store.ErrNotExist) {
			return fmt.Errorf("removing %s: %q: %w", r, f.Key, err)
		}
	}
	return nil
}
