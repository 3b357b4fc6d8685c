package records

import (
	"encoding/json"
	"fmt"
	"io"
	"math"

	"github.com/apache/arrow-go/v18/arrow"
	"github.com/apache/arrow-go/v18/arrow/array"
)

// Advantage is one row of the advantages kind (Arrow IPC): the training
// signal of one segment (docs/advantages.md §2). Every segment of a rollout
// carries the rollout's advantage, reward and loss denominator; statistics
// are over rollouts, never over segments.
type Advantage struct {
	RolloutID  int64
	Segment    int32
	GroupIndex int64
	// Advantage is the rollout's advantage, broadcast to the segment (and,
	// by the trainer, to every trained token of it).
	Advantage float64
	// RolloutTrainedTokens is the loss denominator: the trained tokens
	// (loss_mask 1) of all the rollout's segments together, so a segment's
	// token-loss sum is divided by its whole rollout's total however the
	// segments are split across micro-batches.
	RolloutTrainedTokens int64
	// Reward is the rollout's reward from its grade (the only source).
	Reward float64
}

var advantageSchema = arrow.NewSchema([]arrow.Field{
	{Name: "rollout_id", Type: arrow.PrimitiveTypes.Int64},
	{Name: "segment", Type: arrow.PrimitiveTypes.Int32},
	{Name: "group_index", Type: arrow.PrimitiveTypes.Int64},
	{Name: "advantage", Type: arrow.PrimitiveTypes.Float64},
	{Name: "rollout_trained_tokens", Type: arrow.PrimitiveTypes.Int64},
	{Name: "reward", Type: arrow.PrimitiveTypes.Float64},
}, nil)

// AdvantagesKind is the advantages record kind.
func AdvantagesKind() Kind { return advantagesKind }

var advantagesKind = Kind{
	Name:     "advantages",
	Encoding: Arrow,
	Ext:      ".arrow",
	Schema:   advantageSchema.String(),
	EachJSON: eachJSON(EachAdvantage),
}

// AdvantageSchema is the Arrow schema of the advantages kind.
func AdvantageSchema() *arrow.Schema { return advantageSchema }

// Validate checks the invariants every advantages row holds: finite
// numbers and a positive denominator (every segment has a trained token).
func (a *Advantage) Validate() error {
	switch {
	case math.IsNaN(a.Advantage) || math.IsInf(a.Advantage, 0):
		return fmt.Errorf("advantage of rollout %d segment %d is %v, not a finite number", a.RolloutID, a.Segment, a.Advantage)
	case math.IsNaN(a.Reward) || math.IsInf(a.Reward, 0):
		return fmt.Errorf("reward of rollout %d segment %d is %v, not a finite number", a.RolloutID, a.Segment, a.Reward)
	case a.RolloutTrainedTokens <= 0:
		return fmt.Errorf("rollout %d segment %d: rollout_trained_tokens %d must be positive", a.RolloutID, a.Segment, a.RolloutTrainedTokens)
	}
	return nil
}

// advantageBatchRows bounds a record batch of the advantages kind.
const advantageBatchRows = 1 << 16

// AdvantageEncoder streams advantages rows into one Arrow IPC file.
type AdvantageEncoder struct{ *arrowWriter }

// NewAdvantageEncoder writes an Arrow IPC file to w; Close finishes it.
// BatchTokens in opts counts rows here (default 65,536 per batch).
func NewAdvantageEncoder(w io.Writer, opts ArrowOptions) (*AdvantageEncoder, error) {
	if opts.BatchTokens <= 0 {
		opts.BatchTokens = advantageBatchRows
	}
	aw, err := newArrowWriter(w, advantageSchema, opts)
	if err != nil {
		return nil, err
	}
	return &AdvantageEncoder{aw}, nil
}

// Write validates and appends rows.
func (e *AdvantageEncoder) Write(rows ...Advantage) error {
	// The record builder keeps its field builders across batches, so they
	// are looked up once, not per row.
	rid, seg, grp := e.col("rollout_id").(*array.Int64Builder), e.col("segment").(*array.Int32Builder), e.col("group_index").(*array.Int64Builder)
	adv, tok, rew := e.col("advantage").(*array.Float64Builder), e.col("rollout_trained_tokens").(*array.Int64Builder), e.col("reward").(*array.Float64Builder)
	for i := range rows {
		a := &rows[i]
		if err := a.Validate(); err != nil {
			return err
		}
		rid.Append(a.RolloutID)
		seg.Append(a.Segment)
		grp.Append(a.GroupIndex)
		adv.Append(a.Advantage)
		tok.Append(a.RolloutTrainedTokens)
		rew.Append(a.Reward)
		if err := e.rowDone(1); err != nil {
			return err
		}
	}
	return nil
}

