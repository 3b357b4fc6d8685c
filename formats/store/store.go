// Package store is kiln's narrow object-storage interface: a flat namespace of
// immutable-by-convention objects addressed by slash-separated keys, served by a
// local directory or an S3 bucket. Everything above it (datasets, versions,
// receipts, locks) is built from these few operations, so both back ends behave
// the same for every stage.
package store

import (
	"context"
	"errors"
	"fmt"
	"io"
	"strings"
	"time"
)

// Store is the contract every back end implements. Keys are relative,
// slash-separated, without empty, "." or ".." segments; a key must not begin
// with ".kiln", which back ends reserve for their own bookkeeping.
//
// Every method is safe for concurrent use by many goroutines and by many
// processes (and, for S3, many hosts) sharing the same location. Errors for
// absent objects satisfy errors.Is(err, ErrNotExist); a failed condition
// satisfies ErrExist (PutIfAbsent) or ErrPrecondition (PutIfMatch). Any other
// error may be transient: callers may retry.
type Store interface {
	// Get opens the whole object at key. The returned Info describes exactly
	// the bytes the reader yields, even if the object is replaced meanwhile.
	Get(ctx context.Context, key string) (io.ReadCloser, Info, error)

	// GetRange opens length bytes starting at offset; length < 0 reads to the
	// end. A range that starts beyond the object's end is an error.
	GetRange(ctx context.Context, key string, offset, length int64) (io.ReadCloser, error)

	// Put writes the object, replacing any existing one. size is the number of
	// bytes r yields, or -1 if unknown. Readers observe the old object or the
	// new one, never a partial write; a crash mid-Put leaves at most
	// leftovers (see Sweeper), never a truncated object at key.
	Put(ctx context.Context, key string, r io.Reader, size int64) (Info, error)

	// PutIfAbsent writes the object only if no object exists at key, atomically
	// with respect to every other writer of the same key (S3: If-None-Match: *;
	// local disk: link(2)). It returns ErrExist, writing nothing, otherwise.
	PutIfAbsent(ctx context.Context, key string, r io.Reader, size int64) (Info, error)

	// PutIfMatch replaces the object only if its current ETag equals etag
	// (S3: If-Match). It returns ErrPrecondition, writing nothing, if the
	// object changed or does not exist. This is the compare-and-swap used for
	// pointers that move.
	PutIfMatch(ctx context.Context, key string, r io.Reader, size int64, etag string) (Info, error)

	// Delete removes the object. Deleting an absent object is not an error.
	Delete(ctx context.Context, key string) error

	// List calls fn once for every object whose key starts with prefix, in no
	// particular order, in the caller's goroutine. It stops at, and returns,
	// the first error fn returns. Objects written or deleted during the listing
	// may or may not be reported.
	List(ctx context.Context, prefix string, fn func(Info) error) error

	// Stat describes the object at key without reading it.
	Stat(ctx context.Context, key string) (Info, error)

	// URI names the location, in the form Open accepts.
	URI() string
}

// Info describes one stored object.
type Info struct {
	Key  string // relative to the store's root
	Size int64
	// ETag changes whenever the object at Key is replaced by different
	// bytes (S3 may keep it when they are identical: a single PUT's ETag is
	// their MD5), and once replaced or deleted an object's ETag never
	// comes back at its key, so PutIfMatch with a stale ETag always fails.
	// It is opaque: on S3 it is the server's ETag, on local disk it is
	// derived from the file's identity, size and modification time, which
	// Local keeps strictly increasing per key (see Local).
	ETag string
	// ModTime is the store's own clock at the time the object was written
	// (S3 Last-Modified; local file mtime), never the writer's clock.
	ModTime time.Time
}

// Sweeper is implemented by stores that can leave bookkeeping behind when a
// writer dies mid-Put: temporary files on local disk, incomplete multipart
// uploads on S3. Leftovers are invisible to Get and List.
type Sweeper interface {
	// Leftovers calls fn for each leftover last touched before olderThan.
	Leftovers(ctx context.Context, olderThan time.Time, fn func(Info) error) error
	// RemoveLeftover removes one leftover reported by Leftovers.
	RemoveLeftover(ctx context.Context, leftover Info) error
}

var (
	// ErrNotExist: the object does not exist.
	ErrNotExist = errors.New("object does not exist")
	// ErrExist: PutIfAbsent found an object at the key.
	ErrExist = errors.New("object already exists")
	// ErrPrecondition: PutIfMatch found a different ETag, or no object.
	ErrPrecondition = errors.New("object changed or is absent")
	// ErrInvalidKey: the key is not a well-formed store key.
	ErrInvalidKey = errors.New("invalid key")
)

// CheckKey reports whether key is a well-formed object key.
func CheckKey(key string) error {
	if key == "" {
		return fmt.Errorf("%w: empty key", ErrInvalidKey)
	}
	if strings.HasPrefix(key, ".kiln") {
		return fmt.Errorf("%w %q: keys beginning with .kiln are reserved", ErrInvalidKey, key)
	}
	for _, seg := range strings.Split(key, "/") {
		switch seg {
		case "", ".", "..":
			return fmt.Errorf("%w %q: empty, \".\" or \"..\" path segment", ErrInvalidKey, key)
		}
	}
	if strings.ContainsAny(key, "\x00\\") {
		return fmt.Errorf("%w %q: NUL or backslash", ErrInvalidKey, key)
	}
	return nil
}

// checkPrefix accepts "" and any prefix of a valid key (a trailing slash included).
func checkPrefix(prefix string) error {
	if prefix == "" {
		return nil
	}
	return CheckKey(prefix + "x")
}

// ReadAll reads the whole object at key.
func ReadAll(ctx context.Context, s Store, key string) ([]byte, Info, error) {
	rc, info, err := s.Get(ctx, key)
	if err != nil {
		return nil, Info{}, err
	}
	defer rc.Close()
	buf := make([]byte, 0, max(info.Size, 0))
	w := bytesWriter{&buf}
	if _, err := io.Copy(w, rc); err != nil {
		return nil, Info{}, fmt.Errorf("reading %q from %s: %w", key, s.URI(), err)
	}
	return buf, info, nil
}

type bytesWriter struct{ b *[]byte }

func (w bytesWriter) Write(p []byte) (int, error) { *w.b = append(*w.b, p...); return len(p), nil }
