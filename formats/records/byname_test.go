package records

import (
	"bytes"
	"slices"
	"testing"

	"github.com/apache/arrow-go/v18/arrow"
	"github.com/apache/arrow-go/v18/arrow/array"
	"github.com/apache/arrow-go/v18/arrow/ipc"
	"github.com/stretchr/testify/require"
)

// The encoders set each field by its column's name: over a schema with the
// same columns in reverse order, every value still lands in its column.
func TestEncodersSetFieldsByName(t *testing.T) {
	reversed := func(s *arrow.Schema) *arrow.Schema {
		f := slices.Clone(s.Fields())
		slices.Reverse(f)
		return arrow.NewSchema(f, nil)
	}
	read := func(data []byte) arrow.RecordBatch {
		r, err := ipc.NewFileReader(bytes.NewReader(data))
		require.NoError(t, err)
		rec, err := r.RecordBatch(0)
		require.NoError(t, err)
		return rec
	}
	col := func(rec arrow.RecordBatch, name string) arrow.Array {
		return rec.Column(rec.Schema().FieldIndices(name)[0])
	}

	var buf bytes.Buffer
	aw, err := newArrowWriter(&buf, reversed(turnSchema), ArrowOptions{})
	require.NoError(t, err)
	started := int64(77)
	turn := Turn{RolloutID: 5, Index: 6, GroupIndex: 7, Session: "s", Turn: 3, PromptIDs: []int32{1, 2}, OutputIDs: []int32{9},
		OutputLogProbs: []float32{-0.5}, FinishReason: "stop", PromptMessages: `[]`, MaxContextTokens: 4096, StartedMs: &started}
	require.NoError(t, (&TurnEncoder{aw}).Write(turn))
	require.NoError(t, aw.Close())
	rec := read(buf.Bytes())
	require.Equal(t, int64(5), col(rec, "rollout_id").(*array.Int64).Value(0))
	require.Equal(t, int64(7), col(rec, "group_index").(*array.Int64).Value(0))
	require.Equal(t, int32(3), col(rec, "turn").(*array.Int32).Value(0))
	require.Equal(t, int32(4096), col(rec, "max_context_tokens").(*array.Int32).Value(0))
	require.Equal(t, int64(77), col(rec, "started_ms").(*array.Int64).Value(0))
	require.True(t, col(rec, "duration_ms").IsNull(0))
	require.True(t, col(rec, "rollout_topk_k").IsNull(0))

	buf.Reset()
	aw, err = newArrowWriter(&buf, reversed(advantageSchema), ArrowOptions{})
	require.NoError(t, err)
	require.NoError(t, (&AdvantageEncoder{aw}).Write(Advantage{RolloutID: 1, Segment: 2, GroupIndex: 3, Advantage: 0.25, RolloutTrainedTokens: 4, Reward: 1}))
	require.NoError(t, aw.Close())
	rec = read(buf.Bytes())
	require.Equal(t, int32(2), col(rec, "segment").(*array.Int32).Value(0))
	require.Equal(t, int64(3), col(rec, "group_index").(*array.Int64).Value(0))
	require.Equal(t, 0.25, col(rec, "advantage").(*array.Float64).Value(0))
	require.Equal(t, int64(4), col(rec, "rollout_trained_tokens").(*array.Int64).Value(0))
}
