package dataset

import (
	"context"
	"errors"
	"fmt"
	"sort"
	"strings"
	"time"

	"github.com/kilnrl/kiln/formats/store"
)

// GCOptions control garbage collection.
type GCOptions struct {
	// Prefix limits collection to dataset names starting with it.
	Prefix string
	// Grace spares anything younger: a writer may still be working on it.
	// It must exceed the longest a stage's part can take to finish.
	Grace time.Duration
	// DryRun reports without removing.
	DryRun bool
	// Now is the reference time (default time.Now()).
	Now time.Time
}

// Orphan is a file GC removes (or, with DryRun, would remove).
type Orphan struct {
	Key    string
	Size   int64
	Reason string
}

// Orphan reasons.
const (
	ReasonUncommitted  = "uncommitted"  // in a version that has no manifest
	ReasonUnreferenced = "unreferenced" // in a committed version, not in its manifest
	ReasonLeftover     = "leftover"     // a store's own debris from an interrupted write
)

// GC finds the files the commit protocol leaves behind: everything in a
// version directory without a manifest, files of committed versions that
// their manifest does not name (a losing attempt's shards, receipts) other
// than the version's attachments, and the store's own leftovers. Files younger than the grace period are kept.
// fn is called for each orphan, in key order, before it is removed.
// Manifests and latest pointers are never removed, so neither is the
// version a latest pointer names. A version whose manifest cannot be read
// is left whole and the rest of the store collected; the error returned
// then names each such version (ErrCorrupt when one is corrupt).
func GC(ctx context.Context, st store.Store, opts GCOptions, fn func(Orphan)) error {
	if opts.Grace < 0 {
		return fmt.Errorf("gc: negative grace %s would remove a live writer's files", opts.Grace)
	}
	now := opts.Now
	if now.IsZero() {
		now = time.Now()
	}
	cutoff := now.Add(-opts.Grace)
	type versionFiles struct {
		committed bool
		files     []store.Info
	}
	versions := map[string]*versionFiles{}
	err := st.List(ctx, opts.Prefix, func(info store.Info) error {
		name, version, rest, ok := splitVersionKey(info.Key)
		if !ok {
			return nil // not kiln's
		}
		dir := versionDir(name, version)
		vf := versions[dir]
		if vf == nil {
			vf = &versionFiles{}
			versions[dir] = vf
		}
		if rest == "manifest.json" {
			vf.committed = true
		} else {
			vf.files = append(vf.files, info)
		}
		return nil
	})
	if err != nil {
		return fmt.Errorf("gc: listing %s: %w", st.URI(), err)
	}
	var orphans []Orphan
	var unreadable []error
	for dir, vf := range versions {
		keep := map[string]bool{}
		reason := ReasonUncommitted
		if vf.committed {
			reason = ReasonUnreferenced
			name, version, _, _ := splitVersionKey(dir + "manifest.json")
			v, err := openVersion(ctx, st, name, version)
			if err != nil {
				// Never delete around a manifest we cannot read: keep
				// the whole version, go on with the rest of the store,
				// and say so at the end.
				unreadable = append(unreadable, fmt.Errorf("gc: kept every file of %s: %w", dir, err))
				continue
			}
			for _, s := range v.Shards {
				keep[dir+s.Key] = true
			}
		}
		for _, f := range vf.files {
			if vf.committed && strings.HasPrefix(f.Key, dir+attachmentsDir) {
				continue // the committed version's own attachments
			}
			if !keep[f.Key] && f.ModTime.Before(cutoff) {
				orphans = append(orphans, Orphan{Key: f.Key, Size: f.Size, Reason: reason})
			}
		}
	}
	var leftovers []store.Info
	if sw, ok := st.(store.Sweeper); ok {
		if err := sw.Leftovers(ctx, cutoff, func(info store.Info) error {
			leftovers = append(leftovers, info)
			orphans = append(orphans, Orphan{Key: info.Key, Size: info.Size, Reason: ReasonLeftover})
			return nil
		}); err != nil {
			return fmt.Errorf("gc: %w", err)
		}
	}
	sort.Slice(orphans, func(i, j int) bool { return orphans[i].Key < orphans[j].Key })
	recommitted := map[string]bool{}
	for _, o := range orphans {
		if o.Reason == ReasonUncommitted && !opts.DryRun {
			// A writer may have committed since the listing: look again
			// right before deleting (the grace period covers the rest).
			name, version, _, _ := splitVersionKey(o.Key)
			dir := versionDir(name, version)
			if _, seen := recommitted[dir]; !seen {
				_, err := st.Stat(ctx, dir+"manifest.json")
				recommitted[dir] = err == nil
			}
			if recommitted[dir] {
				continue
			}
		}
		if fn != nil {
			fn(o)
		}
		if opts.DryRun || o.Reason == ReasonLeftover {
			continue
		}
		if err := st.Delete(ctx, o.Key); err != nil {
			return fmt.Errorf("gc: removing %q: %w", o.Key, err)
		}
	}
	if !opts.DryRun {
		for _, l := range leftovers {
			if err := st.(store.Sweeper).RemoveLeftover(ctx, l); err != nil {
				return fmt.Errorf("gc: removing leftover %q: %w", l.Key, err)
			}
		}
	}
	if len(unreadable) > 0 {
		sort.Slice(unreadable, func(i, j int) bool { return unreadable[i].Error() < unreadable[j].Error() })
		return fmt.Errorf("gc: collected the rest, but %d version(s) have a manifest it cannot read (kiln verify names what is wrong): %w",
			len(unreadable), errors.Join(unreadable...))
	}
	return nil
}
