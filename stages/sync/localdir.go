package sync

import (
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"io/fs"
	"log/slog"
	"os"
	"path/filepath"
	"regexp"
	"strings"
	"time"

	"golang.org/x/sys/unix"
)

// The local directory a pull fills (docs/sync.md §2):
//
//	DIR/state.json        which version DIR holds (stateFile)
//	DIR/NNNNNN-<id>/      a version's model directory, never modified once in place
//	DIR/current           symlink to the held one, swapped after state.json
//	DIR/.lock             flock: pulls on one host run one at a time
//	DIR/.staging-*/       a pull in progress (removed by the next pull)
const (
	stateFile     = "state.json"
	stateFormat   = "kiln.weights-state/v1"
	currentLink   = "current"
	lockFile      = ".lock"
	stagingPrefix = ".staging-"
	// tmpPrefix starts the temporary names of state.json and current
	// while they are replaced; the next pull removes any left behind.
	tmpPrefix = ".tmp-"
)

// localState is DIR/state.json: the version DIR holds. It is written
// (temp, fsync, rename, fsync DIR) only after that version's directory
// is complete and in place, so it never names a partial one.
type localState struct {
	Format  string `json:"format"`
	Dataset string `json:"dataset"`
	Version string `json:"version"`
	Number  int64  `json:"number"`
	// Dir is the version's directory, relative to DIR (versionDirName).
	Dir string `json:"dir"`
}

// holds reports whether the state names version of dataset name.
func (s *localState) holds(name, version string) bool {
	return s != nil && s.Dataset == name && s.Version == version
}

// versionDirName is the directory of weights number n, version id: six
// digits at least, so the directories list in number order.
func versionDirName(n int64, id string) string { return fmt.Sprintf("%06d-%s", n, id) }

// versionDirRE matches versionDirName's names: the number, then the id.
var versionDirRE = regexp.MustCompile(`^([0-9]{6,})-[A-Za-z0-9][A-Za-z0-9._-]*$`)

// heldVersion reads DIR/state.json: the version dir holds, and its model
// directory (DIR/<state.Dir>, the path an engine loads). No state yet
// (a fresh or absent DIR) is (nil, "", nil). A state that cannot be read
// or parsed, or that names a directory that is not there, is an error
// naming the file: nothing in DIR is then trusted. A publisher uses it to
// find a verified copy of its base (docs/sync.md §1.1 --base-dir): the
// bytes are those of state.Dataset@state.Version, checked when they were
// pulled, and the directory is never modified once in place.
func heldVersion(dir string) (state *localState, modelDir string, err error) {
	path := filepath.Join(dir, stateFile)
	data, err := os.ReadFile(path)
	if errors.Is(err, fs.ErrNotExist) {
		return nil, "", nil
	}
	if err != nil {
		return nil, "", fmt.Errorf("weights directory %q: reading %s: %w", dir, stateFile, err)
	}
	var s localState
	dec := json.NewDecoder(bytes.NewReader(data))
	dec.DisallowUnknownFields()
	if err := dec.Decode(&s); err != nil {
		return nil, "", fmt.Errorf("weights directory %q: %s is not a %s state: %w; remove it and pull again (the next pull starts from a full version)", dir, stateFile, stateFormat, err)
	}
	if s.Format != stateFormat {
		return nil, "", fmt.Errorf("weights directory %q: %s has format %q, want %q: written by another kiln; pull into another --to", dir, stateFile, s.Format, stateFormat)
	}
	if m := versionDirRE.FindStringSubmatch(s.Dir); m == nil || s.Dir != versionDirName(s.Number, s.Version) {
		return nil, "", fmt.Errorf("weights directory %q: %s names directory %q, want %q: remove %s and pull again", dir, stateFile, s.Dir, versionDirName(s.Number, s.Version), stateFile)
	}
	modelDir = filepath.Join(dir, s.Dir)
	fi, err := os.Stat(modelDir)
	if err != nil || !fi.IsDir() {
		if err == nil {
			err = errors.New("not a directory")
		}
		return nil, "", fmt.Errorf("weights directory %q: %s names %s@%s in %q, which is not there (%w): remove %s and pull again", dir, stateFile, s.Dataset, s.Version, modelDir, err, stateFile)
	}
	return &s, modelDir, nil
}

// writeState replaces DIR/state.json atomically and durably: a temporary
// file is written and fsynced, renamed over state.json, and DIR fsynced,
// so a crash leaves the old state or the new one, never a torn file.
func writeState(dir string, s localState) error {
	s.Format = stateFormat
	data, err := json.MarshalIndent(s, "", "  ")
	if err != nil {
		return err
	}
	data = append(data, '\n')
	f, err := os.CreateTemp(dir, tmpPrefix+"state-*")
	if err != nil {
		return fmt.Errorf("weights directory %q: writing %s: %w", dir, stateFile, err)
	}
	tmp := f.Name()
	_, err = f.Write(data)
	if err == nil {
		err = f.Sync()
	}
	if cerr := f.Close(); err == nil {
		err = cerr
	}
	if err == nil {
		err = os.Rename(tmp, filepath.Join(dir, stateFile))
	}
	if err != nil {
		os.Remove(tmp)
		return fmt.Errorf("weights directory %q: writing %s: %w", dir, stateFile, err)
	}
	return syncDir(dir)
}

