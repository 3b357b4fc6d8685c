package records_test

import (
	"bytes"
	"context"
	"encoding/json"
	"io"
	"os"
	"strings"
	"testing"
	"time"
	"unicode/utf8"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/kilnrl/kiln/formats/dataset"
	"github.com/kilnrl/kiln/formats/records"
	"github.com/kilnrl/kiln/formats/store"
)

// v1Shard is a rollouts shard kiln wrote before abort_detail existed (at
// c1c3303, with NewRolloutEncoder; two rows: a run kept, and one aborted
// wall_clock_timeout).
const v1Shard = "testdata/rollouts-v1.parquet"

func TestRolloutsAbortDetailRoundTrip(t *testing.T) {
	start := time.Date(2026, 11, 29, 22, 0, 0, 123e6, time.UTC)
	rows := []records.Rollout{
		{RolloutID: 7, Index: 7, TaskID: "t0", Agent: "shell", AgentExitCode: -1, AbortReason: ptr("replay_mismatch"),
			AbortDetail: ptr("replay: rollout 7 turn 1: prompt token 4 is 99, the recorded one 11"), StartedAt: start, EndedAt: start},
		{RolloutID: 8, Index: 8, TaskID: "t0", Agent: "shell", Turns: 2, StartedAt: start, EndedAt: start},
	}
	var buf bytes.Buffer
	enc := records.NewRolloutEncoder(&buf)
	require.NoError(t, enc.Write(rows...))
	require.NoError(t, enc.Close())
	var got []records.Rollout
	require.NoError(t, records.EachRollout(buf.Bytes(), func(r records.Rollout) error { got = append(got, r); return nil }))
	require.Len(t, got, 2)
	require.NotNil(t, got[0].AbortDetail)
	assert.Equal(t, *rows[0].AbortDetail, *got[0].AbortDetail)
	assert.Nil(t, got[1].AbortDetail)

	var js []string
	require.NoError(t, records.RolloutsKind().EachJSON(buf.Bytes(), func(row json.RawMessage) error {
		js = append(js, string(row))
		return nil
	}))
	assert.Contains(t, js[0], `"abort_reason":"replay_mismatch","abort_detail":"replay: rollout 7 turn 1: prompt token 4 is 99, the recorded one 11","turns":0`)
	assert.Contains(t, js[1], `"abort_reason":null,"abort_detail":null,"turns":2`)
	// The JSON view imports back (kiln import rollouts).
	back, err := records.RolloutFromJSON([]byte(js[0]))
	require.NoError(t, err)
	assert.Equal(t, rows[0].AbortDetail, back.AbortDetail)
	n, err := records.RolloutsKind().CheckShard(buf.Bytes())
	require.NoError(t, err)
	assert.EqualValues(t, 2, n)
	// A row exported by a kiln before the column has no abort_detail key:
	// it imports with a nil detail.
	old := strings.Replace(js[0], `"abort_detail":"replay: rollout 7 turn 1: prompt token 4 is 99, the recorded one 11",`, "", 1)
	require.NotContains(t, old, "abort_detail")
	back, err = records.RolloutFromJSON([]byte(old))
	require.NoError(t, err)
	assert.Equal(t, "replay_mismatch", *back.AbortReason)
	assert.Nil(t, back.AbortDetail)
}

func TestRolloutsAbortDetailValidate(t *testing.T) {
	cases := []struct {
		name string
		r    records.Rollout
		want string
	}{
		{"detail without reason", records.Rollout{TaskID: "t", AbortDetail: ptr("why")}, "abort_detail is set but abort_reason is not"},
		{"detail over the bound", records.Rollout{TaskID: "t", AbortReason: ptr("engine_error"), AbortDetail: ptr(strings.Repeat("x", records.MaxAbortDetail+1))},
			"abort_detail is 2049 bytes, over the 2048-byte bound"},
	}
	for _, c := range cases {
		t.Run(c.name, func(t *testing.T) {
			assert.ErrorContains(t, records.NewRolloutEncoder(io.Discard).Write(c.r), c.want)
		})
	}
	// A reason without a detail stays valid: rows imported from older
	// exports have none.
	assert.NoError(t, records.NewRolloutEncoder(io.Discard).Write(records.Rollout{TaskID: "t", AbortReason: ptr("engine_error")}))
}

