package dataset_test

import (
	"bytes"
	"context"
	"encoding/json"
	"fmt"
	"io"
	"sort"
	"strings"
	"testing"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/kilnrl/kiln/formats/dataset"
	"github.com/kilnrl/kiln/formats/records"
	"github.com/kilnrl/kiln/formats/store"
	"github.com/kilnrl/kiln/formats/store/storetest"
)

// eachStore runs f against a fresh local store and a fresh S3 store.
func eachStore(t *testing.T, f func(t *testing.T, st store.Store)) {
	t.Run("local", func(t *testing.T) {
		st, err := store.NewLocal(t.TempDir())
		require.NoError(t, err)
		f(t, st)
	})
	t.Run("s3", func(t *testing.T) { f(t, storetest.StartVersity(t)) })
}

func tasks(from, n int) []records.Task {
	var out []records.Task
	for i := from; i < from+n; i++ {
		out = append(out, records.Task{TaskID: fmt.Sprintf("task-%03d", i), TaskIndex: int64(i), Prompt: `"p"`, Metadata: `{}`})
	}
	return out
}

func encodeTasks(ts []records.Task) func(io.Writer) error {
	return func(w io.Writer) error {
		enc := records.NewTaskEncoder(w)
		if err := enc.Write(ts...); err != nil {
			return err
		}
		return enc.Close()
	}
}

func spec(name string, args map[string]any, part dataset.Part) dataset.Spec {
	return dataset.Spec{Name: name, Kind: records.TasksKind(), Part: part, Build: "test",
		Identity: dataset.Identity{Stage: "test", CodeVersion: "1", Args: args}}
}

func writeTasks(t *testing.T, ctx context.Context, w *dataset.Writer, from, n int) {
	t.Helper()
	keys := []string{}
	for _, tk := range tasks(from, n) {
		keys = append(keys, tk.TaskID)
	}
	_, err := w.WriteShard(ctx, int64(n), keys, encodeTasks(tasks(from, n)))
	require.NoError(t, err)
}

func readIDs(t *testing.T, ctx context.Context, v *dataset.Version) []string {
	t.Helper()
	var ids []string
	require.NoError(t, v.EachJSON(ctx, func(row json.RawMessage) error {
		var r struct {
			TaskID string `json:"task_id"`
		}
		require.NoError(t, json.Unmarshal(row, &r))
		ids = append(ids, r.TaskID)
		return nil
	}))
	sort.Strings(ids)
	return ids
}

func ids(from, n int) []string {
	var out []string
	for _, tk := range tasks(from, n) {
		out = append(out, tk.TaskID)
	}
	return out
}

func TestWriteCommitRead(t *testing.T) {
	eachStore(t, func(t *testing.T, st store.Store) {
		ctx := context.Background()
		w, err := dataset.NewWriter(ctx, st, spec("tasks/mimo", map[string]any{"a": 1}, dataset.Part{}))
		require.NoError(t, err)
		require.Nil(t, w.Existing())
		writeTasks(t, ctx, w, 0, 3)
		writeTasks(t, ctx, w, 3, 2)
		res, err := w.Commit(ctx, map[string]any{"rows": 5})
		require.NoError(t, err)
		assert.True(t, res.Committed)
		assert.False(t, res.Pending)

		v, err := dataset.OpenString(ctx, st, "tasks/mimo")
		require.NoError(t, err)
		assert.Equal(t, res.Ref, v.Ref())
		assert.Equal(t, int64(5), v.Rows)
		assert.Len(t, v.Shards, 2)
		assert.Equal(t, "tasks", v.Manifest.Kind)
		assert.Equal(t, records.TasksKind().Fingerprint(), v.Schema)
		assert.Equal(t, "test", v.Producer.Stage)
		assert.Equal(t, float64(5), v.Metrics["rows"])
		assert.WithinDuration(t, time.Now(), v.Committed, time.Minute)
		assert.Equal(t, ids(0, 5), readIDs(t, ctx, v))

		exact, err := dataset.OpenString(ctx, st, res.Ref.String())
		require.NoError(t, err)
		assert.Equal(t, v.Manifest, exact.Manifest)

		// An identical rerun finds the committed version and writes nothing.
		again, err := dataset.NewWriter(ctx, st, spec("tasks/mimo", map[string]any{"a": 1}, dataset.Part{}))
		require.NoError(t, err)
		require.NotNil(t, again.Existing())
		_, err = again.WriteShard(ctx, 1, nil, encodeTasks(tasks(9, 1)))
		require.Error(t, err)
	})
}

