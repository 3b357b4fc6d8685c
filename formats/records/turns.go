package records

import (
	"encoding/json"
	"fmt"
	"io"
	"strings"

	"github.com/apache/arrow-go/v18/arrow"
	"github.com/apache/arrow-go/v18/arrow/array"
)

// Turn is one model call of an agent session (the turns kind, Arrow IPC):
// the complete prompt sent to the engine, the sampled output and its
// logprobs, and the messages the adapter translated and parsed. Rows of one
// session are contiguous and in call order.
type Turn struct {
	RolloutID  int64
	Index      int64
	GroupIndex int64
	Session    string
	Turn       int32 // 0-based call number within the session
	PromptIDs  []int32
	OutputIDs  []int32
	// OutputLogProbs is empty or one sampler logprob per output token.
	OutputLogProbs []float32
	FinishReason   string
	IllFormed      bool
	// PromptMessages is the JSON array of chat messages after protocol
	// translation; ResponseMessage the parsed assistant message (JSON, nil
	// when the output did not parse into one).
	PromptMessages   string
	ResponseMessage  *string
	MaxContextTokens int32
	// Reward is set only for turns imported from systems that carry one.
	Reward *float64
	// Replay holds the optional replay data over the outputs (top-k heads
	// are [len(OutputIDs), TopK]; routes cover prompt and output positions).
	Replay
	StartedMs  *int64 // unix milliseconds when the call started
	DurationMs *int64
}

var turnSchema = arrow.NewSchema(fieldsWithReplay([]arrow.Field{
	{Name: "rollout_id", Type: arrow.PrimitiveTypes.Int64},
	{Name: "index", Type: arrow.PrimitiveTypes.Int64},
	{Name: "group_index", Type: arrow.PrimitiveTypes.Int64},
	{Name: "session", Type: arrow.BinaryTypes.String},
	{Name: "turn", Type: arrow.PrimitiveTypes.Int32},
	{Name: "prompt_ids", Type: arrow.ListOf(arrow.PrimitiveTypes.Int32)},
	{Name: "output_ids", Type: arrow.ListOf(arrow.PrimitiveTypes.Int32)},
	{Name: "output_log_probs", Type: arrow.ListOf(arrow.PrimitiveTypes.Float32)},
	{Name: "finish_reason", Type: arrow.BinaryTypes.String},
	{Name: "ill_formed", Type: arrow.FixedWidthTypes.Boolean},
	{Name: "prompt_messages", Type: arrow.BinaryTypes.String},
	{Name: "response_message", Type: arrow.BinaryTypes.String, Nullable: true},
	{Name: "max_context_tokens", Type: arrow.PrimitiveTypes.Int32},
	{Name: "reward", Type: arrow.PrimitiveTypes.Float64, Nullable: true},
},
	arrow.Field{Name: "started_ms", Type: arrow.PrimitiveTypes.Int64, Nullable: true},
	arrow.Field{Name: "duration_ms", Type: arrow.PrimitiveTypes.Int64, Nullable: true},
), nil)

// TurnsKind is the turns record kind.
func TurnsKind() Kind { return turnsKind }

var turnsKind = Kind{
	Name:     "turns",
	Encoding: Arrow,
	Ext:      ".arrow",
	Schema:   turnSchema.String(),
	EachJSON: eachJSON(EachTurn),
}

// Validate checks what every turn must hold on write, and on import: the
// adapter's turns and imported ones pass the same checks. Replay data is
// checked in depth by trajectory assembly, which fails closed.
func (t *Turn) Validate() error {
	where := func(format string, args ...any) error {
		return fmt.Errorf("turn %d of session %q: %s", t.Turn, t.Session, fmt.Sprintf(format, args...))
	}
	if err := checkIDs(t.RolloutID, t.Index, t.GroupIndex); err != nil {
		return where("%v", err)
	}
	for _, c := range []struct {
		what string
		ids  []int32
	}{{"prompt_ids", t.PromptIDs}, {"output_ids", t.OutputIDs}, {"rollout_top_p_token_ids", t.TopPTokenIDs}, {"rollout_topk_token_ids", t.TopKTokenIDs}} {
		if err := checkTokenIDs(c.what, c.ids); err != nil {
			return where("%v", err)
		}
	}
	for _, c := range []struct {
		what string
		lps  []float32
	}{{"output_log_probs", t.OutputLogProbs}} {
		if err := checkLogProbs(c.what, c.lps); err != nil {
			return where("%v", err)
		}
	}
	switch {
	case t.Session == "":
		return where("empty session")
	case t.Turn < 0 || t.MaxContextTokens < 0:
		return where("negative turn (%d) or max_context_tokens (%d)", t.Turn, t.MaxContextTokens)
	case t.Reward != nil && !finite(*t.Reward):
		return where("reward %v is not a finite number", *t.Reward)
	case (t.StartedMs != nil && *t.StartedMs < 0) || (t.DurationMs != nil && *t.DurationMs < 0):
		return where("negative started_ms or duration_ms")
	case len(t.OutputLogProbs) != 0 && len(t.OutputLogProbs) != len(t.OutputIDs):
		return where("output_log_probs has %d entries for %d output ids", len(t.OutputLogProbs), len(t.OutputIDs))
	case t.TopPTokenOffsets != nil && len(t.TopPTokenOffsets) != len(t.OutputIDs)+1:
		return where("rollout_top_p_token_offsets has %d entries, want %d", len(t.TopPTokenOffsets), len(t.OutputIDs)+1)
	}
	// A whole history per turn: checked in one pass, without decoding it.
	if pm := strings.TrimSpace(t.PromptMessages); !strings.HasPrefix(pm, "[") || !json.Valid([]byte(pm)) {
		return where("prompt_messages is not a JSON array")
	}
	if t.ResponseMessage != nil && !json.Valid([]byte(*t.ResponseMessage)) {
		return where("response_message is not valid JSON")
	}
	return nil
}