func TestBoundAbortDetail(t *testing.T) {
	short := "exception: sandbox boot: bwrap: no such file"
	assert.Equal(t, short, records.BoundAbortDetail(short))
	exact := strings.Repeat("a", records.MaxAbortDetail)
	assert.Equal(t, exact, records.BoundAbortDetail(exact))

	cases := map[string]string{
		"ascii":     "HEAD" + strings.Repeat("x", 10000) + "TAIL",
		"multibyte": "HEAD" + strings.Repeat("é漢🙂", 3000) + "TAIL",
		"one over":  "HEAD" + strings.Repeat("y", records.MaxAbortDetail-7) + "TAIL",
	}
	for name, s := range cases {
		t.Run(name, func(t *testing.T) {
			got := records.BoundAbortDetail(s)
			assert.LessOrEqual(t, len(got), records.MaxAbortDetail)
			assert.True(t, utf8.ValidString(got), "cut at rune boundaries")
			assert.True(t, strings.HasPrefix(got, "HEAD"), "keeps the head")
			assert.True(t, strings.HasSuffix(got, "TAIL"), "keeps the tail")
			head, tail, ok := strings.Cut(got, " [... ")
			require.True(t, ok, "the marker: %q", got)
			num, rest, ok := strings.Cut(tail, " bytes cut ...] ")
			require.True(t, ok)
			assert.Equal(t, len(s), len(head)+len(rest)+atoi(t, num), "the marker counts the bytes cut")
			assert.NoError(t, records.NewRolloutEncoder(io.Discard).Write(records.Rollout{TaskID: "t", AbortReason: ptr("engine_error"), AbortDetail: &got}))
		})
	}
}

// An old shard (no abort_detail column) decodes, its rows with a nil
// detail, and passes kiln verify's schema check.
func TestRolloutsV1ShardReads(t *testing.T) {
	shard, err := os.ReadFile(v1Shard)
	require.NoError(t, err)
	var got []records.Rollout
	require.NoError(t, records.EachRollout(shard, func(r records.Rollout) error { got = append(got, r); return nil }))
	require.Len(t, got, 2)
	assert.Equal(t, "t0", got[0].TaskID)
	assert.Equal(t, "diff --git a/x b/x\n", got[0].Patch)
	assert.EqualValues(t, 3, got[0].Turns)
	assert.Nil(t, got[0].AbortReason)
	assert.Nil(t, got[0].AbortDetail)
	require.NotNil(t, got[1].AbortReason)
	assert.Equal(t, "wall_clock_timeout", *got[1].AbortReason)
	assert.Nil(t, got[1].AbortDetail, "a row written before the column has no detail")
	require.NotNil(t, got[0].Artifacts, "the columns after the new one still line up")
	assert.Equal(t, "rollouts/_artifacts/0", *got[0].Artifacts)

	n, err := records.RolloutsKind().CheckShard(shard)
	require.NoError(t, err)
	assert.EqualValues(t, 2, n)
	var js []string
	require.NoError(t, records.RolloutsKind().EachJSON(shard, func(row json.RawMessage) error { js = append(js, string(row)); return nil }))
	assert.Contains(t, js[1], `"abort_reason":"wall_clock_timeout","abort_detail":null`)
}

// A rollouts version committed before abort_detail (its manifest names the
// old schema's fingerprint) opens with this kiln and reads; another
// schema is still refused.
func TestRolloutsV1VersionOpens(t *testing.T) {
	ctx := context.Background()
	shard, err := os.ReadFile(v1Shard)
	require.NoError(t, err)
	st, err := store.NewLocal(t.TempDir())
	require.NoError(t, err)
	write := func(name string, kind records.Kind) (*dataset.Version, error) {
		w, err := dataset.NewWriter(ctx, st, dataset.Spec{Name: name, Kind: kind, Identity: dataset.Identity{Stage: "rollout-run", CodeVersion: "1"}})
		require.NoError(t, err)
		_, err = w.WriteShard(ctx, 2, []string{"a", "b"}, func(w io.Writer) error { _, err := w.Write(shard); return err })
		require.NoError(t, err)
		res, err := w.Commit(ctx, nil)
		if err != nil {
			return nil, err
		}
		return dataset.Open(ctx, st, res.Ref)
	}
	cur := records.RolloutsKind()
	require.Len(t, cur.Older, 1)
	v1 := cur
	v1.Schema, v1.Older = cur.Older[0], nil
	assert.NotEqual(t, cur.Fingerprint(), v1.Fingerprint())
	assert.True(t, cur.Reads(v1.Fingerprint()))

	v, err := write("rollouts", v1)
	require.NoError(t, err, "an older rollouts version stays readable")
	assert.Equal(t, v1.Fingerprint(), v.Manifest.Schema)
	var got []records.Rollout
	require.NoError(t, v.EachShard(ctx, func(_ int, data []byte) error {
		return records.EachRollout(data, func(r records.Rollout) error { got = append(got, r); return nil })
	}))
	require.Len(t, got, 2)
	assert.Nil(t, got[1].AbortDetail)

	other := cur
	other.Schema, other.Older = "message Rollout {\n\trequired int64 rollout_id (INT(64,true));\n}", nil
	assert.False(t, cur.Reads(other.Fingerprint()))
	_, err = write("rollouts-other", other)
	assert.ErrorContains(t, err, "differs from this kiln's")
}

func atoi(t *testing.T, s string) int {
	t.Helper()
	n := 0
	for _, c := range s {
		require.True(t, c >= '0' && c <= '9', "%q is not a number", s)
		n = n*10 + int(c-'0')
	}
	return n
}