func TestVersionIdentity(t *testing.T) {
	base := dataset.Identity{Stage: "s", CodeVersion: "1", Args: map[string]any{"n": 4, "m": "x"},
		Inputs:   []dataset.Ref{{Name: "tasks", Version: "aaaa"}},
		External: []dataset.External{{Role: "file", URI: "/a/b.jsonl", SHA256: "00", Size: 3}}}
	v0, err := base.Version()
	require.NoError(t, err)
	require.Len(t, v0, dataset.VersionLen)
	cases := []struct {
		name string
		mut  func(*dataset.Identity)
		same bool
	}{
		{"identical", func(*dataset.Identity) {}, true},
		{"arg order", func(id *dataset.Identity) { id.Args = map[string]any{"m": "x", "n": 4} }, true},
		{"file moved", func(id *dataset.Identity) {
			id.External = []dataset.External{{Role: "file", URI: "/elsewhere", SHA256: "00", Size: 3}}
		}, true},
		{"stage", func(id *dataset.Identity) { id.Stage = "t" }, false},
		{"code version", func(id *dataset.Identity) { id.CodeVersion = "2" }, false},
		{"arg value", func(id *dataset.Identity) { id.Args = map[string]any{"n": 5, "m": "x"} }, false},
		{"input version", func(id *dataset.Identity) { id.Inputs = []dataset.Ref{{Name: "tasks", Version: "bbbb"}} }, false},
		{"file content", func(id *dataset.Identity) { id.External = []dataset.External{{Role: "file", SHA256: "01", Size: 3}} }, false},
		{"object etag", func(id *dataset.Identity) { id.External = []dataset.External{{Role: "file", ETag: "e", Size: 3}} }, false},
	}
	for _, c := range cases {
		t.Run(c.name, func(t *testing.T) {
			id := base
			c.mut(&id)
			v, err := id.Version()
			require.NoError(t, err)
			assert.Equal(t, c.same, v == v0)
		})
	}
	_, err = dataset.Identity{Inputs: []dataset.Ref{{Name: "tasks"}}}.Version()
	assert.ErrorContains(t, err, `input "tasks" is not pinned`)
}

func TestShardedCommitAndLateDuplicate(t *testing.T) {
	eachStore(t, func(t *testing.T, st store.Store) {
		ctx := context.Background()
		const n = 3
		sp := func(i int) dataset.Spec { return spec("rollouts/step-1", nil, dataset.Part{Index: i, Count: n}) }
		// A duplicate attempt of part 1 starts before anything commits.
		// It writes no row receipts, so no other attempt adopts its shard.
		dup, err := dataset.NewWriter(ctx, st, sp(1))
		require.NoError(t, err)
		_, err = dup.WriteShard(ctx, 1, nil, encodeTasks(tasks(100, 1)))
		require.NoError(t, err)

		var last dataset.Result
		for i := 0; i < n; i++ {
			w, err := dataset.NewWriter(ctx, st, sp(i))
			require.NoError(t, err)
			writeTasks(t, ctx, w, i*10, 2)
			res, err := w.Commit(ctx, map[string]any{"rows": 2})
			require.NoError(t, err)
			assert.Equal(t, i < n-1, res.Pending, "part %d", i)
			last = res
		}
		require.True(t, last.Committed)
		v := last.Version
		assert.Equal(t, n, v.Parts)
		assert.Len(t, v.Shards, n)
		assert.Equal(t, float64(2*n), v.Metrics["rows"])
		want := append(append(ids(0, 2), ids(10, 2)...), ids(20, 2)...)
		assert.Equal(t, want, readIDs(t, ctx, v))

		// The late duplicate neither replaces part 1 nor commits anything new.
		res, err := dup.Commit(ctx, nil)
		require.NoError(t, err)
		assert.False(t, res.Committed)
		assert.Equal(t, v.Manifest, res.Version.Manifest)
		again, err := dataset.Open(ctx, st, last.Ref)
		require.NoError(t, err)
		assert.Equal(t, want, readIDs(t, ctx, again))

		// A sharded run refuses unpinned inputs.
		bad := sp(0)
		bad.Identity.Inputs = []dataset.Ref{{Name: "tasks"}}
		_, err = dataset.NewWriter(ctx, st, bad)
		assert.ErrorContains(t, err, `input "tasks" is not pinned: a sharded run (--shard 0/3)`)
	})
}