// TurnEncoder streams turns into one Arrow IPC file.
type TurnEncoder struct{ *arrowWriter }

// NewTurnEncoder writes an Arrow IPC file of turns to w; Close finishes it.
func NewTurnEncoder(w io.Writer, opts ArrowOptions) (*TurnEncoder, error) {
	aw, err := newArrowWriter(w, turnSchema, opts)
	if err != nil {
		return nil, err
	}
	return &TurnEncoder{aw}, nil
}

// Write validates and appends turns.
func (e *TurnEncoder) Write(turns ...Turn) error {
	for i := range turns {
		t := &turns[i]
		if err := t.Validate(); err != nil {
			return err
		}
		c := e.col
		c("rollout_id").(*array.Int64Builder).Append(t.RolloutID)
		c("index").(*array.Int64Builder).Append(t.Index)
		c("group_index").(*array.Int64Builder).Append(t.GroupIndex)
		c("session").(*array.StringBuilder).Append(t.Session)
		c("turn").(*array.Int32Builder).Append(t.Turn)
		appendInt32s(c("prompt_ids"), t.PromptIDs, false)
		appendInt32s(c("output_ids"), t.OutputIDs, false)
		appendFloat32s(c("output_log_probs"), t.OutputLogProbs, false)
		c("finish_reason").(*array.StringBuilder).Append(t.FinishReason)
		c("ill_formed").(*array.BooleanBuilder).Append(t.IllFormed)
		c("prompt_messages").(*array.StringBuilder).Append(t.PromptMessages)
		appendOptString(c("response_message"), t.ResponseMessage)
		c("max_context_tokens").(*array.Int32Builder).Append(t.MaxContextTokens)
		appendOptFloat64(c("reward"), t.Reward)
		t.Replay.appendTo(c)
		appendOptInt64(c("started_ms"), t.StartedMs)
		appendOptInt64(c("duration_ms"), t.DurationMs)
		if err := e.rowDone(len(t.PromptIDs) + len(t.OutputIDs)); err != nil {
			return err
		}
	}
	return nil
}

// EachTurn decodes a turns shard; the *Turn passed to fn is reused and its
// slices alias the shard's buffers.
func EachTurn(shard []byte, fn func(*Turn) error) error {
	var t Turn
	return eachBatch("turns", shard, turnSchema, func(rec arrow.RecordBatch) error {
		return eachTurnRow(rec, &t, fn)
	})
}

func eachTurnRow(rec arrow.RecordBatch, t *Turn, fn func(*Turn) error) error {
	c := rec.Columns()
	i64 := func(j int) *array.Int64 { return c[j].(*array.Int64) }
	i32 := func(j int) *array.Int32 { return c[j].(*array.Int32) }
	str := func(j int) *array.String { return c[j].(*array.String) }
	for r := 0; r < int(rec.NumRows()); r++ {
		*t = Turn{
			RolloutID: i64(0).Value(r), Index: i64(1).Value(r), GroupIndex: i64(2).Value(r),
			Session: str(3).Value(r), Turn: i32(4).Value(r),
			PromptIDs: listInt32(c[5], r), OutputIDs: listInt32(c[6], r), OutputLogProbs: listFloat32(c[7], r),
			FinishReason: str(8).Value(r), IllFormed: c[9].(*array.Boolean).Value(r),
			PromptMessages: str(10).Value(r), MaxContextTokens: i32(12).Value(r),
		}
		t.Replay.readFrom(c[14:], r)
		if s := str(11); s.IsValid(r) {
			v := s.Value(r)
			t.ResponseMessage = &v
		}
		if f := c[13].(*array.Float64); f.IsValid(r) {
			v := f.Value(r)
			t.Reward = &v
		}
		if v := i64(22); v.IsValid(r) {
			x := v.Value(r)
			t.StartedMs = &x
		}
		if v := i64(23); v.IsValid(r) {
			x := v.Value(r)
			t.DurationMs = &x
		}
		if err := fn(t); err != nil {
			return err
		}
	}
	return nil
}

