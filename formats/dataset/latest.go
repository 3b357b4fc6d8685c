package dataset

import (
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"math/rand/v2"
	"os"
	"time"

	"github.com/kilnrl/kiln/formats/store"
)

// LatestFormat tags latest pointers written by this package.
const LatestFormat = "kiln.latest/v1"

// Latest is a dataset's latest pointer: the version a bare name means. It
// is one small object per dataset, <name>/_latest.json, that every
// successful writing command moves to its version once the version is
// committed (MoveLatest), also when it found the version committed
// already: bare names mean what was last made, not what was committed
// last. It only ever names a committed version, since it is written after
// the manifest, and it is moved by compare-and-swap, so concurrent writers
// leave it at one of their versions, whole. A writer may make the move
// conditional (Spec.LatestIf), decided against the pointer as it stands in
// each round of the compare-and-swap: kiln-sync moves it forward only.
type Latest struct {
	Format  string `json:"format"`
	Dataset string `json:"dataset"`
	Version string `json:"version"`
	// Previous is the version the pointer named before this move ("" if
	// none).
	Previous string `json:"previous,omitempty"`
	// By is who moved it.
	By Mover `json:"by"`
	// MovedAt is the mover's clock; Moved, the store's, is what to show.
	MovedAt time.Time `json:"moved_at"`
	// Moved is the store's timestamp of the pointer object (not stored in it).
	Moved time.Time `json:"-"`
}

// Mover says which process moved a pointer.
type Mover struct {
	Stage string `json:"stage"`
	Host  string `json:"host,omitempty"`
	PID   int    `json:"pid,omitempty"`
}

// ThisProcess is the Mover for stage running in this process.
func ThisProcess(stage string) Mover {
	host, _ := os.Hostname()
	return Mover{Stage: stage, Host: host, PID: os.Getpid()}
}

func (m Mover) String() string {
	s := m.Stage
	if m.Host != "" || m.PID != 0 {
		s += fmt.Sprintf(" on %s pid %d", m.Host, m.PID)
	}
	return s
}

// Ref is the reference the pointer resolves to.
func (l *Latest) Ref() Ref { return Ref{Name: l.Dataset, Version: l.Version} }

func latestKey(name string) string { return name + "/_latest.json" }

// ReadLatest reads name's latest pointer in one Get. It returns an error
// satisfying ErrNotFound if name has none (a dataset whose versions were all
// written before pointers existed, or no dataset at all).
func ReadLatest(ctx context.Context, st store.Store, name string) (*Latest, error) {
	if err := CheckName(name); err != nil {
		return nil, err
	}
	l, _, err := readLatest(ctx, st, name)
	return l, err
}

// readLatest also returns the ETag the pointer was read with.
func readLatest(ctx context.Context, st store.Store, name string) (*Latest, string, error) {
	key := latestKey(name)
	data, info, err := store.ReadAll(ctx, st, key)
	if errors.Is(err, store.ErrNotExist) {
		return nil, "", fmt.Errorf("dataset %s: latest pointer %q: %w in %s", name, key, ErrNotFound, st.URI())
	}
	if err != nil {
		return nil, "", fmt.Errorf("dataset %s: reading latest pointer %q: %w", name, key, err)
	}
	var l Latest
	if err := json.Unmarshal(data, &l); err != nil {
		return nil, info.ETag, fmt.Errorf("dataset %s: latest pointer %q is not valid JSON: %w: %w", name, key, err, ErrCorrupt)
	}
	switch {
	case l.Format != LatestFormat:
		return nil, info.ETag, fmt.Errorf("dataset %s: latest pointer %q has format %q, want %q: %w", name, key, l.Format, LatestFormat, ErrCorrupt)
	case l.Dataset != name || !versionRE.MatchString(l.Version):
		return nil, info.ETag, fmt.Errorf("dataset %s: latest pointer %q names %q@%q: %w", name, key, l.Dataset, l.Version, ErrCorrupt)
	}
	l.Moved = info.ModTime
	return &l, info.ETag, nil
}

// Resolve returns the version a bare name means: the one its latest
// pointer names, read in one Get. A dataset without a pointer (all of its
// versions were written before pointers existed) falls back to Newest, its
// last committed version by the store's clock, so stores made earlier keep
// working; the next writing command gives it a pointer.
func Resolve(ctx context.Context, st store.Store, name string) (string, error) {
	l, err := ReadLatest(ctx, st, name)
	if errors.Is(err, ErrNotFound) {
		return Newest(ctx, st, name)
	}
	if err != nil {
		return "", err
	}
	return l.Version, nil
}

