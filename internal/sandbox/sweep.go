package sandbox

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"log/slog"
	"os"
	"path/filepath"
	"regexp"
	"strings"
	"syscall"
	"time"
)

// A bwrap sandbox holds host resources that outlive a process killed without
// its Close (SIGKILL, an OOM kill, a Slurm preemption): its overlay mount,
// its cgroups and its state directory. The state directory's life is what
// makes Sweep safe at any instant:
//
//   - It is created under a boot name (bootDirPrefix), locked (an exclusive
//     flock held until teardown) and only then renamed to its sandbox name
//     (stateDirPrefix). So a state directory that nobody locks has a dead
//     owner: no age or shape guess is needed.
//   - Before the sandbox mounts or creates anything it records all of it in
//     the leftovers file; releasing what was never made is a no-op.
//   - Teardown removes the directory only once everything is released, and
//     keeps the record (dropping the lock) when a release fails.
//
// Sweep releases what a dead owner left, whatever instant it died at.

// leftoversFile names, inside a state directory, what Sweep must release.
const leftoversFile = "leftovers.json"

const (
	// stateDirPrefix begins every sandbox state directory's name.
	stateDirPrefix = "kiln-sandbox-"
	// bootDirPrefix begins a state directory's name until it is locked.
	bootDirPrefix = "kiln-boot-"
)

// stateDirName is the whole name of a state directory: the prefix, the
// sandbox id and os.MkdirTemp's random suffix. Sweep touches nothing else.
var stateDirName = regexp.MustCompile(`^(` + stateDirPrefix + `|` + bootDirPrefix + `)[0-9a-f]{12}-[0-9]+$`)

// bootDirMinAge spares an unlocked boot directory younger than this: its
// owner may be between creating and locking it.
const bootDirMinAge = time.Minute

// leftovers is the record of a sandbox's host resources.
type leftovers struct {
	Merged  string   `json:"merged,omitempty"` // the overlay mount point
	Fuse    bool     `json:"fuse,omitempty"`   // mounted by fuse-overlayfs
	Cgroups []string `json:"cgroups,omitempty"`
}

// makeState creates sandbox id's state directory in stateDir and returns
// it with its lock held; the descriptor stays open until teardown closes it.
func makeState(stateDir, id string) (string, *os.File, error) {
	if stateDir == "" {
		stateDir = os.TempDir()
	}
	boot, err := os.MkdirTemp(stateDir, bootDirPrefix+id+"-")
	if err != nil {
		return "", nil, fmt.Errorf("sandbox state dir: %w", err)
	}
	f, err := os.Open(boot)
	if err == nil {
		err = syscall.Flock(int(f.Fd()), syscall.LOCK_EX|syscall.LOCK_NB)
		if err != nil {
			f.Close()
		}
	}
	if err != nil {
		os.Remove(boot)
		return "", nil, fmt.Errorf("lock sandbox state %q: %w", boot, err)
	}
	state := filepath.Join(stateDir, stateDirPrefix+strings.TrimPrefix(filepath.Base(boot), bootDirPrefix))
	if err := os.Rename(boot, state); err != nil {
		f.Close()
		os.Remove(boot)
		return "", nil, fmt.Errorf("sandbox state dir: %w", err)
	}
	return state, f, nil
}

// writeLeftovers records what Sweep must release if the owner dies.
func writeLeftovers(state string, l leftovers) error {
	b, err := json.Marshal(l)
	if err != nil {
		return err
	}
	tmp := filepath.Join(state, leftoversFile+".tmp")
	if err := os.WriteFile(tmp, b, 0o600); err != nil {
		return fmt.Errorf("record sandbox leftovers: %w", err)
	}
	return os.Rename(tmp, filepath.Join(state, leftoversFile))
}

// Sweep releases the overlay mounts, cgroups and state directories that
// bwrap sandboxes in stateDir (os.TempDir() if "") left when their owning
// process died without closing them. Sandboxes that are alive, in any
// process, are left alone: each holds a lock on its state directory. It
// returns how many dead sandboxes it released. Run it where sandboxes are
// booted, before booting (kiln-grade and kiln-rollout do, at start).
func Sweep(ctx context.Context, stateDir string, log *slog.Logger) (int, error) {
	if stateDir == "" {
		stateDir = os.TempDir()
	}
	if log == nil {
		log = slog.Default()
	}
	entries, err := os.ReadDir(stateDir)
	if err != nil {
		return 0, fmt.Errorf("sweep sandboxes in %q: %w", stateDir, err)
	}
	n := 0
	var errs []error
	for _, e := range entries {
		if ctx.Err() != nil {
			return n, ctx.Err()
		}
		if !e.IsDir() || !stateDirName.MatchString(e.Name()) {
			continue
		}
		dir := filepath.Join(stateDir, e.Name())
		swept, err := sweepOne(dir, strings.HasPrefix(e.Name(), bootDirPrefix))
		if err != nil {
			errs = append(errs, err)
			continue
		}
		if swept {
			log.Info("released a dead sandbox's leftovers", "state", dir)
			n++
		}
	}
	return n, errors.Join(errs...)
}

// sweepOne releases dir's sandbox if its owner is gone.
func sweepOne(dir string, boot bool) (bool, error) {
	f, err := os.Open(dir)
	if err != nil {
		return false, nil // gone meanwhile, or not ours to read
	}
	defer f.Close()
	if err := syscall.Flock(int(f.Fd()), syscall.LOCK_EX|syscall.LOCK_NB); err != nil {
		return false, nil // alive (or being swept by another process)
	}
	if boot {
		// Its owner died before locking it, or is about to lock it; either
		// way it holds nothing yet.
		fi, err := f.Stat()
		if err != nil || time.Since(fi.ModTime()) < bootDirMinAge {
			return false, nil
		}
		return os.Remove(dir) == nil, nil
	}
	var l leftovers
	b, err := os.ReadFile(filepath.Join(dir, leftoversFile))
	switch {
	case err == nil:
		if err := json.Unmarshal(b, &l); err != nil {
			return false, fmt.Errorf("sandbox leftovers %q: %w", dir, err)
		}
	case errors.Is(err, os.ErrNotExist):
		// Died before recording (it holds nothing yet) or while teardown
		// removed the directory (it released everything first). Only the
		// mount point can be there, and it is checked below.
		l.Merged = filepath.Join(dir, "merged")
	default:
		return false, fmt.Errorf("sandbox leftovers %q: %w", dir, err)
	}
	var errs []error
	if mountPoint(l.Merged) {
		if err := (&overlay{merged: l.Merged, fuse: l.Fuse}).unmount(); err != nil {
			errs = append(errs, err)
		}
	}
	if err := (&cgroup{dirs: l.Cgroups}).remove(); err != nil {
		errs = append(errs, err)
	}
	if len(errs) > 0 {
		// Keep the record: a later sweep tries again.
		return false, fmt.Errorf("release sandbox %q: %w", dir, errors.Join(errs...))
	}
	if err := os.RemoveAll(dir); err != nil {
		return false, fmt.Errorf("remove sandbox state %q: %w", dir, err)
	}
	return true, nil
}

// mountPoint reports whether something is mounted at path: a mount's root
// lies on another device than its parent directory (or, a FUSE mount whose
// server died, cannot be looked at).
func mountPoint(path string) bool {
	if path == "" {
		return false
	}
	var st, parent syscall.Stat_t
	if err := syscall.Lstat(path, &st); err != nil {
		return errors.Is(err, syscall.ENOTCONN)
	}
	if syscall.Lstat(filepath.Dir(path), &parent) != nil {
		return false
	}
	return st.Dev != parent.Dev
}
