package store

import (
	"context"
	"crypto/rand"
	"encoding/binary"
	"encoding/hex"
	"errors"
	"fmt"
	"io"
	"io/fs"
	"os"
	"path/filepath"
	"strings"
	"syscall"
	"time"
)

// Local is a Store in a directory on a POSIX filesystem. Objects are plain
// files under the root, so a dataset can be inspected with ls and read by any
// Parquet or Arrow tool. Writes go to a temporary file under .kiln-tmp/ in the
// same root, are fsynced, and are published with rename(2) (Put) or link(2)
// (PutIfAbsent, atomic create-if-absent), followed by an fsync of the parent
// directory. Every Put, PutIfAbsent, PutIfMatch and Delete of one key
// serializes on an flock(2), so compare-and-swap is atomic across processes
// on one host and over NFS with working locks.
//
// The ETag is the file's inode, modification time and size. It is exact
// (an ETag never comes back for a key once replaced or deleted, so a stale
// PutIfMatch always fails) because, holding the key's lock, every write
// stamps the new file with a modification time strictly after that of every
// earlier version of the key: after the current file's, and after a floor
// kept in the key's lock file that Delete raises. Modification times of one
// key thus count generations, whatever the timestamp granularity (a coarse
// kernel clock gives two quick writes one mtime, and a freed inode is
// reused at once).
type Local struct {
	root string
}

var _ Store = (*Local)(nil)
var _ Sweeper = (*Local)(nil)

const localTmp = ".kiln-tmp"

// NewLocal returns a store rooted at dir. The directory is created on the
// first write.
func NewLocal(dir string) (*Local, error) {
	abs, err := filepath.Abs(dir)
	if err != nil {
		return nil, fmt.Errorf("local store %q: %w", dir, err)
	}
	return &Local{root: abs}, nil
}

// Root is the absolute directory of the store.
func (l *Local) Root() string { return l.root }

func (l *Local) URI() string { return "file://" + l.root }

func (l *Local) path(key string) (string, error) {
	if err := CheckKey(key); err != nil {
		return "", err
	}
	return filepath.Join(l.root, filepath.FromSlash(key)), nil
}

func (l *Local) info(key string, fi fs.FileInfo) Info {
	var ino uint64
	if st, ok := fi.Sys().(*syscall.Stat_t); ok {
		ino = st.Ino
	}
	return Info{
		Key:     key,
		Size:    fi.Size(),
		ModTime: fi.ModTime(),
		ETag:    fmt.Sprintf("%x-%x-%x", ino, fi.ModTime().UnixNano(), fi.Size()),
	}
}

func notExist(err error, key string) error {
	if errors.Is(err, fs.ErrNotExist) || errors.Is(err, syscall.ENOTDIR) {
		return fmt.Errorf("%q: %w", key, ErrNotExist)
	}
	return err
}

func (l *Local) Get(ctx context.Context, key string) (io.ReadCloser, Info, error) {
	p, err := l.path(key)
	if err != nil {
		return nil, Info{}, err
	}
	f, err := os.Open(p)
	if err != nil {
		return nil, Info{}, notExist(err, key)
	}
	fi, err := f.Stat()
	if err != nil {
		f.Close()
		return nil, Info{}, err
	}
	if fi.IsDir() {
		f.Close()
		return nil, Info{}, fmt.Errorf("%q: %w", key, ErrNotExist)
	}
	return f, l.info(key, fi), nil
}

func (l *Local) GetRange(ctx context.Context, key string, offset, length int64) (io.ReadCloser, error) {
	rc, info, err := l.Get(ctx, key)
	if err != nil {
		return nil, err
	}
	if offset < 0 || offset > info.Size || (offset == info.Size && info.Size > 0) {
		rc.Close()
		return nil, fmt.Errorf("range at %d of %q: object has %d bytes", offset, key, info.Size)
	}
	f := rc.(*os.File)
	if length < 0 {
		length = info.Size - offset
	}
	return struct {
		io.Reader
		io.Closer
	}{io.NewSectionReader(f, offset, length), f}, nil
}

