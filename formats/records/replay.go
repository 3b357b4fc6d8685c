package records

import (
	"github.com/apache/arrow-go/v18/arrow"
	"github.com/apache/arrow-go/v18/arrow/array"
)

// Replay is the optional sampler replay data over a run of outputs (docs/assembly.md
// §2.3): the same eight columns in turns (over a turn's outputs) and in
// trajectories (over a segment's response region). Each is nil when absent.
type Replay struct {
	// Top-p nucleus, CSR: row r's candidate ids are
	// TopPTokenIDs[TopPTokenOffsets[r]:TopPTokenOffsets[r+1]]; TopPLogProbs
	// (score centering) is aligned with TopPTokenIDs.
	TopPTokenIDs     []int32   `json:"rollout_top_p_token_ids,omitempty"`
	TopPTokenOffsets []int32   `json:"rollout_top_p_token_offsets,omitempty"`
	TopPLogProbs     []float32 `json:"rollout_top_p_log_probs,omitempty"`
	// Top-k heads, row-major [rows, TopK].
	TopKTokenIDs []int32   `json:"rollout_topk_token_ids,omitempty"`
	TopKLogProbs []float32 `json:"rollout_topk_log_probs,omitempty"`
	TopK         int32     `json:"rollout_topk_k,omitempty"`
	// Routed experts, row-major with shape RoutedExpertsShape
	// ([positions, layers, topk]).
	RoutedExperts      []int32 `json:"rollout_routed_experts,omitempty"`
	RoutedExpertsShape []int32 `json:"rollout_routed_experts_shape,omitempty"`
}

// replayFields are the Arrow columns of Replay, in order.
var replayFields = []arrow.Field{
	{Name: "rollout_top_p_token_ids", Type: arrow.ListOf(arrow.PrimitiveTypes.Int32), Nullable: true},
	{Name: "rollout_top_p_token_offsets", Type: arrow.ListOf(arrow.PrimitiveTypes.Int32), Nullable: true},
	{Name: "rollout_top_p_log_probs", Type: arrow.ListOf(arrow.PrimitiveTypes.Float32), Nullable: true},
	{Name: "rollout_topk_token_ids", Type: arrow.ListOf(arrow.PrimitiveTypes.Int32), Nullable: true},
	{Name: "rollout_topk_log_probs", Type: arrow.ListOf(arrow.PrimitiveTypes.Float32), Nullable: true},
	{Name: "rollout_topk_k", Type: arrow.PrimitiveTypes.Int32, Nullable: true},
	{Name: "rollout_routed_experts", Type: arrow.ListOf(arrow.PrimitiveTypes.Int32), Nullable: true},
	{Name: "rollout_routed_experts_shape", Type: arrow.ListOf(arrow.PrimitiveTypes.Int32), Nullable: true},
}

// fieldsWithReplay is head, then the replay columns, then tail.
func fieldsWithReplay(head []arrow.Field, tail ...arrow.Field) []arrow.Field {
	out := append(append([]arrow.Field{}, head...), replayFields...)
	return append(out, tail...)
}

// appendTo appends the replay columns through col (arrowWriter.col).
func (r *Replay) appendTo(col func(name string) array.Builder) {
	appendInt32s(col("rollout_top_p_token_ids"), r.TopPTokenIDs, true)
	appendInt32s(col("rollout_top_p_token_offsets"), r.TopPTokenOffsets, true)
	appendFloat32s(col("rollout_top_p_log_probs"), r.TopPLogProbs, true)
	appendInt32s(col("rollout_topk_token_ids"), r.TopKTokenIDs, true)
	appendFloat32s(col("rollout_topk_log_probs"), r.TopKLogProbs, true)
	appendOptInt32(col("rollout_topk_k"), r.TopK, r.TopKTokenIDs != nil)
	appendInt32s(col("rollout_routed_experts"), r.RoutedExperts, true)
	appendInt32s(col("rollout_routed_experts_shape"), r.RoutedExpertsShape, true)
}

// readFrom reads row's replay columns from c, which starts at the first one.
func (r *Replay) readFrom(c []arrow.Array, row int) {
	*r = Replay{
		TopPTokenIDs: listInt32(c[0], row), TopPTokenOffsets: listInt32(c[1], row), TopPLogProbs: listFloat32(c[2], row),
		TopKTokenIDs: listInt32(c[3], row), TopKLogProbs: listFloat32(c[4], row),
		RoutedExperts: listInt32(c[6], row), RoutedExpertsShape: listInt32(c[7], row),
	}
	if k := c[5].(*array.Int32); k.IsValid(row) {
		r.TopK = k.Value(row)
	}
}