// moveAttempts bounds MoveLatest's compare-and-swap loop: every conflict
// means another writer moved the pointer, so the loop only runs long under
// that many concurrent moves of one name.
const moveAttempts = 100

// MoveLatest moves ref's dataset's latest pointer to ref, which must be
// committed, and returns the pointer as it now stands. It is a
// compare-and-swap loop on the pointer's ETag (create-if-absent when there
// is none), retried on conflict: concurrent moves of one name end with the
// pointer at one of their versions, and a pointer is never torn. A pointer
// that already names ref is left as it is. A malformed pointer is replaced.
//
// On a server whose GET may pair one version's bytes with a newer version's
// ETag under concurrent replacement (versitygw v1.8.0's posix back end, see
// storetest.Quirks), a move racing others may record the wrong Previous, or
// see its own version and stop while a racing move lands: the pointer still
// ends whole at one of the racing versions, each committed.
func MoveLatest(ctx context.Context, st store.Store, ref Ref, by Mover) (*Latest, error) {
	if !ref.Pinned() {
		return nil, fmt.Errorf("moving latest of %s: the reference is not pinned to a version", ref)
	}
	if err := CheckName(ref.Name); err != nil {
		return nil, err
	}
	// The pointer must never name a version that is not committed.
	if _, err := st.Stat(ctx, manifestKey(ref.Name, ref.Version)); errors.Is(err, store.ErrNotExist) {
		return nil, fmt.Errorf("moving latest of %s: %s is not committed: %w", ref.Name, ref, ErrNotFound)
	} else if err != nil {
		return nil, fmt.Errorf("moving latest of %s: %w", ref.Name, err)
	}
	return moveLatest(ctx, st, ref, by, nil)
}

// moveLatest is MoveLatest for a ref the caller has just seen committed.
// If cond is set, the pointer moves only if cond accepts it as it stands
// (nil when absent or malformed), checked on every round of the loop, so
// a pointer another writer moved meanwhile is judged afresh; when cond
// refuses, the pointer is returned as it stands (nil if absent).
func moveLatest(ctx context.Context, st store.Store, ref Ref, by Mover, cond func(context.Context, *Latest) (bool, error)) (*Latest, error) {
	key := latestKey(ref.Name)
	for attempt := 0; attempt < moveAttempts; attempt++ {
		if attempt > 0 {
			// Jitter, so the writers that lost one round do not collide again.
			d := time.Duration(rand.Int64N(int64(min(attempt, 10)) * int64(5*time.Millisecond)))
			select {
			case <-ctx.Done():
				return nil, fmt.Errorf("moving latest of %s: %w", ref.Name, ctx.Err())
			case <-time.After(d):
			}
		}
		cur, etag, err := readLatest(ctx, st, ref.Name)
		absent := errors.Is(err, ErrNotFound)
		switch {
		case err == nil && cur.Version == ref.Version:
			return cur, stillCommitted(ctx, st, ref, by)
		case err != nil && !absent && !errors.Is(err, ErrCorrupt):
			return nil, err
		}
		if cond != nil {
			ok, err := cond(ctx, cur)
			if err != nil {
				return nil, fmt.Errorf("moving latest of %s to %s: %w", ref.Name, ref.Version, err)
			}
			if !ok {
				return cur, nil
			}
		}
		next := Latest{Format: LatestFormat, Dataset: ref.Name, Version: ref.Version, By: by, MovedAt: time.Now().UTC()}
		if cur != nil {
			next.Previous = cur.Version
		}
		b, _ := json.MarshalIndent(next, "", " ")
		var info store.Info
		if absent {
			info, err = st.PutIfAbsent(ctx, key, bytes.NewReader(b), int64(len(b)))
		} else {
			info, err = st.PutIfMatch(ctx, key, bytes.NewReader(b), int64(len(b)), etag)
		}
		if errors.Is(err, store.ErrExist) || errors.Is(err, store.ErrPrecondition) {
			continue // another writer moved it meanwhile: look again
		}
		if err != nil {
			return nil, fmt.Errorf("moving latest of %s: writing %q: %w", ref.Name, key, err)
		}
		next.Moved = info.ModTime
		if err := stillCommitted(ctx, st, ref, by); err != nil {
			return nil, err
		}
		return &next, nil
	}
	return nil, fmt.Errorf("moving latest of %s to %s: lost %d compare-and-swaps to other writers in a row", ref.Name, ref.Version, moveAttempts)
}