// swapCurrent points DIR/current at target (a name in DIR) atomically: a
// new symlink is made under a temporary name and renamed over current,
// so a reader of current sees the old target or the new one.
func swapCurrent(dir, target string) error {
	link := filepath.Join(dir, currentLink)
	if got, err := os.Readlink(link); err == nil && got == target {
		return nil
	}
	tmp := filepath.Join(dir, fmt.Sprintf("%scurrent-%d-%d", tmpPrefix, os.Getpid(), time.Now().UnixNano()))
	if err := os.Symlink(target, tmp); err != nil {
		return fmt.Errorf("weights directory %q: pointing %s at %s: %w", dir, currentLink, target, err)
	}
	if err := os.Rename(tmp, link); err != nil {
		os.Remove(tmp)
		return fmt.Errorf("weights directory %q: pointing %s at %s: %w", dir, currentLink, target, err)
	}
	return syncDir(dir)
}

// syncDir fsyncs a directory, making the renames in it durable.
func syncDir(dir string) error {
	d, err := os.Open(dir)
	if err != nil {
		return fmt.Errorf("fsync %q: %w", dir, err)
	}
	defer d.Close()
	if err := d.Sync(); err != nil {
		return fmt.Errorf("fsync %q: %w", dir, err)
	}
	return nil
}

// lockLocal takes the exclusive flock on DIR/.lock, waiting for another
// pull on this host to finish (logging once that it waits) until ctx
// ends. The lock goes with the process: a killed pull releases it.
func lockLocal(ctx context.Context, dir string, log *slog.Logger) (unlock func(), err error) {
	path := filepath.Join(dir, lockFile)
	f, err := os.OpenFile(path, os.O_RDWR|os.O_CREATE, 0o644)
	if err != nil {
		return nil, fmt.Errorf("weights directory %q: opening the lock %s: %w", dir, lockFile, err)
	}
	waited := false
	for {
		err := unix.Flock(int(f.Fd()), unix.LOCK_EX|unix.LOCK_NB)
		if err == nil {
			break
		}
		if !errors.Is(err, unix.EWOULDBLOCK) && !errors.Is(err, unix.EINTR) {
			f.Close()
			return nil, fmt.Errorf("weights directory %q: locking %s: %w", dir, lockFile, err)
		}
		if !waited {
			waited = true
			log.Info("another pull holds the directory; waiting for it", "dir", dir)
		}
		select {
		case <-ctx.Done():
			f.Close()
			return nil, fmt.Errorf("weights directory %q: waiting for another pull's lock: %w", dir, context.Cause(ctx))
		case <-time.After(20 * time.Millisecond):
		}
	}
	return func() {
		unix.Flock(int(f.Fd()), unix.LOCK_UN)
		f.Close()
	}, nil
}

// removeLeftovers removes what killed pulls left in DIR: staging
// directories and temporary names. Call it holding the lock: no other
// pull is then running.
func removeLeftovers(dir string) error {
	ents, err := os.ReadDir(dir)
	if err != nil {
		return fmt.Errorf("weights directory %q: %w", dir, err)
	}
	for _, e := range ents {
		if n := e.Name(); strings.HasPrefix(n, stagingPrefix) || strings.HasPrefix(n, tmpPrefix) {
			if err := os.RemoveAll(filepath.Join(dir, n)); err != nil {
				return fmt.Errorf("weights directory %q: removing a killed pull's %q: %w", dir, n, err)
			}
		}
	}
	return nil
}

// pruneVersions deletes the version directories of DIR other than keep
// (the new one and the one held before it, which an engine may still
// serve): older versions, and any a pull killed between its rename and
// its state left behind. Only names of versionDirName's form are
// touched. A directory that cannot be removed is logged, not fatal: the
// switch has happened.
func pruneVersions(dir string, log *slog.Logger, keep ...string) {
	ents, err := os.ReadDir(dir)
	if err != nil {
		log.Warn("listing old weights versions to delete", "dir", dir, "err", err)
		return
	}
	for _, e := range ents {
		n := e.Name()
		if !e.IsDir() || versionDirRE.FindStringSubmatch(n) == nil || contains(keep, n) {
			continue
		}
		if err := removeTree(filepath.Join(dir, n)); err != nil {
			log.Warn("deleting an old weights version", "dir", filepath.Join(dir, n), "err", err)
			continue
		}
		log.Debug("deleted an old weights version", "dir", filepath.Join(dir, n))
	}
}

// removeTree removes a version directory: first renamed to a staging
// name, so a crash halfway never leaves a partial directory under a
// version's name.
func removeTree(path string) error {
	tmp := filepath.Join(filepath.Dir(path), stagingPrefix+"rm-"+filepath.Base(path))
	if err := os.Rename(path, tmp); err != nil {
		return err
	}
	return os.RemoveAll(tmp)
}

func contains(list []string, s string) bool {
	for _, x := range list {
		if x == s {
			return true
		}
	}
	return false
}

// cloneFile makes dst a copy of src: a reflink (FICLONE) where the
// filesystem shares extents, else a byte copy. dst is created (mode
// 0644), never src written; dst is not fsynced here.
func cloneFile(src, dst string) (reflinked bool, err error) {
	in, err := os.Open(src)
	if err != nil {
		return false, err
	}
	defer in.Close()
	out, err := os.OpenFile(dst, os.O_WRONLY|os.O_CREATE|os.O_EXCL, 0o644)
	if err != nil {
		return false, err
	}
	if unix.IoctlFileClone(int(out.Fd()), int(in.Fd())) == nil {
		return true, out.Close()
	}
	_, err = io.Copy(out, in)
	if cerr := out.Close(); err == nil {
		err = cerr
	}
	return false, err
}