func (l *Local) Stat(ctx context.Context, key string) (Info, error) {
	p, err := l.path(key)
	if err != nil {
		return Info{}, err
	}
	fi, err := os.Stat(p)
	if err != nil {
		return Info{}, notExist(err, key)
	}
	if fi.IsDir() {
		return Info{}, fmt.Errorf("%q: %w", key, ErrNotExist)
	}
	return l.info(key, fi), nil
}

// writeTemp writes r to a new fsynced temporary file and returns its path.
func (l *Local) writeTemp(ctx context.Context, key string, r io.Reader, size int64) (string, error) {
	dir := filepath.Join(l.root, localTmp)
	if err := os.MkdirAll(dir, 0o755); err != nil {
		return "", fmt.Errorf("local store %q: %w", l.root, err)
	}
	var rnd [8]byte
	rand.Read(rnd[:])
	// The name embeds the final key so a leftover tells what it was for.
	name := hex.EncodeToString(rnd[:]) + "-" + strings.ReplaceAll(key, "/", "%")
	if len(name) > 200 {
		name = name[:200]
	}
	tmp := filepath.Join(dir, name)
	f, err := os.OpenFile(tmp, os.O_CREATE|os.O_EXCL|os.O_WRONLY, 0o644)
	if err != nil {
		return "", err
	}
	n, err := io.Copy(f, ctxReader{ctx, r})
	if err == nil && size >= 0 && n != size {
		err = fmt.Errorf("writing %q: got %d bytes, want %d", key, n, size)
	}
	if err == nil {
		err = f.Sync()
	}
	if cerr := f.Close(); err == nil {
		err = cerr
	}
	if err != nil {
		os.Remove(tmp)
		return "", err
	}
	return tmp, nil
}

// publish makes sure the parent directory of p exists, runs op, and fsyncs
// the parent so the new directory entry survives a crash.
func publish(p string, op func() error) error {
	parent := filepath.Dir(p)
	var err error
	// A concurrent Delete may remove the parent between MkdirAll and op.
	for try := 0; try < 5; try++ {
		if err = os.MkdirAll(parent, 0o755); err != nil {
			return err
		}
		if err = op(); !errors.Is(err, fs.ErrNotExist) {
			break
		}
	}
	if err != nil {
		return err
	}
	return syncDir(parent)
}

func syncDir(dir string) error {
	d, err := os.Open(dir)
	if err != nil {
		return err
	}
	defer d.Close()
	return d.Sync()
}

func (l *Local) Put(ctx context.Context, key string, r io.Reader, size int64) (Info, error) {
	return l.putLocked(ctx, key, r, size, func(p, tmp string) error {
		return publish(p, func() error { return os.Rename(tmp, p) })
	})
}

func (l *Local) PutIfAbsent(ctx context.Context, key string, r io.Reader, size int64) (Info, error) {
	return l.putLocked(ctx, key, r, size, func(p, tmp string) error {
		err := publish(p, func() error { return os.Link(tmp, p) })
		if errors.Is(err, fs.ErrExist) {
			return fmt.Errorf("%q: %w", key, ErrExist)
		}
		return err
	})
}

func (l *Local) PutIfMatch(ctx context.Context, key string, r io.Reader, size int64, etag string) (Info, error) {
	return l.putLocked(ctx, key, r, size, func(p, tmp string) error {
		cur, err := l.Stat(ctx, key)
		if errors.Is(err, ErrNotExist) || (err == nil && (etag == "" || cur.ETag != etag)) {
			return fmt.Errorf("%q: %w", key, ErrPrecondition)
		}
		if err != nil {
			return err
		}
		return publish(p, func() error { return os.Rename(tmp, p) })
	})
}

// putLocked writes r to a temporary file, then, holding key's lock, stamps
// it after every earlier version of key (see Local) and runs publish (which
// moves it to p, or refuses), and returns the new object's Info: rename(2)
// and link(2) keep what the ETag is made of, so it is the published
// object's even if another writer replaces it at once.
func (l *Local) putLocked(ctx context.Context, key string, r io.Reader, size int64, publish func(p, tmp string) error) (Info, error) {
	p, err := l.path(key)
	if err != nil {
		return Info{}, err
	}
	tmp, err := l.writeTemp(ctx, key, r, size)
	if err != nil {
		return Info{}, err
	}
	defer os.Remove(tmp)
	lk, err := l.lock(key)
	if err != nil {
		return Info{}, err
	}
	defer lk.unlock()
	fi, err := lk.stamp(p, tmp)
	if err != nil {
		return Info{}, fmt.Errorf("writing %q: %w", key, err)
	}
	if err := publish(p, tmp); err != nil {
		return Info{}, err
	}
	lk.raise(fi.ModTime())
	return l.info(key, fi), nil
}