func TestConcurrentCommitOneWins(t *testing.T) {
	eachStore(t, func(t *testing.T, st store.Store) {
		ctx := context.Background()
		a, err := dataset.NewWriter(ctx, st, spec("tasks", nil, dataset.Part{}))
		require.NoError(t, err)
		b, err := dataset.NewWriter(ctx, st, spec("tasks", nil, dataset.Part{}))
		require.NoError(t, err)
		writeTasks(t, ctx, a, 0, 2)
		writeTasks(t, ctx, b, 0, 2)
		ra, err := a.Commit(ctx, nil)
		require.NoError(t, err)
		rb, err := b.Commit(ctx, nil)
		require.NoError(t, err)
		assert.True(t, ra.Committed)
		assert.False(t, rb.Committed)
		assert.Equal(t, ra.Version.Manifest, rb.Version.Manifest)
	})
}

func TestResumeFromRowReceipts(t *testing.T) {
	eachStore(t, func(t *testing.T, st store.Store) {
		ctx := context.Background()
		first, err := dataset.NewWriter(ctx, st, spec("long", nil, dataset.Part{}))
		require.NoError(t, err)
		writeTasks(t, ctx, first, 0, 2)
		writeTasks(t, ctx, first, 2, 2)
		// first dies here, without committing.
		_, err = dataset.OpenString(ctx, st, "long")
		require.ErrorIs(t, err, dataset.ErrNotFound)

		second, err := dataset.NewWriter(ctx, st, spec("long", nil, dataset.Part{}))
		require.NoError(t, err)
		assert.Equal(t, 4, second.Resumed())
		var todo []records.Task
		for _, tk := range tasks(0, 6) {
			if !second.Done(tk.TaskID) {
				todo = append(todo, tk)
			}
		}
		require.Len(t, todo, 2)
		_, err = second.WriteShard(ctx, 2, []string{todo[0].TaskID, todo[1].TaskID}, encodeTasks(todo))
		require.NoError(t, err)
		res, err := second.Commit(ctx, nil)
		require.NoError(t, err)
		require.True(t, res.Committed)
		assert.Equal(t, ids(0, 6), readIDs(t, ctx, res.Version))
	})
}

// damage rewrites an object through the store with f applied.
func damage(t *testing.T, st store.Store, key string, f func([]byte) []byte) {
	t.Helper()
	data, _, err := store.ReadAll(context.Background(), st, key)
	require.NoError(t, err)
	data = f(data)
	_, err = st.Put(context.Background(), key, bytes.NewReader(data), int64(len(data)))
	require.NoError(t, err)
}

func committed(t *testing.T, st store.Store) *dataset.Version {
	ctx := context.Background()
	w, err := dataset.NewWriter(ctx, st, spec("tasks", nil, dataset.Part{}))
	require.NoError(t, err)
	writeTasks(t, ctx, w, 0, 3)
	res, err := w.Commit(ctx, nil)
	require.NoError(t, err)
	return res.Version
}

