package sync

import (
	"context"
	"log/slog"
	"os"
	"path/filepath"
	"testing"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
)

// TestStateRoundTrip: state.json is written whole and read back; a state
// naming a directory that is not there, or of another format, is refused
// naming the file; no state is (nil, "", nil).
func TestStateRoundTrip(t *testing.T) {
	dir := t.TempDir()
	s, md, err := heldVersion(dir)
	require.NoError(t, err)
	assert.Nil(t, s)
	assert.Empty(t, md)

	want := localState{Dataset: "weights/m", Version: "v-abc", Number: 7, Dir: versionDirName(7, "v-abc")}
	require.NoError(t, writeState(dir, want))
	_, _, err = heldVersion(dir)
	require.ErrorContains(t, err, "000007-v-abc", "the directory it names is not there")

	require.NoError(t, os.Mkdir(filepath.Join(dir, want.Dir), 0o755))
	s, md, err = heldVersion(dir)
	require.NoError(t, err)
	want.Format = stateFormat
	assert.Equal(t, want, *s)
	assert.Equal(t, filepath.Join(dir, "000007-v-abc"), md)
	data, err := os.ReadFile(filepath.Join(dir, stateFile))
	require.NoError(t, err)
	assert.Contains(t, string(data), `"format": "kiln.weights-state/v1"`)

	require.NoError(t, os.WriteFile(filepath.Join(dir, stateFile), []byte(`{"format":"other/v9"}`), 0o644))
	_, _, err = heldVersion(dir)
	require.ErrorContains(t, err, "other/v9")
	leftovers, _ := filepath.Glob(filepath.Join(dir, tmpPrefix+"*"))
	assert.Empty(t, leftovers, "no temporary state left behind")
}

// TestSwapCurrent: current is replaced, never removed first: it always
// resolves to one of the two targets.
func TestSwapCurrent(t *testing.T) {
	dir := t.TempDir()
	for _, d := range []string{"000001-a", "000002-b"} {
		require.NoError(t, os.Mkdir(filepath.Join(dir, d), 0o755))
	}
	require.NoError(t, swapCurrent(dir, "000001-a"))
	stop := make(chan struct{})
	seen := make(chan error, 1)
	go func() {
		for {
			select {
			case <-stop:
				seen <- nil
				return
			default:
			}
			if got, err := os.Readlink(filepath.Join(dir, currentLink)); err != nil || (got != "000001-a" && got != "000002-b") {
				seen <- assert.AnError
				return
			}
		}
	}()
	for i := 0; i < 200; i++ {
		require.NoError(t, swapCurrent(dir, []string{"000001-a", "000002-b"}[i%2]))
	}
	close(stop)
	require.NoError(t, <-seen, "current was missing or dangling during a swap")
}

// TestLockLocal: a second locker waits until the first unlocks, and gives
// up when its context ends.
func TestLockLocal(t *testing.T) {
	dir := t.TempDir()
	log := slog.New(slog.DiscardHandler)
	unlock, err := lockLocal(context.Background(), dir, log)
	require.NoError(t, err)
	ctx, cancel := context.WithTimeout(context.Background(), 100*time.Millisecond)
	defer cancel()
	_, err = lockLocal(ctx, dir, log)
	require.Error(t, err, "locked twice")
	got := make(chan func(), 1)
	go func() {
		u, err := lockLocal(context.Background(), dir, log)
		if err == nil {
			got <- u
		}
	}()
	select {
	case <-got:
		t.Fatal("second lock taken while the first is held")
	case <-time.After(50 * time.Millisecond):
	}
	unlock()
	select {
	case u := <-got:
		u()
	case <-time.After(5 * time.Second):
		t.Fatal("second lock not taken after unlock")
	}
}

// TestPruneVersions: only version directories other than the kept ones
// go; other names are left alone.
func TestPruneVersions(t *testing.T) {
	dir := t.TempDir()
	for _, d := range []string{"000001-a", "000002-b", "000003-c", "000004-d", "notes", "current-x"} {
		require.NoError(t, os.Mkdir(filepath.Join(dir, d), 0o755))
	}
	pruneVersions(dir, slog.New(slog.DiscardHandler), "000003-c", "000004-d")
	ents, err := os.ReadDir(dir)
	require.NoError(t, err)
	var names []string
	for _, e := range ents {
		names = append(names, e.Name())
	}
	assert.ElementsMatch(t, []string{"000003-c", "000004-d", "notes", "current-x"}, names)
	assert.Equal(t, int64(3), versionNumber("000003-c"))
	assert.Equal(t, int64(-1), versionNumber("notes"))
}
