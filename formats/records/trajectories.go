package records

import (
	"bytes"
	"encoding/json"
	"fmt"
	"io"
	"math"

	"github.com/apache/arrow-go/v18/arrow"
	"github.com/apache/arrow-go/v18/arrow/array"
)

// Trajectory is one training segment (the trajectories kind, Arrow IPC).
// tokens holds the segment's leading prompt followed by its response region;
// the last ResponseLength tokens are the response region, aligned with
// LossMask (1 = sampled by the policy and trained, 0 = context) and
// RolloutLogProbs (the sampler's logprob of each response-region token).
//
// Slices returned by the readers alias decoded Arrow buffers: treat them as
// read-only.
type Trajectory struct {
	RolloutID       int64
	Index           int64
	GroupIndex      int64
	Segment         int32
	Tokens          []int32
	ResponseLength  int32
	LossMask        []uint8
	RolloutLogProbs []float32
	Truncated       bool
	UseTool         bool
	IllFormed       bool
	Reward          *float64 // set only when turns were imported with rewards

	// Replay holds the optional replay columns over the response region
	// (top-k heads are [ResponseLength, TopK]).
	Replay
}

var trajectorySchema = arrow.NewSchema(fieldsWithReplay([]arrow.Field{
	{Name: "rollout_id", Type: arrow.PrimitiveTypes.Int64},
	{Name: "index", Type: arrow.PrimitiveTypes.Int64},
	{Name: "group_index", Type: arrow.PrimitiveTypes.Int64},
	{Name: "segment", Type: arrow.PrimitiveTypes.Int32},
	{Name: "tokens", Type: arrow.ListOf(arrow.PrimitiveTypes.Int32)},
	{Name: "response_length", Type: arrow.PrimitiveTypes.Int32},
	{Name: "loss_mask", Type: arrow.ListOf(arrow.PrimitiveTypes.Uint8)},
	{Name: "rollout_log_probs", Type: arrow.ListOf(arrow.PrimitiveTypes.Float32)},
	{Name: "truncated", Type: arrow.FixedWidthTypes.Boolean},
	{Name: "use_tool", Type: arrow.FixedWidthTypes.Boolean},
	{Name: "ill_formed", Type: arrow.FixedWidthTypes.Boolean},
	{Name: "reward", Type: arrow.PrimitiveTypes.Float64, Nullable: true},
}), nil)

// TrajectoriesKind is the trajectories record kind.
func TrajectoriesKind() Kind { return trajectoriesKind }

var trajectoriesKind = Kind{
	Name:     "trajectories",
	Encoding: Arrow,
	Ext:      ".arrow",
	Schema:   trajectorySchema.String(),
	EachJSON: eachJSON(EachTrajectory),
}

// TrajectorySchema is the Arrow schema of the trajectories kind.
func TrajectorySchema() *arrow.Schema { return trajectorySchema }

// Validate checks the segment invariants that every writer must hold.
func (t *Trajectory) Validate() error {
	n := int(t.ResponseLength)
	where := func(format string, args ...any) error {
		return fmt.Errorf("trajectory rollout_id=%d segment=%d: %s", t.RolloutID, t.Segment, fmt.Sprintf(format, args...))
	}
	switch {
	case n <= 0:
		return where("response_length %d must be positive", n)
	case n > len(t.Tokens):
		return where("response_length %d exceeds %d tokens", n, len(t.Tokens))
	case len(t.LossMask) != n:
		return where("loss_mask has %d entries, response_length is %d", len(t.LossMask), n)
	case len(t.RolloutLogProbs) != n:
		return where("rollout_log_probs has %d entries, response_length is %d", len(t.RolloutLogProbs), n)
	}
	// One pass over both columns: this runs on every row read and written.
	trained := 0
	lps := t.RolloutLogProbs[:n]
	for i, m := range t.LossMask[:n] {
		if m > 1 {
			return where("loss_mask[%d] = %d, want 0 or 1", i, m)
		}
		trained += int(m)
		// NaN fails lp <= 0; -Inf is the only value below -MaxFloat32.
		if lp := lps[i]; !(lp <= 0) || lp < -math.MaxFloat32 {
			return where("rollout_log_probs[%d] = %v is not a finite logprob", i, lp)
		}
	}
	if trained == 0 {
		return where("no trained token (loss_mask is all 0)")
	}
	if t.TopPTokenOffsets != nil || t.TopPTokenIDs != nil || t.TopPLogProbs != nil {
		off := t.TopPTokenOffsets
		if len(off) != n+1 || off[0] != 0 || int(off[n]) != len(t.TopPTokenIDs) {
			return where("top-p offsets must have response_length+1 entries from 0 to len(ids)")
		}
		for i := 1; i < len(off); i++ {
			if off[i] < off[i-1] {
				return where("top-p offsets decrease at %d", i)
			}
		}
		if t.TopPLogProbs != nil && len(t.TopPLogProbs) != len(t.TopPTokenIDs) {
			return where("top-p logprobs have %d entries, ids %d", len(t.TopPLogProbs), len(t.TopPTokenIDs))
		}
	}
	if t.TopKTokenIDs != nil || t.TopKLogProbs != nil {
		if t.TopK <= 0 || len(t.TopKTokenIDs) != n*int(t.TopK) || len(t.TopKLogProbs) != len(t.TopKTokenIDs) {
			return where("top-k heads must be [response_length, k] ids and logprobs")
		}
	}
	if t.RoutedExperts != nil {
		size := 1
		for _, d := range t.RoutedExpertsShape {
			size *= int(d)
		}
		if len(t.RoutedExpertsShape) != 3 || size != len(t.RoutedExperts) {
			return where("routed experts do not match their shape %v", t.RoutedExpertsShape)
		}
	}
	return nil
}