func TestCorruptionIsReported(t *testing.T) {
	eachStore(t, func(t *testing.T, st store.Store) {
		ctx := context.Background()
		v := committed(t, st)
		ref := v.Ref().String()
		dir := v.Dataset + "/_v/" + v.Version + "/"
		shardKey := dir + v.Shards[0].Key

		t.Run("flipped byte", func(t *testing.T) {
			damage(t, st, shardKey, func(b []byte) []byte { b[len(b)/2] ^= 0x01; return b })
			err := v.EachJSON(ctx, func(json.RawMessage) error { return nil })
			require.ErrorIs(t, err, dataset.ErrCorrupt)
			for _, want := range []string{"dataset " + ref, v.Shards[0].Key, "sha256"} {
				assert.Contains(t, err.Error(), want)
			}
		})
		t.Run("truncated shard", func(t *testing.T) {
			damage(t, st, shardKey, func(b []byte) []byte { return b[:len(b)-1] })
			_, err := v.ReadShard(ctx, 0)
			require.ErrorIs(t, err, dataset.ErrCorrupt)
			assert.Contains(t, err.Error(), "manifest says")
		})
		t.Run("missing shard", func(t *testing.T) {
			require.NoError(t, st.Delete(ctx, shardKey))
			_, err := v.ReadShard(ctx, 0)
			require.ErrorIs(t, err, dataset.ErrCorrupt)
			assert.Contains(t, err.Error(), "is missing")
			assert.Contains(t, err.Error(), ref)
		})
		t.Run("manifest not JSON", func(t *testing.T) {
			damage(t, st, dir+"manifest.json", func(b []byte) []byte { return b[:len(b)/2] })
			_, err := dataset.OpenString(ctx, st, ref)
			require.ErrorIs(t, err, dataset.ErrCorrupt)
			assert.Contains(t, err.Error(), "is not valid JSON")
		})
		t.Run("unknown kind", func(t *testing.T) {
			m := v.Manifest
			m.Kind = "holograms"
			b, _ := json.Marshal(m)
			damage(t, st, dir+"manifest.json", func([]byte) []byte { return b })
			_, err := dataset.OpenString(ctx, st, ref)
			require.Error(t, err)
			assert.Contains(t, err.Error(), `unknown record kind "holograms"`)
			assert.Contains(t, err.Error(), ref)
		})
		t.Run("totals disagree", func(t *testing.T) {
			m := v.Manifest
			m.Rows++
			b, _ := json.Marshal(m)
			damage(t, st, dir+"manifest.json", func([]byte) []byte { return b })
			_, err := dataset.OpenString(ctx, st, ref)
			require.ErrorIs(t, err, dataset.ErrCorrupt)
		})
		t.Run("not found", func(t *testing.T) {
			_, err := dataset.OpenString(ctx, st, "nope")
			require.ErrorIs(t, err, dataset.ErrNotFound)
			_, err = dataset.OpenString(ctx, st, "tasks@0000")
			require.ErrorIs(t, err, dataset.ErrNotFound)
		})
	})
}

func TestNewestByCommitTime(t *testing.T) {
	eachStore(t, func(t *testing.T, st store.Store) {
		ctx := context.Background()
		var refs []dataset.Ref
		for i := 0; i < 3; i++ {
			w, err := dataset.NewWriter(ctx, st, spec("tasks", map[string]any{"i": i}, dataset.Part{}))
			require.NoError(t, err)
			writeTasks(t, ctx, w, i, 1)
			res, err := w.Commit(ctx, nil)
			require.NoError(t, err)
			refs = append(refs, res.Ref)
			time.Sleep(1100 * time.Millisecond) // S3 Last-Modified has second resolution on some servers
		}
		v, err := dataset.OpenString(ctx, st, "tasks")
		require.NoError(t, err)
		assert.Equal(t, refs[2], v.Ref())
		all, err := dataset.List(ctx, st, "")
		require.NoError(t, err)
		require.Len(t, all, 3)
		assert.Equal(t, refs[2], all[0].Ref)
		assert.Equal(t, refs[0], all[2].Ref)
	})
}

