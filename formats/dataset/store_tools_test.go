package dataset_test

import (
	"context"
	"errors"
	"testing"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/kilnrl/kiln/formats/dataset"
	"github.com/kilnrl/kiln/formats/store"
)

func TestAttachmentPath(t *testing.T) {
	v := &dataset.Version{Manifest: dataset.Manifest{Dataset: "grades/a", Version: "v1"}}
	cases := []struct{ in, want, err string }{
		{in: "grades/a/_v/v1/attachments/logs/1.jsonl", want: "logs/1.jsonl"},
		{in: "/grades/a/_v/v1/attachments/logs/1.jsonl", want: "logs/1.jsonl"},
		{in: "logs/1.jsonl", want: "logs/1.jsonl"},
		{in: "attachments/logs/1.jsonl", want: "logs/1.jsonl"},
		{in: "grades/a/_v/v2/attachments/logs/1.jsonl", err: "belongs to grades/a@v2, not grades/a@v1"},
		{in: "other/_v/v1/attachments/x", err: "belongs to other@v1"},
		{in: "logs/../../manifest.json", err: "inside the version's attachments"},
		{in: "", err: "inside the version's attachments"},
		{in: "grades/a/_v/v1/attachments/", err: "inside the version's attachments"},
	}
	for _, c := range cases {
		got, err := v.AttachmentPath(c.in)
		if c.err != "" {
			assert.ErrorContains(t, err, c.err, c.in)
			continue
		}
		require.NoError(t, err, c.in)
		assert.Equal(t, c.want, got, c.in)
	}
}

// Verify looks at every shard, and its error names each corrupt one.
func TestVerifyEveryShard(t *testing.T) {
	eachStore(t, func(t *testing.T, st store.Store) {
		ctx := context.Background()
		w, err := dataset.NewWriter(ctx, st, spec("tasks", nil, dataset.Part{}))
		require.NoError(t, err)
		for i := 0; i < 3; i++ {
			writeTasks(t, ctx, w, i*10, 2)
		}
		res, err := w.Commit(ctx, nil)
		require.NoError(t, err)
		v := res.Version
		require.NoError(t, dataset.Verify(ctx, v, nil))
		dir := "tasks/_v/" + v.Version + "/"
		flip := func(b []byte) []byte { b[len(b)/2] ^= 1; return b }
		damage(t, st, dir+v.Shards[0].Key, flip)
		damage(t, st, dir+v.Shards[2].Key, flip)

		var checks []dataset.ShardCheck
		err = dataset.Verify(ctx, v, func(c dataset.ShardCheck) { checks = append(checks, c) })
		require.Error(t, err)
		assert.True(t, errors.Is(err, dataset.ErrCorrupt))
		assert.Contains(t, err.Error(), "2 of 3 shard(s) corrupt")
		require.Len(t, checks, 3, "a corrupt shard does not stop the check")
		for i, c := range checks {
			assert.Equal(t, v.Shards[i].Key, c.Shard.Key)
			assert.Equal(t, i != 1, c.Err != nil, "shard %d: %v", i, c.Err)
			if c.Err != nil {
				assert.Contains(t, err.Error(), c.Shard.Key)
			}
		}
	})
}

// Forget keeps everything while KeepLast covers it, and refuses a bad name.
func TestForgetKeepsWhatItCovers(t *testing.T) {
	ctx := context.Background()
	st, err := store.NewLocal(t.TempDir())
	require.NoError(t, err)
	for i := 0; i < 3; i++ {
		w, err := dataset.NewWriter(ctx, st, spec("tasks", map[string]any{"i": i}, dataset.Part{}))
		require.NoError(t, err)
		writeTasks(t, ctx, w, i, 1)
		_, err = w.Commit(ctx, nil)
		require.NoError(t, err)
	}
	var kept int
	require.NoError(t, dataset.Forget(ctx, st, "tasks", dataset.ForgetOptions{KeepLast: 5}, func(d dataset.ForgetDecision) {
		if d.Keep {
			kept++
		}
	}))
	assert.Equal(t, 3, kept)
	all, err := dataset.List(ctx, st, "")
	require.NoError(t, err)
	assert.Len(t, all, 3)
	assert.Error(t, dataset.Forget(ctx, st, "a/_v", dataset.ForgetOptions{}, nil))
	assert.ErrorIs(t, dataset.Forget(ctx, st, "nope", dataset.ForgetOptions{}, nil), dataset.ErrNotFound)
	assert.ErrorContains(t, dataset.Forget(ctx, st, "tasks", dataset.ForgetOptions{KeepLast: -1}, nil), "negative")
}

// TestDrop: Drop removes a dataset whole (committed and uncommitted
// versions, the latest pointer) and nothing of the datasets beside it,
// even those whose names start with its name.
func TestDrop(t *testing.T) {
	ctx := context.Background()
	st, err := store.NewLocal(t.TempDir())
	require.NoError(t, err)
	commit := func(name string, i int) {
		w, err := dataset.NewWriter(ctx, st, spec(name, map[string]any{"i": i}, dataset.Part{}))
		require.NoError(t, err)
		writeTasks(t, ctx, w, i, 1)
		_, err = w.Commit(ctx, nil)
		require.NoError(t, err)
	}
	commit("tasks", 0)
	commit("tasks", 1)
	commit("tasks2", 0)
	commit("tasks/sub", 0)
	// An uncommitted version: a shard and its receipt, no manifest.
	w, err := dataset.NewWriter(ctx, st, spec("tasks", map[string]any{"i": 2}, dataset.Part{}))
	require.NoError(t, err)
	writeTasks(t, ctx, w, 2, 1)

	require.NoError(t, dataset.Drop(ctx, st, "tasks"))
	var left []string
	require.NoError(t, st.List(ctx, "tasks/_", func(info store.Info) error { left = append(left, info.Key); return nil }))
	assert.Empty(t, left, "files of the dropped dataset")
	_, err = dataset.ReadLatest(ctx, st, "tasks")
	assert.ErrorIs(t, err, dataset.ErrNotFound)
	all, err := dataset.List(ctx, st, "")
	require.NoError(t, err)
	var names []string
	for _, s := range all {
		names = append(names, s.Ref.Name)
	}
	assert.ElementsMatch(t, []string{"tasks2", "tasks/sub"}, names)
	for _, name := range names {
		_, err := dataset.OpenString(ctx, st, name)
		assert.NoError(t, err, name)
	}

	assert.ErrorIs(t, dataset.Drop(ctx, st, "tasks"), dataset.ErrNotFound, "dropped twice")
	assert.Error(t, dataset.Drop(ctx, st, "a/_v"))
}
