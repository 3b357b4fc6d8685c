package dataset_test

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/kilnrl/kiln/formats/dataset"
	"github.com/kilnrl/kiln/formats/store"
)

const latestKey = "tasks/_latest.json"

// commitTasks commits the version of "tasks" that args name, one row.
func commitTasks(t *testing.T, st store.Store, args map[string]any, part dataset.Part) dataset.Result {
	t.Helper()
	ctx := context.Background()
	w, err := dataset.NewWriter(ctx, st, spec("tasks", args, part))
	require.NoError(t, err)
	if w.Existing() == nil && !w.PartDone() {
		writeTasks(t, ctx, w, part.Index*10, 1)
	}
	res, err := w.Commit(ctx, nil)
	require.NoError(t, err)
	return res
}

// counting counts a store's reads, to check that a bare name resolves in
// one Get.
type counting struct {
	store.Store
	gets, lists atomic.Int64
}

func (c *counting) Get(ctx context.Context, key string) (io.ReadCloser, store.Info, error) {
	c.gets.Add(1)
	return c.Store.Get(ctx, key)
}

func (c *counting) List(ctx context.Context, prefix string, fn func(store.Info) error) error {
	c.lists.Add(1)
	return c.Store.List(ctx, prefix, fn)
}

// TestResolve: what a bare name means after a sequence of writes. Steps:
// "a", "b" commit (or rerun) the version named by that letter; "p0:c" and
// "p1:c" write part 0 or 1 of 2 of version c; "drop" removes the pointer,
// as in a store made before pointers existed; "corrupt" garbles it.
func TestResolve(t *testing.T) {
	cases := []struct {
		name  string
		steps []string
		want  string // a letter, or "" with wantErr
		// previous is the version the pointer names as its previous one
		// ("-" for none, "" to skip the check).
		previous string
		wantErr  error
	}{
		{name: "no dataset", wantErr: dataset.ErrNotFound},
		{name: "first commit", steps: []string{"a"}, want: "a", previous: "-"},
		{name: "last made wins", steps: []string{"a", "b"}, want: "b", previous: "a"},
		{name: "a rerun of an older version moves it back", steps: []string{"a", "b", "a"}, want: "a", previous: "b"},
		{name: "a rerun of the latest version leaves it", steps: []string{"a", "b", "b"}, want: "b", previous: "a"},
		{name: "no pointer: the newest by commit time", steps: []string{"a", "drop"}, want: "a"},
		{name: "the first write after a pointer-less store makes one", steps: []string{"a", "drop", "b"}, want: "b", previous: "-"},
		{name: "a pending part leaves it", steps: []string{"a", "p0:c"}, want: "a", previous: "-"},
		{name: "the last part moves it", steps: []string{"a", "p0:c", "p1:c"}, want: "c", previous: "a"},
		{name: "a late part moves it back", steps: []string{"a", "p0:c", "p1:c", "b", "p0:c"}, want: "c", previous: "b"},
		{name: "a corrupt pointer is reported", steps: []string{"a", "corrupt"}, wantErr: dataset.ErrCorrupt},
		{name: "the next write replaces a corrupt pointer", steps: []string{"a", "corrupt", "b"}, want: "b", previous: "-"},
	}
	eachStore(t, func(t *testing.T, st store.Store) {
		for i, c := range cases {
			t.Run(c.name, func(t *testing.T) {
				ctx := context.Background()
				name := fmt.Sprintf("case%02d/tasks", i)
				versions := map[string]string{} // letter -> version
				for _, step := range c.steps {
					switch step {
					case "drop":
						require.NoError(t, st.Delete(ctx, name+"/_latest.json"))
						continue
					case "corrupt":
						_, err := st.Put(ctx, name+"/_latest.json", strings.NewReader("{torn"), 5)
						require.NoError(t, err)
						continue
					}
					part, letter := dataset.Part{}, step
					if p, l, ok := strings.Cut(step, ":"); ok {
						part, letter = dataset.Part{Index: int(p[1] - '0'), Count: 2}, l
					}
					sp := spec(name, map[string]any{"v": letter}, part)
					w, err := dataset.NewWriter(ctx, st, sp)
					require.NoError(t, err)
					if w.Existing() == nil && !w.PartDone() {
						writeTasks(t, ctx, w, part.Index*10, 1)
					}
					res, err := w.Commit(ctx, nil)
					require.NoError(t, err, step)
					versions[letter] = res.Ref.Version
					assert.Equal(t, res.Pending, res.Latest == nil, "%s: a result has a pointer unless pending", step)
					if res.Latest != nil {
						assert.Equal(t, res.Ref, res.Latest.Ref(), "%s: the pointer after the move", step)
					}
				}
				got, err := dataset.Resolve(ctx, st, name)
				v, openErr := dataset.Open(ctx, st, dataset.Ref{Name: name})
				if c.wantErr != nil {
					require.ErrorIs(t, err, c.wantErr)
					require.ErrorIs(t, openErr, c.wantErr)
					return
				}
				require.NoError(t, err)
				require.NoError(t, openErr)
				assert.Equal(t, versions[c.want], got, "Resolve")
				assert.Equal(t, versions[c.want], v.Version, "Open")
				// name@version stays exact whatever the pointer says.
				for letter, version := range versions {
					pinned, err := dataset.Open(ctx, st, dataset.Ref{Name: name, Version: version})
					if err == nil {
						assert.Equal(t, version, pinned.Version, "%s@%s", name, letter)
					}
				}
				if c.previous == "" {
					_, err := dataset.ReadLatest(ctx, st, name)
					require.ErrorIs(t, err, dataset.ErrNotFound, "no pointer")
					return
				}
				l, err := dataset.ReadLatest(ctx, st, name)
				require.NoError(t, err)
				assert.Equal(t, versions[c.want], l.Version)
				if c.previous == "-" {
					assert.Empty(t, l.Previous)
				} else {
					assert.Equal(t, versions[c.previous], l.Previous)
				}
				assert.Equal(t, "test", l.By.Stage)
				assert.NotZero(t, l.By.PID)
				assert.WithinDuration(t, time.Now(), l.Moved, time.Minute, "the store's time of the move")
				// With a pointer, a bare name resolves in one Get, no listing.
				cs := &counting{Store: st}
				_, err = dataset.Resolve(ctx, cs, name)
				require.NoError(t, err)
				assert.EqualValues(t, 1, cs.gets.Load(), "Gets to resolve %s", name)
				assert.EqualValues(t, 0, cs.lists.Load(), "Lists to resolve %s", name)
			})
		}
	})
}

