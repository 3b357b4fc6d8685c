package dataset

import (
	"bytes"
	"context"
	"crypto/sha256"
	"encoding/hex"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"sort"
	"strings"
	"time"

	"github.com/kilnrl/kiln/formats/records"
	"github.com/kilnrl/kiln/formats/store"
)

var (
	// ErrNotFound: no such dataset or version.
	ErrNotFound = errors.New("not found")
	// ErrCorrupt: stored data disagrees with its manifest, or a manifest is
	// malformed. Re-running the producing stage into a new store, or
	// restoring the files, is the way out; kiln never repairs in place.
	ErrCorrupt = errors.New("corrupt dataset")
	// ErrKindMismatch: a writer would commit a version of another record
	// kind than the dataset name already holds, or an input opened with
	// OpenKind holds another kind than the stage reads (a usage error: the
	// name is wrong, nothing was written).
	ErrKindMismatch = errors.New("another record kind than the dataset holds")
)

// Version is one committed version, opened for reading.
type Version struct {
	Manifest
	// Committed is the store's timestamp of the manifest: the commit time.
	Committed time.Time
	kind      records.Kind
	st        store.Store
}

// Ref is the exact reference of the version.
func (v *Version) Ref() Ref { return Ref{Name: v.Dataset, Version: v.Version} }

// Kind is the version's record kind.
func (v *Version) Kind() records.Kind { return v.kind }

// OpenKind is Open of an input that must hold kind's records, given by
// the command-line flag flag: Open's errors are prefixed "FLAG: ", and a
// version of another kind is an error satisfying ErrKindMismatch, worded
// "FLAG REF holds GOT records, not WANT".
func OpenKind(ctx context.Context, st store.Store, ref Ref, kind records.Kind, flag string) (*Version, error) {
	v, err := Open(ctx, st, ref)
	if err != nil {
		return nil, fmt.Errorf("%s: %w", flag, err)
	}
	if got := v.Kind().Name; got != kind.Name {
		return nil, kindError{fmt.Sprintf("%s %s holds %s records, not %s", flag, v.Ref(), got, kind.Name)}
	}
	return v, nil
}

// kindError is OpenKind's error: its own words, and ErrKindMismatch's
// class.
type kindError struct{ msg string }

func (e kindError) Error() string        { return e.msg }
func (e kindError) Is(target error) bool { return target == ErrKindMismatch }

// Open resolves a reference (a bare name through Resolve) and reads its
// manifest.
func Open(ctx context.Context, st store.Store, ref Ref) (*Version, error) {
	if ref.Version == "" {
		version, err := Resolve(ctx, st, ref.Name)
		if err != nil {
			return nil, err
		}
		ref.Version = version
	}
	return openVersion(ctx, st, ref.Name, ref.Version)
}

// OpenString is Open for a reference in text form.
func OpenString(ctx context.Context, st store.Store, ref string) (*Version, error) {
	r, err := ParseRef(ref)
	if err != nil {
		return nil, err
	}
	return Open(ctx, st, r)
}

func openVersion(ctx context.Context, st store.Store, name, version string) (*Version, error) {
	ref := name + "@" + version
	data, info, err := store.ReadAll(ctx, st, manifestKey(name, version))
	if errors.Is(err, store.ErrNotExist) {
		return nil, fmt.Errorf("dataset %s: %w in %s (kiln ls lists the datasets there)", ref, ErrNotFound, st.URI())
	}
	if err != nil {
		return nil, fmt.Errorf("dataset %s: reading manifest: %w", ref, err)
	}
	v := &Version{Committed: info.ModTime, st: st}
	dec := json.NewDecoder(bytes.NewReader(data))
	if err := dec.Decode(&v.Manifest); err != nil {
		return nil, fmt.Errorf("dataset %s: manifest %q is not valid JSON: %w: %w", ref, manifestKey(name, version), err, ErrCorrupt)
	}
	if err := v.Manifest.validate(name, version); err != nil {
		return nil, fmt.Errorf("dataset %s: manifest %q %w: %w", ref, manifestKey(name, version), err, ErrCorrupt)
	}
	kind, err := records.Lookup(v.Manifest.Kind)
	if err != nil {
		return nil, fmt.Errorf("dataset %s: %w: this kiln cannot read it (written by %s %s)", ref, err, v.Producer.Stage, v.Producer.Build)
	}
	if !kind.Reads(v.Manifest.Schema) {
		return nil, fmt.Errorf("dataset %s: %s schema %s differs from this kiln's %s: read it with the kiln that wrote it (%s)",
			ref, kind.Name, v.Manifest.Schema, kind.Fingerprint(), v.Producer.Build)
	}
	v.kind = kind
	return v, nil
}