func TestGC(t *testing.T) {
	eachStore(t, func(t *testing.T, st store.Store) {
		ctx := context.Background()
		v := committed(t, st)
		// A writer that died before committing.
		dead, err := dataset.NewWriter(ctx, st, spec("tasks", map[string]any{"dead": true}, dataset.Part{}))
		require.NoError(t, err)
		writeTasks(t, ctx, dead, 0, 1)
		// A losing attempt's shard inside the committed version.
		lost, err := dataset.NewWriter(ctx, st, spec("other", nil, dataset.Part{}))
		require.NoError(t, err)
		winner, err := dataset.NewWriter(ctx, st, spec("other", nil, dataset.Part{}))
		require.NoError(t, err)
		writeTasks(t, ctx, lost, 0, 1)
		writeTasks(t, ctx, winner, 0, 1)
		// Attachments: the committed version keeps its own, the dead
		// writer's go with its version.
		attach := func(r dataset.Ref, rel string) string {
			key := dataset.AttachmentKey(r, rel)
			_, err := st.Put(ctx, key, strings.NewReader("log"), 3)
			require.NoError(t, err)
			return key
		}
		kept := attach(winner.Ref(), "logs/row-0.jsonl")
		gone := attach(dead.Ref(), "logs/row-0.jsonl")
		_, err = winner.Commit(ctx, nil)
		require.NoError(t, err)

		list := func(opts dataset.GCOptions) []dataset.Orphan {
			var out []dataset.Orphan
			require.NoError(t, dataset.GC(ctx, st, opts, func(o dataset.Orphan) { out = append(out, o) }))
			return out
		}
		assert.Empty(t, list(dataset.GCOptions{Grace: time.Hour, DryRun: true}), "young files are kept")
		orphans := list(dataset.GCOptions{DryRun: true, Now: time.Now().Add(time.Minute)})
		reasons := map[string]int{}
		for _, o := range orphans {
			reasons[o.Reason]++
			assert.False(t, strings.HasSuffix(o.Key, "manifest.json"), o.Key)
		}
		assert.Equal(t, 3, reasons[dataset.ReasonUncommitted], "dead writer's shard, row receipt and attachment: %v", orphans)
		for _, o := range orphans {
			assert.NotEqual(t, kept, o.Key, "a committed version's attachment is not an orphan")
		}
		assert.Contains(t, orphans, dataset.Orphan{Key: gone, Size: 3, Reason: dataset.ReasonUncommitted})
		// The loser's shard, and the receipts of both committed versions
		// (two part receipts, three row receipts).
		assert.Equal(t, 6, reasons[dataset.ReasonUnreferenced], "%v", orphans)

		assert.Equal(t, orphans, list(dataset.GCOptions{Now: time.Now().Add(time.Minute)}))
		assert.Empty(t, list(dataset.GCOptions{DryRun: true, Now: time.Now().Add(time.Minute)}))
		// Committed data and attachments are intact.
		_, err = st.Stat(ctx, kept)
		require.NoError(t, err)
		_, err = st.Stat(ctx, gone)
		require.Error(t, err)
		got, err := dataset.Open(ctx, st, v.Ref())
		require.NoError(t, err)
		assert.Equal(t, ids(0, 3), readIDs(t, ctx, got))
	})
}

func TestRefsAndParts(t *testing.T) {
	for _, c := range []struct {
		in   string
		want string
		err  string
	}{
		{"tasks", "tasks", ""},
		{"rollouts/step-3@abc123", "rollouts/step-3@abc123", ""},
		{"", "", "empty dataset name"},
		{"a//b", "", "segment"},
		{"a/_v/b", "", `segment "_v"`},
		{"../x", "", "segment"},
		{"x@", "", "version must be"},
		{"x@a/b", "", "version must be"},
	} {
		r, err := dataset.ParseRef(c.in)
		if c.err != "" {
			assert.ErrorContains(t, err, c.err, c.in)
			continue
		}
		require.NoError(t, err)
		assert.Equal(t, c.want, r.String())
	}
	for _, c := range []struct {
		in  string
		ok  bool
		idx int
	}{{"0/1", true, 0}, {"3/4", true, 3}, {"4/4", false, 0}, {"-1/2", false, 0}, {"1", false, 0}, {"a/b", false, 0}, {"0/0", false, 0}} {
		p, err := dataset.ParsePart(c.in)
		assert.Equal(t, c.ok, err == nil, c.in)
		if c.ok {
			assert.Equal(t, c.idx, p.Index)
		}
	}
	p := dataset.Part{Index: 1, Count: 3}
	assert.True(t, p.Owns(4))
	assert.False(t, p.Owns(3))
	assert.True(t, dataset.Part{}.Owns(7))
}