// EachAdvantage decodes an advantages shard held in memory, in row order,
// checking every row. The *Advantage passed to fn is reused.
func EachAdvantage(shard []byte, fn func(*Advantage) error) error {
	var a Advantage
	return eachBatch("advantages", shard, advantageSchema, func(rec arrow.RecordBatch) error {
		c := rec.Columns()
		rid, seg, grp := c[0].(*array.Int64), c[1].(*array.Int32), c[2].(*array.Int64)
		adv, tok, rew := c[3].(*array.Float64), c[4].(*array.Int64), c[5].(*array.Float64)
		for r := 0; r < int(rec.NumRows()); r++ {
			a = Advantage{RolloutID: rid.Value(r), Segment: seg.Value(r), GroupIndex: grp.Value(r),
				Advantage: adv.Value(r), RolloutTrainedTokens: tok.Value(r), Reward: rew.Value(r)}
			if err := a.Validate(); err != nil {
				return fmt.Errorf("advantages shard: %w", err)
			}
			if err := fn(&a); err != nil {
				return err
			}
		}
		return nil
	})
}

type advantageRow struct {
	RolloutID            int64   `json:"rollout_id"`
	Segment              int32   `json:"segment"`
	GroupIndex           int64   `json:"group_index"`
	Advantage            float64 `json:"advantage"`
	RolloutTrainedTokens int64   `json:"rollout_trained_tokens"`
	Reward               float64 `json:"reward"`
}

// MarshalRow is the row's JSON view (field names as the Arrow columns).
func (a *Advantage) MarshalRow() (json.RawMessage, error) {
	return marshalNoEscape(advantageRow(*a))
}

// SegmentTotals is what advantage estimation reads of a trajectories row:
// its ids, its trained-token count and whether it was truncated.
type SegmentTotals struct {
	RolloutID  int64
	Index      int64
	GroupIndex int64
	Segment    int32
	Trained    int64 // loss_mask ones
	Truncated  bool
}

// EachSegmentTotals decodes a trajectories shard held in memory reading
// only the columns SegmentTotals needs, in row order. It checks what those
// numbers rest on (response_length within the tokens, loss_mask of
// response_length 0/1 entries with at least one 1, logprobs of the same
// length) and not the rest of the row (logprob values, replay columns),
// which EachTrajectory checks for the readers that use them.
func EachSegmentTotals(shard []byte, fn func(SegmentTotals) error) error {
	return eachBatch("trajectories", shard, trajectorySchema, func(rec arrow.RecordBatch) error {
		c := rec.Columns()
		rid, idx, grp := c[0].(*array.Int64), c[1].(*array.Int64), c[2].(*array.Int64)
		seg, rl := c[3].(*array.Int32), c[5].(*array.Int32)
		toks, mask, lps := c[4].(*array.List), c[6].(*array.List), c[7].(*array.List)
		trunc := c[8].(*array.Boolean)
		masks := mask.ListValues().(*array.Uint8).Uint8Values()
		for r := 0; r < int(rec.NumRows()); r++ {
			s := SegmentTotals{RolloutID: rid.Value(r), Index: idx.Value(r), GroupIndex: grp.Value(r), Segment: seg.Value(r), Truncated: trunc.Value(r)}
			n := int64(rl.Value(r))
			ts, te := toks.ValueOffsets(r)
			ms, me := mask.ValueOffsets(r)
			ls, le := lps.ValueOffsets(r)
			where := func(format string, args ...any) error {
				return fmt.Errorf("trajectories shard: trajectory rollout_id=%d segment=%d: %s", s.RolloutID, s.Segment, fmt.Sprintf(format, args...))
			}
			switch {
			case n <= 0 || n > te-ts || toks.IsNull(r):
				return where("response_length %d is not within its %d tokens", n, te-ts)
			case me-ms != n || mask.IsNull(r):
				return where("loss_mask has %d entries, response_length is %d", me-ms, n)
			case le-ls != n || lps.IsNull(r):
				return where("rollout_log_probs has %d entries, response_length is %d", le-ls, n)
			}
			for i, m := range masks[ms:me] {
				if m > 1 {
					return where("loss_mask[%d] = %d, want 0 or 1", i, m)
				}
				s.Trained += int64(m)
			}
			if s.Trained == 0 {
				return where("no trained token (loss_mask is all 0)")
			}
			if err := fn(s); err != nil {
				return err
			}
		}
		return nil
	})
}