// TrajectoryEncoder streams segments into one Arrow IPC file, a record batch
// per BatchTokens tokens.
type TrajectoryEncoder struct{ *arrowWriter }

// NewTrajectoryEncoder writes an Arrow IPC file to w; Close finishes it.
func NewTrajectoryEncoder(w io.Writer, opts ArrowOptions) (*TrajectoryEncoder, error) {
	aw, err := newArrowWriter(w, trajectorySchema, opts)
	if err != nil {
		return nil, err
	}
	return &TrajectoryEncoder{aw}, nil
}

// Write validates and appends segments.
func (e *TrajectoryEncoder) Write(segs ...Trajectory) error {
	for i := range segs {
		t := &segs[i]
		if err := t.Validate(); err != nil {
			return err
		}
		appendTrajectory(e.arrowWriter, t)
		if err := e.rowDone(len(t.Tokens)); err != nil {
			return err
		}
	}
	return nil
}

// appendTrajectory appends t's row, unchecked (Write checks it first).
func appendTrajectory(a *arrowWriter, t *Trajectory) {
	c := a.col
	c("rollout_id").(*array.Int64Builder).Append(t.RolloutID)
	c("index").(*array.Int64Builder).Append(t.Index)
	c("group_index").(*array.Int64Builder).Append(t.GroupIndex)
	c("segment").(*array.Int32Builder).Append(t.Segment)
	appendInt32s(c("tokens"), t.Tokens, false)
	c("response_length").(*array.Int32Builder).Append(t.ResponseLength)
	lb := c("loss_mask").(*array.ListBuilder)
	lb.Append(true)
	lb.ValueBuilder().(*array.Uint8Builder).AppendValues(t.LossMask, nil)
	appendFloat32s(c("rollout_log_probs"), t.RolloutLogProbs, false)
	c("truncated").(*array.BooleanBuilder).Append(t.Truncated)
	c("use_tool").(*array.BooleanBuilder).Append(t.UseTool)
	c("ill_formed").(*array.BooleanBuilder).Append(t.IllFormed)
	appendOptFloat64(c("reward"), t.Reward)
	t.Replay.appendTo(c)
}

func appendInt32s(b array.Builder, v []int32, nullable bool) {
	lb := b.(*array.ListBuilder)
	if v == nil && nullable {
		lb.AppendNull()
		return
	}
	lb.Append(true)
	lb.ValueBuilder().(*array.Int32Builder).AppendValues(v, nil)
}

func appendFloat32s(b array.Builder, v []float32, nullable bool) {
	lb := b.(*array.ListBuilder)
	if v == nil && nullable {
		lb.AppendNull()
		return
	}
	lb.Append(true)
	lb.ValueBuilder().(*array.Float32Builder).AppendValues(v, nil)
}

// EachTrajectory decodes an Arrow IPC trajectories shard held in memory,
// batch by batch; uncompressed buffers are used in place. The *Trajectory
// passed to fn is reused: copy what must outlive the call.
func EachTrajectory(shard []byte, fn func(*Trajectory) error) error {
	var t Trajectory
	return eachBatch("trajectories", shard, trajectorySchema, func(rec arrow.RecordBatch) error {
		return eachRow(rec, &t, fn)
	})
}

