package sandbox

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"log/slog"
	"os"
	"path/filepath"
	"strings"
	"syscall"
	"time"
)

// A bwrap sandbox holds host resources that outlive a process killed without
// its Close (SIGKILL, an OOM kill, a Slurm preemption): its overlay mount,
// its cgroups and its state directory. Each sandbox therefore holds an
// exclusive flock on its state directory for its whole life and records
// what to release in the directory's leftovers file as soon as it holds
// them; Sweep releases what a dead owner left.

// leftoversFile names, inside a state directory, what Sweep must release.
const leftoversFile = "leftovers.json"

// stateDirPrefix begins every sandbox state directory's name.
const stateDirPrefix = "kiln-sandbox-"

// sweepMinAge spares a directory with no leftovers file younger than this:
// a booting sandbox creates its directory just before it locks it.
const sweepMinAge = time.Minute

// leftovers is the record of a sandbox's host resources.
type leftovers struct {
	Merged  string   `json:"merged,omitempty"` // the overlay mount point
	Fuse    bool     `json:"fuse,omitempty"`   // mounted by fuse-overlayfs
	Cgroups []string `json:"cgroups,omitempty"`
}

// lockState takes the state directory's lock for the sandbox's life (the
// descriptor stays open until teardown closes it).
func lockState(dir *os.File) error {
	if err := syscall.Flock(int(dir.Fd()), syscall.LOCK_EX|syscall.LOCK_NB); err != nil {
		return fmt.Errorf("lock sandbox state %q: %w", dir.Name(), err)
	}
	return nil
}

// writeLeftovers records what Sweep must release if the owner dies.
func writeLeftovers(state string, ov *overlay, cg *cgroup) error {
	var l leftovers
	if ov != nil {
		l.Merged, l.Fuse = ov.merged, ov.fuse
	}
	if cg != nil {
		l.Cgroups = cg.dirs
	}
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
// booted, before booting (kiln-grade does, at start).
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
		if !e.IsDir() || !strings.HasPrefix(e.Name(), stateDirPrefix) {
			continue
		}
		dir := filepath.Join(stateDir, e.Name())
		swept, err := sweepOne(dir)
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
func sweepOne(dir string) (bool, error) {
	f, err := os.Open(dir)
	if err != nil {
		return false, nil // gone meanwhile, or not ours to read
	}
	defer f.Close()
	if err := syscall.Flock(int(f.Fd()), syscall.LOCK_EX|syscall.LOCK_NB); err != nil {
		return false, nil // alive (or being swept by another process)
	}
	var l leftovers
	b, err := os.ReadFile(filepath.Join(dir, leftoversFile))
	switch {
	case err == nil:
		if err := json.Unmarshal(b, &l); err != nil {
			return false, fmt.Errorf("sandbox leftovers %q: %w", dir, err)
		}
	case errors.Is(err, os.ErrNotExist):
		fi, err := f.Stat()
		if err != nil || time.Since(fi.ModTime()) < sweepMinAge {
			return false, nil // possibly still booting
		}
		// Only what has a sandbox's shape: the prefix alone is no proof.
		for _, sub := range []string{"upper", "work", "merged"} {
			if fi, err := os.Lstat(filepath.Join(dir, sub)); err != nil || !fi.IsDir() {
				return false, nil
			}
		}
		// Died before it recorded anything: only the mount point can be
		// there (and only mounted for an instant).
		l.Merged = filepath.Join(dir, "merged")
	default:
		return false, fmt.Errorf("sandbox leftovers %q: %w", dir, err)
	}
	var errs []error
	if _, err := os.Lstat(l.Merged); err == nil {
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