// stillCommitted is the check after a move: the version the pointer now
// names must still be committed. A kiln forget may have removed it between
// the writer's seeing it committed and its compare-and-swap (a rerun that
// found its version committed races a forget of that version); then the
// pointer is moved off it (RepairLatest) and the move fails, saying to
// rerun, which commits the version anew. Together with Forget's own check
// after its removals, every interleaving ends with the pointer on a
// committed version: the move's swap precedes this Stat, so either the
// Stat sees the manifest gone, or the removal follows the swap and Forget's
// last read of the pointer sees the version it removed.
func stillCommitted(ctx context.Context, st store.Store, ref Ref, by Mover) error {
	_, err := st.Stat(ctx, manifestKey(ref.Name, ref.Version))
	switch {
	case err == nil:
		return nil
	case !errors.Is(err, store.ErrNotExist):
		return fmt.Errorf("moving latest of %s: checking that %s is still committed: %w", ref.Name, ref, err)
	}
	now, rerr := RepairLatest(ctx, st, ref.Name, "", by)
	if rerr != nil {
		return fmt.Errorf("moving latest of %s: %s was removed (kiln forget?) as the pointer moved to it, and the pointer could not be moved off it: %w", ref.Name, ref, rerr)
	}
	return fmt.Errorf("moving latest of %s: %s was removed (kiln forget?) as the pointer moved to it; the pointer is back on %q: rerun the stage, which commits %s again",
		ref.Name, ref, now, ref.Version)
}

// RepairLatest moves name's latest pointer off a version that is not
// committed (one a kiln forget removed as a writer moved the pointer to
// it): to prefer if that is committed, else to the newest committed
// version (Newest). It returns the version the pointer names afterwards,
// "" if name has no pointer. A pointer already on a committed version is
// left as it is, so racing repairs, and a writer moving the pointer on
// meanwhile, end with it on a committed version. With no committed version
// left the pointer stays and the error says so (ErrNotFound).
func RepairLatest(ctx context.Context, st store.Store, name, prefer string, by Mover) (string, error) {
	committed := func(v string) (bool, error) {
		_, err := st.Stat(ctx, manifestKey(name, v))
		if errors.Is(err, store.ErrNotExist) {
			return false, nil
		}
		return err == nil, err
	}
	key := latestKey(name)
	for attempt := 0; attempt < moveAttempts; attempt++ {
		cur, etag, err := readLatest(ctx, st, name)
		switch {
		case errors.Is(err, ErrNotFound):
			return "", nil
		case err != nil:
			return "", fmt.Errorf("repairing latest of %s: %w", name, err)
		}
		if ok, err := committed(cur.Version); err != nil {
			return "", fmt.Errorf("repairing latest of %s: %w", name, err)
		} else if ok {
			return cur.Version, nil
		}
		target := ""
		if prefer != "" && prefer != cur.Version {
			ok, err := committed(prefer)
			if err != nil {
				return "", fmt.Errorf("repairing latest of %s: %w", name, err)
			}
			if ok {
				target = prefer
			}
		}
		if target == "" {
			if target, err = Newest(ctx, st, name); err != nil {
				return "", fmt.Errorf("repairing latest of %s: it names %s, which is not committed: %w", name, cur.Version, err)
			}
		}
		next := Latest{Format: LatestFormat, Dataset: name, Version: target, Previous: cur.Version, By: by, MovedAt: time.Now().UTC()}
		b, _ := json.MarshalIndent(next, "", " ")
		_, err = st.PutIfMatch(ctx, key, bytes.NewReader(b), int64(len(b)), etag)
		if err != nil && !errors.Is(err, store.ErrPrecondition) && !errors.Is(err, store.ErrExist) {
			return "", fmt.Errorf("repairing latest of %s: writing %q: %w", name, key, err)
		}
		// Moved or lost a round: look again (the target may have gone too).
	}
	return "", fmt.Errorf("repairing latest of %s: lost %d compare-and-swaps to other writers in a row", name, moveAttempts)
}