func (l *Local) Delete(ctx context.Context, key string) error {
	p, err := l.path(key)
	if err != nil {
		return err
	}
	lk, err := l.lock(key)
	if err != nil {
		return err
	}
	defer lk.unlock()
	if fi, err := os.Lstat(p); err == nil && fi.Mode().IsRegular() {
		// A later object at key must be stamped after this one.
		lk.raise(fi.ModTime())
	}
	if err := os.Remove(p); errors.Is(err, syscall.ENOTDIR) {
		return nil // a parent is an object, so key is absent
	} else if err != nil && !errors.Is(err, fs.ErrNotExist) {
		if fi, serr := os.Lstat(p); serr == nil && fi.IsDir() {
			return nil // a directory holds keys under a prefix; it is not an object
		}
		return err
	}
	// Tidy empty parents so listings stay fast; a concurrent writer that loses
	// its directory here retries MkdirAll in publish.
	for dir := filepath.Dir(p); dir != l.root && strings.HasPrefix(dir, l.root); dir = filepath.Dir(dir) {
		if os.Remove(dir) != nil {
			break
		}
	}
	return nil
}

// lock takes an exclusive flock for key. Lock files live under .kiln-tmp/locks
// and are never removed: removing a lock file another process holds would let
// a third process lock a different inode. A lock file also holds its keys'
// mtime floor (see Local): 8 bytes, big-endian Unix nanoseconds. Keys whose
// names hash alike share a lock file (see lockFiles) and a floor, which
// keeps each key's modification times increasing all the same.
func (l *Local) lock(key string) (keyLock, error) {
	dir := filepath.Join(l.root, localTmp, "locks")
	if err := os.MkdirAll(dir, 0o755); err != nil {
		return keyLock{}, err
	}
	f, err := os.OpenFile(filepath.Join(dir, lockName(key)), os.O_CREATE|os.O_RDWR, 0o644)
	if err != nil {
		return keyLock{}, err
	}
	if err := syscall.Flock(int(f.Fd()), syscall.LOCK_EX); err != nil {
		f.Close()
		return keyLock{}, fmt.Errorf("locking %q: %w", key, err)
	}
	return keyLock{f}, nil
}

// keyLock is a held key lock.
type keyLock struct{ f *os.File }

func (k keyLock) unlock() { k.f.Close() }

// floor is the latest modification time recorded in the lock file (0 if none).
func (k keyLock) floor() int64 {
	var b [8]byte
	if n, _ := k.f.ReadAt(b[:], 0); n < len(b) {
		return 0
	}
	return int64(binary.BigEndian.Uint64(b[:]))
}

// raise records t as the floor if it is later than the recorded one. A lost
// update (a crash before the page reaches the disk) only matters for a key
// deleted just before the crash.
func (k keyLock) raise(t time.Time) {
	if ns := t.UnixNano(); ns > k.floor() {
		var b [8]byte
		binary.BigEndian.PutUint64(b[:], uint64(ns))
		k.f.WriteAt(b[:], 0)
	}
}

// stamp gives tmp a modification time after the floor and after the object
// now at p, moving it forward by the filesystem's timestamp granularity
// (1ns, 1µs, ... 1s) when the clock has not, and returns tmp's FileInfo.
func (k keyLock) stamp(p, tmp string) (fs.FileInfo, error) {
	floor := k.floor()
	if cur, err := os.Lstat(p); err == nil && cur.ModTime().UnixNano() > floor {
		floor = cur.ModTime().UnixNano()
	}
	fi, err := os.Stat(tmp)
	for step := int64(1); err == nil && fi.ModTime().UnixNano() <= floor; step *= 1000 {
		if step > int64(time.Second) {
			return nil, fmt.Errorf("cannot stamp %q after %s: the filesystem keeps no usable modification times", tmp, time.Unix(0, floor).UTC())
		}
		t := time.Unix(0, floor+step)
		if err = os.Chtimes(tmp, t, t); err == nil {
			fi, err = os.Stat(tmp)
		}
	}
	return fi, err
}

