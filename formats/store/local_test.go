package store_test

import (
	"bytes"
	"os"
	"path/filepath"
	"testing"
	"time"

	"github.com/stretchr/testify/require"

	"github.com/kilnrl/kiln/formats/store"
	"github.com/kilnrl/kiln/formats/store/storetest"
)

func newLocal(t *testing.T, dir string) *store.Local {
	t.Helper()
	l, err := store.NewLocal(dir)
	require.NoError(t, err)
	return l
}

func TestLocalConformance(t *testing.T) {
	storetest.Run(t, func(t *testing.T) store.Store {
		// A root that does not exist yet: it is created on the first write.
		return newLocal(t, filepath.Join(t.TempDir(), "store"))
	})
}

// A store root that is a symlink to the real directory (a common way to put
// ./data on a bigger disk) must behave the same.
func TestLocalSymlinkRoot(t *testing.T) {
	storetest.Run(t, func(t *testing.T) store.Store {
		dir := t.TempDir()
		real := filepath.Join(dir, "real")
		require.NoError(t, os.Mkdir(real, 0o755))
		link := filepath.Join(dir, "link")
		require.NoError(t, os.Symlink(real, link))
		return newLocal(t, link)
	})
}

// Objects are plain files under the root, readable by any tool.
func TestLocalLayout(t *testing.T) {
	ctx := t.Context()
	root := t.TempDir()
	l := newLocal(t, root)
	_, err := l.Put(ctx, "ds/v1/part-0.parquet", bytes.NewReader([]byte("PAR1")), 4)
	require.NoError(t, err)
	b, err := os.ReadFile(filepath.Join(root, "ds", "v1", "part-0.parquet"))
	require.NoError(t, err)
	require.Equal(t, "PAR1", string(b))
	require.Equal(t, "file://"+root, l.URI())
	require.Equal(t, root, l.Root())
}

// Leftovers reports temporary files of dead writers, never objects, and
// RemoveLeftover removes them.
func TestLocalLeftovers(t *testing.T) {
	ctx := t.Context()
	root := t.TempDir()
	l := newLocal(t, root)
	_, err := l.Put(ctx, "a/b", bytes.NewReader([]byte("x")), 1)
	require.NoError(t, err)
	_, err = l.PutIfAbsent(ctx, "a/c", bytes.NewReader([]byte("x")), 1) // creates lock files
	require.NoError(t, err)

	// A writer that died after writing its temporary file.
	dead := filepath.Join(root, ".kiln-tmp", "0123456789abcdef-a%d")
	require.NoError(t, os.WriteFile(dead, []byte("partial"), 0o644))
	old := time.Now().Add(-2 * time.Hour)
	require.NoError(t, os.Chtimes(dead, old, old))

	collect := func(olderThan time.Time) []store.Info {
		var got []store.Info
		require.NoError(t, l.Leftovers(ctx, olderThan, func(i store.Info) error {
			got = append(got, i)
			return nil
		}))
		return got
	}
	require.Empty(t, collect(time.Now().Add(-3*time.Hour)), "a leftover newer than olderThan")
	got := collect(time.Now().Add(-time.Hour))
	require.Len(t, got, 1)
	require.Equal(t, ".kiln-tmp/0123456789abcdef-a%d", got[0].Key)
	require.Equal(t, int64(7), got[0].Size)

	var keys []string
	require.NoError(t, l.List(ctx, "", func(i store.Info) error { keys = append(keys, i.Key); return nil }))
	require.ElementsMatch(t, []string{"a/b", "a/c"}, keys, "leftovers are not objects")

	require.Error(t, l.RemoveLeftover(ctx, store.Info{Key: "a/b"}), "an object is not a leftover")
	require.Error(t, l.RemoveLeftover(ctx, store.Info{Key: ".kiln-tmp/locks/x"}))
	require.NoError(t, l.RemoveLeftover(ctx, got[0]))
	require.NoError(t, l.RemoveLeftover(ctx, got[0]), "removing a removed leftover")
	require.Empty(t, collect(time.Now().Add(time.Hour)))
	_, err = os.Stat(filepath.Join(root, "a", "b"))
	require.NoError(t, err)
}

// An ETag never comes back for a key, even where timestamps are coarse or
// the clock reads earlier than a file's mtime (another host's clock, a
// coarse kernel clock that gives quick writes one mtime): each write of a
// key is stamped after every earlier version, deleted ones included, so a
// stale PutIfMatch fails however the inode and size repeat.
func TestLocalETagGenerations(t *testing.T) {
	ctx := t.Context()
	root := t.TempDir()
	l := newLocal(t, root)
	ahead := time.Now().Add(time.Hour).Truncate(time.Second)
	steps := []struct {
		name  string
		write func() (store.Info, error)
	}{
		{"Put", func() (store.Info, error) { return l.Put(ctx, "k", bytes.NewReader([]byte("same")), 4) }},
		{"PutIfMatch", func() (store.Info, error) {
			cur, err := l.Stat(ctx, "k")
			require.NoError(t, err)
			return l.PutIfMatch(ctx, "k", bytes.NewReader([]byte("same")), 4, cur.ETag)
		}},
		{"PutIfAbsent after Delete", func() (store.Info, error) {
			require.NoError(t, l.Delete(ctx, "k"))
			return l.PutIfAbsent(ctx, "k", bytes.NewReader([]byte("same")), 4)
		}},
		{"Put after Delete", func() (store.Info, error) {
			require.NoError(t, l.Delete(ctx, "k"))
			return l.Put(ctx, "k", bytes.NewReader([]byte("same")), 4)
		}},
	}
	_, err := l.Put(ctx, "k", bytes.NewReader([]byte("same")), 4)
	require.NoError(t, err)
	require.NoError(t, os.Chtimes(filepath.Join(root, "k"), ahead, ahead))
	prev, err := l.Stat(ctx, "k")
	require.NoError(t, err)
	seen := []string{prev.ETag}
	for _, s := range steps {
		info, err := s.write()
		require.NoError(t, err, s.name)
		require.True(t, info.ModTime.After(prev.ModTime), "%s: stamped %s, not after the previous version's %s", s.name, info.ModTime, prev.ModTime)
		require.NotContains(t, seen, info.ETag, "%s: an earlier ETag came back", s.name)
		st, err := l.Stat(ctx, "k")
		require.NoError(t, err)
		require.Equal(t, info.ETag, st.ETag, "%s: Stat and the write disagree", s.name)
		for _, stale := range seen {
			_, err := l.PutIfMatch(ctx, "k", bytes.NewReader([]byte("nope")), 4, stale)
			require.ErrorIs(t, err, store.ErrPrecondition, "%s: PutIfMatch with a stale ETag", s.name)
		}
		seen = append(seen, info.ETag)
		prev = info
	}
}