// MoveLatest refuses a version that is not committed, so the pointer never
// dangles.
func TestMoveLatestNeedsACommit(t *testing.T) {
	eachStore(t, func(t *testing.T, st store.Store) {
		ctx := context.Background()
		a := commitTasks(t, st, map[string]any{"v": "a"}, dataset.Part{})
		_, err := dataset.MoveLatest(ctx, st, dataset.Ref{Name: "tasks", Version: "0123456789abcdef0123"}, dataset.ThisProcess("test"))
		require.ErrorIs(t, err, dataset.ErrNotFound)
		_, err = dataset.MoveLatest(ctx, st, dataset.Ref{Name: "tasks"}, dataset.ThisProcess("test"))
		require.ErrorContains(t, err, "not pinned")
		l, err := dataset.ReadLatest(ctx, st, "tasks")
		require.NoError(t, err)
		assert.Equal(t, a.Ref, l.Ref())
	})
}

// Concurrent writers of different versions of one name, and concurrent
// readers: every read of the pointer parses and names a committed version
// (never torn, never dangling), and it ends at one of the writers'
// versions, which a bare name then opens.
func TestConcurrentLatest(t *testing.T) {
	eachStore(t, func(t *testing.T, st store.Store) {
		ctx := context.Background()
		const writers, moves = 6, 5
		var (
			wg       sync.WaitGroup
			mu       sync.Mutex
			versions = map[string]bool{}
			done     atomic.Bool
			reads    atomic.Int64
			errs     = make(chan error, writers+2)
		)
		// Every writer commits its own version, then keeps moving the
		// pointer back to it, as reruns would.
		for i := range writers {
			wg.Go(func() {
				w, err := dataset.NewWriter(ctx, st, spec("tasks", map[string]any{"writer": i}, dataset.Part{}))
				if err != nil {
					errs <- err
					return
				}
				if _, err := w.WriteShard(ctx, 1, nil, encodeTasks(tasks(i, 1))); err != nil {
					errs <- err
					return
				}
				mu.Lock()
				versions[w.Ref().Version] = true
				mu.Unlock()
				res, err := w.Commit(ctx, nil)
				if err != nil {
					errs <- fmt.Errorf("writer %d: %w", i, err)
					return
				}
				for range moves {
					if _, err := dataset.MoveLatest(ctx, st, res.Ref, dataset.ThisProcess("test")); err != nil {
						errs <- fmt.Errorf("writer %d: %w", i, err)
						return
					}
				}
			})
		}
		var readers sync.WaitGroup
		for range 2 {
			readers.Go(func() {
				for !done.Load() {
					time.Sleep(time.Millisecond)
					l, err := dataset.ReadLatest(ctx, st, "tasks")
					if errors.Is(err, dataset.ErrNotFound) {
						continue // no writer has moved it yet
					}
					if err == nil {
						if _, err = st.Stat(ctx, "tasks/_v/"+l.Version+"/manifest.json"); err != nil {
							err = fmt.Errorf("the pointer names %s, which is not committed: %w", l.Version, err)
						}
					}
					if err != nil {
						errs <- err
						return
					}
					reads.Add(1)
				}
			})
		}
		wg.Wait()
		done.Store(true)
		readers.Wait()
		close(errs)
		for err := range errs {
			require.NoError(t, err)
		}
		l, err := dataset.ReadLatest(ctx, st, "tasks")
		require.NoError(t, err)
		assert.True(t, versions[l.Version], "the pointer ends at one of the writers' versions, not %s", l.Version)
		v, err := dataset.OpenString(ctx, st, "tasks")
		require.NoError(t, err)
		assert.Equal(t, l.Version, v.Version)
		assert.Len(t, readIDs(t, ctx, v), 1)
		t.Logf("%d pointer reads during %d moves", reads.Load(), writers*(moves+1))
	})
}