// lockFiles is how many lock files a store has at most. Every write takes
// a lock, so one file per key would grow without bound; keys that share a
// file only wait for each other's rename, and share a floor.
const lockFiles = 1 << 12

func lockName(key string) string {
	return fmt.Sprintf("b%03x", fnv64(key)%lockFiles)
}

func fnv64(s string) uint64 {
	h := uint64(14695981039346656037)
	for i := 0; i < len(s); i++ {
		h ^= uint64(s[i])
		h *= 1099511628211
	}
	return h
}

func (l *Local) List(ctx context.Context, prefix string, fn func(Info) error) error {
	if err := checkPrefix(prefix); err != nil {
		return err
	}
	// Walk the deepest directory the prefix names completely.
	start := l.root
	if i := strings.LastIndex(prefix, "/"); i >= 0 {
		start = filepath.Join(l.root, filepath.FromSlash(prefix[:i]))
	}
	// The trailing "/." makes WalkDir descend into start when it is a
	// symlink to a directory, as a store root often is.
	walkRoot := start + string(filepath.Separator) + "."
	err := filepath.WalkDir(walkRoot, func(p string, d fs.DirEntry, err error) error {
		if err != nil {
			if errors.Is(err, fs.ErrNotExist) || errors.Is(err, syscall.ENOTDIR) {
				return nil
			}
			return err
		}
		if err := ctx.Err(); err != nil {
			return err
		}
		rel, _ := filepath.Rel(l.root, p)
		key := filepath.ToSlash(rel)
		if d.IsDir() {
			if p == walkRoot {
				return nil
			}
			if strings.HasPrefix(key, ".kiln") {
				return filepath.SkipDir
			}
			// Prune directories that cannot hold a matching key.
			if !strings.HasPrefix(key+"/", prefix) && !strings.HasPrefix(prefix, key+"/") {
				return filepath.SkipDir
			}
			return nil
		}
		if !strings.HasPrefix(key, prefix) || !d.Type().IsRegular() {
			return nil
		}
		fi, err := d.Info()
		if errors.Is(err, fs.ErrNotExist) {
			return nil // deleted while listing
		}
		if err != nil {
			return err
		}
		return fn(l.info(key, fi))
	})
	if errors.Is(err, fs.ErrNotExist) {
		return nil
	}
	return err
}

// Leftovers reports temporary files of writers that died mid-Put.
func (l *Local) Leftovers(ctx context.Context, olderThan time.Time, fn func(Info) error) error {
	entries, err := os.ReadDir(filepath.Join(l.root, localTmp))
	if errors.Is(err, fs.ErrNotExist) {
		return nil
	}
	if err != nil {
		return err
	}
	for _, e := range entries {
		if !e.Type().IsRegular() {
			continue
		}
		fi, err := e.Info()
		if err != nil || !fi.ModTime().Before(olderThan) {
			continue
		}
		if err := fn(Info{Key: localTmp + "/" + e.Name(), Size: fi.Size(), ModTime: fi.ModTime()}); err != nil {
			return err
		}
	}
	return nil
}

func (l *Local) RemoveLeftover(ctx context.Context, leftover Info) error {
	name := strings.TrimPrefix(leftover.Key, localTmp+"/")
	if name == leftover.Key || strings.Contains(name, "/") {
		return fmt.Errorf("not a leftover of %s: %q", l.URI(), leftover.Key)
	}
	err := os.Remove(filepath.Join(l.root, localTmp, name))
	if errors.Is(err, fs.ErrNotExist) {
		return nil
	}
	return err
}

// ctxReader stops a copy when the context is cancelled.
type ctxReader struct {
	ctx context.Context
	r   io.Reader
}

func (c ctxReader) Read(p []byte) (int, error) {
	if err := c.ctx.Err(); err != nil {
		return 0, err
	}
	return c.r.Read(p)
}