func eachRow(rec arrow.RecordBatch, t *Trajectory, fn func(*Trajectory) error) error {
	c := rec.Columns()
	i64 := func(j int) *array.Int64 { return c[j].(*array.Int64) }
	i32 := func(j int) *array.Int32 { return c[j].(*array.Int32) }
	bl := func(j int) *array.Boolean { return c[j].(*array.Boolean) }
	for r := 0; r < int(rec.NumRows()); r++ {
		*t = Trajectory{
			RolloutID:       i64(0).Value(r),
			Index:           i64(1).Value(r),
			GroupIndex:      i64(2).Value(r),
			Segment:         i32(3).Value(r),
			Tokens:          listInt32(c[4], r),
			ResponseLength:  i32(5).Value(r),
			LossMask:        listUint8(c[6], r),
			RolloutLogProbs: listFloat32(c[7], r),
			Truncated:       bl(8).Value(r),
			UseTool:         bl(9).Value(r),
			IllFormed:       bl(10).Value(r),
		}
		if rw := c[11].(*array.Float64); rw.IsValid(r) {
			v := rw.Value(r)
			t.Reward = &v
		}
		t.Replay.readFrom(c[12:], r)
		if err := t.Validate(); err != nil {
			return fmt.Errorf("trajectories shard: %w", err)
		}
		if err := fn(t); err != nil {
			return err
		}
	}
	return nil
}

func listBounds(a arrow.Array, r int) (*array.List, int, int, bool) {
	l := a.(*array.List)
	if l.IsNull(r) {
		return l, 0, 0, false
	}
	start, end := l.ValueOffsets(r)
	return l, int(start), int(end), true
}

func listInt32(a arrow.Array, r int) []int32 {
	l, s, e, ok := listBounds(a, r)
	if !ok {
		return nil
	}
	if s == e {
		return []int32{} // present but empty, unlike a null list
	}
	return l.ListValues().(*array.Int32).Int32Values()[s:e:e]
}

func listUint8(a arrow.Array, r int) []uint8 {
	l, s, e, ok := listBounds(a, r)
	if !ok {
		return nil
	}
	if s == e {
		return []uint8{} // present but empty, unlike a null list
	}
	return l.ListValues().(*array.Uint8).Uint8Values()[s:e:e]
}

func listFloat32(a arrow.Array, r int) []float32 {
	l, s, e, ok := listBounds(a, r)
	if !ok {
		return nil
	}
	if s == e {
		return []float32{} // present but empty, unlike a null list
	}
	return l.ListValues().(*array.Float32).Float32Values()[s:e:e]
}

type trajectoryRow struct {
	RolloutID       int64     `json:"rollout_id"`
	Index           int64     `json:"index"`
	GroupIndex      int64     `json:"group_index"`
	Segment         int32     `json:"segment"`
	Tokens          []int32   `json:"tokens"`
	ResponseLength  int32     `json:"response_length"`
	LossMask        []int     `json:"loss_mask"`
	RolloutLogProbs []float32 `json:"rollout_log_probs"`
	Truncated       bool      `json:"truncated"`
	UseTool         bool      `json:"use_tool"`
	IllFormed       bool      `json:"ill_formed"`
	Reward          *float64  `json:"reward"`
	Replay
}

// MarshalRow is the segment's JSON view (field names as the Arrow columns;
// loss_mask as numbers, absent replay columns omitted).
func (t *Trajectory) MarshalRow() (json.RawMessage, error) {
	row := trajectoryRow{
		RolloutID: t.RolloutID, Index: t.Index, GroupIndex: t.GroupIndex, Segment: t.Segment,
		Tokens: t.Tokens, ResponseLength: t.ResponseLength, RolloutLogProbs: t.RolloutLogProbs,
		Truncated: t.Truncated, UseTool: t.UseTool, IllFormed: t.IllFormed, Reward: t.Reward,
		Replay: t.Replay,
	}
	row.LossMask = make([]int, len(t.LossMask))
	for i, m := range t.LossMask {
		row.LossMask[i] = int(m)
	}
	return marshalNoEscape(row)
}

// marshalNoEscape is json.Marshal without HTML escaping.
func marshalNoEscape(v any) (json.RawMessage, error) {
	var buf bytes.Buffer
	enc := json.NewEncoder(&buf)
	enc.SetEscapeHTML(false)
	if err := enc.Encode(v); err != nil {
		return nil, err
	}
	return bytes.TrimRight(buf.Bytes(), "\n"), nil
}