// GC never collects the version the pointer names, nor the pointer.
func TestGCKeepsLatest(t *testing.T) {
	eachStore(t, func(t *testing.T, st store.Store) {
		ctx := context.Background()
		a := commitTasks(t, st, map[string]any{"v": "a"}, dataset.Part{})
		commitTasks(t, st, map[string]any{"v": "b"}, dataset.Part{})
		commitTasks(t, st, map[string]any{"v": "a"}, dataset.Part{}) // rerun: latest is a again
		var orphans []dataset.Orphan
		require.NoError(t, dataset.GC(ctx, st, dataset.GCOptions{Now: time.Now().Add(time.Hour)}, func(o dataset.Orphan) { orphans = append(orphans, o) }))
		for _, o := range orphans {
			assert.NotEqual(t, latestKey, o.Key)
			assert.False(t, strings.HasPrefix(o.Key, "tasks/_v/"+a.Ref.Version+"/shards/"), "collected %s", o.Key)
		}
		v, err := dataset.OpenString(ctx, st, "tasks")
		require.NoError(t, err)
		assert.Equal(t, a.Ref, v.Ref())
		assert.Len(t, readIDs(t, ctx, v), 1)
		// The pointer is not a version: List and ls do not show it.
		all, err := dataset.List(ctx, st, "")
		require.NoError(t, err)
		assert.Len(t, all, 2)
	})
}

// The pointer is plain JSON that names who moved it.
func TestLatestFormat(t *testing.T) {
	st, err := store.NewLocal(t.TempDir())
	require.NoError(t, err)
	res := commitTasks(t, st, nil, dataset.Part{})
	b, _, err := store.ReadAll(context.Background(), st, latestKey)
	require.NoError(t, err)
	var got map[string]any
	require.NoError(t, json.Unmarshal(b, &got))
	assert.Equal(t, dataset.LatestFormat, got["format"])
	assert.Equal(t, "tasks", got["dataset"])
	assert.Equal(t, res.Ref.Version, got["version"])
	by := got["by"].(map[string]any)
	assert.Equal(t, "test", by["stage"])
	assert.NotEmpty(t, got["moved_at"])
}

// interloper moves the pointer to other just before the first
// compare-and-swap it sees (create or replace), as a concurrent writer would.
type interloper struct {
	store.Store
	t     *testing.T
	other dataset.Ref
	once  sync.Once
	swaps int // compare-and-swaps tried
}

func (s *interloper) cut(ctx context.Context) {
	s.swaps++
	s.once.Do(func() {
		_, err := dataset.MoveLatest(ctx, s.Store, s.other, dataset.Mover{Stage: "interloper"})
		require.NoError(s.t, err)
	})
}

func (s *interloper) PutIfAbsent(ctx context.Context, key string, r io.Reader, size int64) (store.Info, error) {
	s.cut(ctx)
	return s.Store.PutIfAbsent(ctx, key, r, size)
}

func (s *interloper) PutIfMatch(ctx context.Context, key string, r io.Reader, size int64, etag string) (store.Info, error) {
	s.cut(ctx)
	return s.Store.PutIfMatch(ctx, key, r, size, etag)
}

// A move that loses its compare-and-swap looks again and retries, so it
// neither fails nor overwrites a move it did not see.
func TestMoveLatestRetriesOnConflict(t *testing.T) {
	for _, c := range []struct {
		name    string
		initial bool // whether a pointer exists before the move
	}{{"create races create", false}, {"replace races replace", true}} {
		t.Run(c.name, func(t *testing.T) {
			eachStore(t, func(t *testing.T, st store.Store) {
				ctx := context.Background()
				a := commitTasks(t, st, map[string]any{"v": "a"}, dataset.Part{})
				b := commitTasks(t, st, map[string]any{"v": "b"}, dataset.Part{})
				commitTasks(t, st, map[string]any{"v": "c"}, dataset.Part{}) // the pointer is at c
				if !c.initial {
					require.NoError(t, st.Delete(ctx, latestKey))
				}
				il := &interloper{Store: st, t: t, other: b.Ref}
				l, err := dataset.MoveLatest(ctx, il, a.Ref, dataset.ThisProcess("test"))
				require.NoError(t, err)
				assert.Equal(t, 2, il.swaps, "one lost compare-and-swap, one retry")
				assert.Equal(t, a.Ref, l.Ref())
				assert.Equal(t, b.Ref.Version, l.Previous, "the retry saw the interloper's move")
				got, err := dataset.ReadLatest(ctx, st, "tasks")
				require.NoError(t, err)
				assert.Equal(t, a.Ref.Version, got.Version)
				assert.Equal(t, b.Ref.Version, got.Previous)
			})
		})
	}
}
