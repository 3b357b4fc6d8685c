package sandbox

import (
	"context"
	"os"
	"path/filepath"
	"syscall"
	"testing"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
)

// A sandbox's owner can die at any instant of its state directory's life
// (sweep.go); whichever it was, Sweep releases the directory at once if
// nobody holds it, and spares what is alive or not a sandbox's.
func TestSweepCrashInstants(t *testing.T) {
	const id = "0123456789ab"
	cases := []struct {
		name string
		// make builds the directory as the owner left it, in state.
		make     func(t *testing.T, state string) string
		released int
		kept     bool
		wantErr  bool
	}{
		{name: "locked, nothing made", released: 1, make: func(t *testing.T, state string) string {
			return mkState(t, state, stateDirPrefix+id+"-1")
		}},
		{name: "locked, layers made, nothing recorded", released: 1, make: func(t *testing.T, state string) string {
			dir := mkState(t, state, stateDirPrefix+id+"-2")
			for _, d := range []string{"upper", "work", "merged"} {
				require.NoError(t, os.Mkdir(filepath.Join(dir, d), 0o700))
			}
			return dir
		}},
		{name: "recorded, nothing mounted or created", released: 1, make: func(t *testing.T, state string) string {
			dir := mkState(t, state, stateDirPrefix+id+"-3")
			merged := filepath.Join(dir, "merged")
			require.NoError(t, os.Mkdir(merged, 0o700))
			require.NoError(t, writeLeftovers(dir, leftovers{Merged: merged,
				Cgroups: []string{filepath.Join(state, "no-such-cgroup")}}))
			return dir
		}},
		{name: "mounted, then teardown removed the record", released: 1, make: func(t *testing.T, state string) string {
			if os.Geteuid() != 0 {
				t.Skip("mounting needs root")
			}
			dir := mkState(t, state, stateDirPrefix+id+"-4")
			merged := filepath.Join(dir, "merged")
			require.NoError(t, os.Mkdir(merged, 0o700))
			require.NoError(t, syscall.Mount("tmpfs", merged, "tmpfs", 0, "size=1m"))
			t.Cleanup(func() { _ = syscall.Unmount(merged, syscall.MNT_DETACH) })
			require.True(t, mountPoint(merged))
			return dir
		}},
		{name: "teardown half done", released: 1, make: func(t *testing.T, state string) string {
			dir := mkState(t, state, stateDirPrefix+id+"-5")
			require.NoError(t, os.Mkdir(filepath.Join(dir, "work"), 0o700))
			return dir
		}},
		{name: "boot name, just made", kept: true, make: func(t *testing.T, state string) string {
			return mkState(t, state, bootDirPrefix+id+"-6")
		}},
		{name: "boot name, owner long dead", released: 1, make: func(t *testing.T, state string) string {
			dir := mkState(t, state, bootDirPrefix+id+"-7")
			old := time.Now().Add(-2 * bootDirMinAge)
			require.NoError(t, os.Chtimes(dir, old, old))
			return dir
		}},
		{name: "alive", kept: true, make: func(t *testing.T, state string) string {
			dir, f, err := makeState(state, id)
			require.NoError(t, err)
			t.Cleanup(func() { f.Close() })
			return dir
		}},
		{name: "not a sandbox's", kept: true, make: func(t *testing.T, state string) string {
			return mkState(t, state, stateDirPrefix+"notes")
		}},
		{name: "record unreadable", kept: true, wantErr: true, make: func(t *testing.T, state string) string {
			dir := mkState(t, state, stateDirPrefix+id+"-8")
			require.NoError(t, os.WriteFile(filepath.Join(dir, leftoversFile), []byte("{"), 0o600))
			return dir
		}},
	}
	for _, c := range cases {
		t.Run(c.name, func(t *testing.T) {
			state := t.TempDir()
			dir := c.make(t, state)
			n, err := Sweep(context.Background(), state, nil)
			if c.wantErr {
				require.Error(t, err)
				assert.Contains(t, err.Error(), dir)
			} else {
				require.NoError(t, err)
			}
			assert.Equal(t, c.released, n)
			if c.kept {
				assert.DirExists(t, dir)
			} else {
				assert.NoDirExists(t, dir)
			}
		})
	}
}

// makeState hands over a locked directory under its sandbox name and
// leaves no boot directory behind.
func TestMakeState(t *testing.T) {
	state := t.TempDir()
	dir, f, err := makeState(state, "0123456789ab")
	require.NoError(t, err)
	defer f.Close()
	assert.Equal(t, state, filepath.Dir(dir))
	assert.Regexp(t, stateDirName, filepath.Base(dir))
	entries, err := os.ReadDir(state)
	require.NoError(t, err)
	require.Len(t, entries, 1, "a boot directory was left")
	g, err := os.Open(dir)
	require.NoError(t, err)
	defer g.Close()
	assert.Error(t, syscall.Flock(int(g.Fd()), syscall.LOCK_EX|syscall.LOCK_NB), "the state directory is not locked")
}

func mkState(t *testing.T, state, name string) string {
	dir := filepath.Join(state, name)
	require.NoError(t, os.Mkdir(dir, 0o700))
	return dir
}