// TurnJSON is the JSON form of a turn: the turns columns by name, messages
// embedded as JSON. kiln-rollout assemble --turns-jsonl reads it; kiln
// export writes it.
type TurnJSON struct {
	RolloutID        *int64          `json:"rollout_id,omitempty"`
	Index            int64           `json:"index"`
	GroupIndex       int64           `json:"group_index"`
	Session          string          `json:"session"`
	Turn             *int32          `json:"turn,omitempty"`
	PromptIDs        []int32         `json:"prompt_ids"`
	OutputIDs        []int32         `json:"output_ids"`
	OutputLogProbs   []float32       `json:"output_log_probs"`
	FinishReason     string          `json:"finish_reason"`
	IllFormed        bool            `json:"ill_formed"`
	PromptMessages   json.RawMessage `json:"prompt_messages"`
	ResponseMessage  json.RawMessage `json:"response_message"`
	MaxContextTokens int32           `json:"max_context_tokens"`
	Reward           *float64        `json:"reward"`
	Replay
	StartedMs  *int64 `json:"started_ms,omitempty"`
	DurationMs *int64 `json:"duration_ms,omitempty"`
}

// MarshalRow is the turn's JSON view.
func (t *Turn) MarshalRow() (json.RawMessage, error) {
	rid, turn := t.RolloutID, t.Turn
	j := TurnJSON{RolloutID: &rid, Index: t.Index, GroupIndex: t.GroupIndex, Session: t.Session, Turn: &turn,
		PromptIDs: t.PromptIDs, OutputIDs: t.OutputIDs, OutputLogProbs: t.OutputLogProbs,
		FinishReason: t.FinishReason, IllFormed: t.IllFormed, PromptMessages: json.RawMessage(t.PromptMessages),
		ResponseMessage: json.RawMessage("null"), MaxContextTokens: t.MaxContextTokens, Reward: t.Reward,
		Replay: t.Replay, StartedMs: t.StartedMs, DurationMs: t.DurationMs}
	if t.ResponseMessage != nil {
		j.ResponseMessage = json.RawMessage(*t.ResponseMessage)
	}
	if j.OutputLogProbs == nil {
		j.OutputLogProbs = []float32{}
	}
	return marshalNoEscape(j)
}

// ToTurn converts the JSON form; order is the turn's position in its session
// when the row has no "turn".
func (j *TurnJSON) ToTurn(order int32) (Turn, error) {
	t := Turn{Index: j.Index, GroupIndex: j.GroupIndex, RolloutID: j.Index, Session: j.Session, Turn: order,
		PromptIDs: j.PromptIDs, OutputIDs: j.OutputIDs, OutputLogProbs: j.OutputLogProbs,
		FinishReason: j.FinishReason, IllFormed: j.IllFormed, PromptMessages: string(j.PromptMessages),
		MaxContextTokens: j.MaxContextTokens, Reward: j.Reward,
		Replay: j.Replay, StartedMs: j.StartedMs, DurationMs: j.DurationMs}
	if j.RolloutID != nil {
		t.RolloutID = *j.RolloutID
	}
	if j.Turn != nil {
		t.Turn = *j.Turn
	}
	if len(j.PromptMessages) == 0 {
		t.PromptMessages = "[]"
	}
	if len(j.ResponseMessage) > 0 && string(j.ResponseMessage) != "null" {
		s := string(j.ResponseMessage)
		t.ResponseMessage = &s
	}
	return t, t.Validate()
}

func appendOptString(b array.Builder, v *string) {
	if v == nil {
		b.AppendNull()
		return
	}
	b.(*array.StringBuilder).Append(*v)
}

func appendOptFloat64(b array.Builder, v *float64) {
	if v == nil {
		b.AppendNull()
		return
	}
	b.(*array.Float64Builder).Append(*v)
}

func appendOptInt64(b array.Builder, v *int64) {
	if v == nil {
		b.AppendNull()
		return
	}
	b.(*array.Int64Builder).Append(*v)
}

func appendOptInt32(b array.Builder, v int32, valid bool) {
	if !valid {
		b.AppendNull()
		return
	}
	b.(*array.Int32Builder).Append(v)
}