// Newest returns the version of name whose manifest the store committed
// last (by the store's own clock; ties broken by the version id). It lists
// the dataset's versions; a bare name means Resolve's version, which is
// Newest's only for a dataset without a latest pointer.
func Newest(ctx context.Context, st store.Store, name string) (string, error) {
	if err := CheckName(name); err != nil {
		return "", err
	}
	var best store.Info
	var bestVersion string
	err := st.List(ctx, name+"/_v/", func(info store.Info) error {
		n, version, rest, ok := splitVersionKey(info.Key)
		if !ok || n != name || rest != "manifest.json" {
			return nil
		}
		if bestVersion == "" || info.ModTime.After(best.ModTime) ||
			(info.ModTime.Equal(best.ModTime) && version > bestVersion) {
			best, bestVersion = info, version
		}
		return nil
	})
	if err != nil {
		return "", fmt.Errorf("dataset %s: listing versions in %s: %w", name, st.URI(), err)
	}
	if bestVersion == "" {
		return "", fmt.Errorf("dataset %s: %w in %s: no committed version (kiln ls lists the datasets there)", name, ErrNotFound, st.URI())
	}
	return bestVersion, nil
}

// Summary is one committed version as listed.
type Summary struct {
	Ref       Ref
	Committed time.Time
}

// List reports every committed version of every dataset whose name starts
// with prefix, newest first within a dataset, datasets sorted by name.
func List(ctx context.Context, st store.Store, prefix string) ([]Summary, error) {
	var out []Summary
	err := st.List(ctx, prefix, func(info store.Info) error {
		name, version, rest, ok := splitVersionKey(info.Key)
		if ok && rest == "manifest.json" && strings.HasPrefix(name, prefix) {
			out = append(out, Summary{Ref{name, version}, info.ModTime})
		}
		return nil
	})
	if err != nil {
		return nil, fmt.Errorf("listing %s: %w", st.URI(), err)
	}
	sort.Slice(out, func(i, j int) bool {
		a, b := out[i], out[j]
		if a.Ref.Name != b.Ref.Name {
			return a.Ref.Name < b.Ref.Name
		}
		if !a.Committed.Equal(b.Committed) {
			return a.Committed.After(b.Committed)
		}
		return a.Ref.Version > b.Ref.Version
	})
	return out, nil
}

// ReadShard reads shard i whole and checks its size and sha256, so no byte
// of a damaged shard ever reaches a decoder.
func (v *Version) ReadShard(ctx context.Context, i int) ([]byte, error) {
	s := v.Shards[i]
	key := versionDir(v.Dataset, v.Version) + s.Key
	where := fmt.Sprintf("dataset %s@%s: shard %q", v.Dataset, v.Version, s.Key)
	rc, info, err := v.st.Get(ctx, key)
	if errors.Is(err, store.ErrNotExist) {
		return nil, fmt.Errorf("%s is missing from %s: %w", where, v.st.URI(), ErrCorrupt)
	}
	if err != nil {
		return nil, fmt.Errorf("%s: %w", where, err)
	}
	defer rc.Close()
	if info.Size != s.Bytes {
		return nil, fmt.Errorf("%s has %d bytes, the manifest says %d: %w", where, info.Size, s.Bytes, ErrCorrupt)
	}
	buf := make([]byte, s.Bytes)
	h := sha256.New()
	if _, err := io.ReadFull(io.TeeReader(rc, h), buf); err != nil {
		return nil, fmt.Errorf("%s: %w", where, err)
	}
	if got := hex.EncodeToString(h.Sum(nil)); got != s.SHA256 {
		return nil, fmt.Errorf("%s: sha256 %s does not match the manifest's %s: %w", where, got, s.SHA256, ErrCorrupt)
	}
	return buf, nil
}

// EachShard reads every shard in order, checksummed, and calls fn with its
// bytes. The next shard is fetched while fn works on the current one, so
// I/O and hashing overlap decoding.
func (v *Version) EachShard(ctx context.Context, fn func(i int, data []byte) error) error {
	type fetched struct {
		data []byte
		err  error
	}
	ctx, cancel := context.WithCancel(ctx)
	defer cancel()
	fetch := func(i int) <-chan fetched {
		ch := make(chan fetched, 1)
		go func() {
			data, err := v.ReadShard(ctx, i)
			ch <- fetched{data, err}
		}()
		return ch
	}
	var next <-chan fetched
	if len(v.Shards) > 0 {
		next = fetch(0)
	}
	for i := range v.Shards {
		f := <-next
		if f.err != nil {
			return f.err
		}
		if i+1 < len(v.Shards) {
			next = fetch(i + 1)
		}
		if err := fn(i, f.data); err != nil {
			return err
		}
	}
	return nil
}

// EachJSON calls fn with every row of the version as JSON, shard by shard,
// until fn returns an error (io.EOF stops quietly).
func (v *Version) EachJSON(ctx context.Context, fn func(row json.RawMessage) error) error {
	var fnErr error
	err := v.EachShard(ctx, func(i int, data []byte) error {
		err := v.kind.EachJSON(data, func(row json.RawMessage) error {
			fnErr = fn(row)
			return fnErr
		})
		if err != nil && fnErr == nil {
			return fmt.Errorf("dataset %s@%s: shard %q: %w: %w", v.Dataset, v.Version, v.Shards[i].Key, err, ErrCorrupt)
		}
		return err
	})
	if errors.Is(err, io.EOF) {
		return nil
	}
	return err
}
