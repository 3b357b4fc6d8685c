package records

import (
	"encoding/json"
	"fmt"
	"io"
	"time"
	"unicode/utf8"

	"github.com/parquet-go/parquet-go"
)

// Rollout is one row of the rollouts kind (Parquet): one agent run on one
// task (kiln-rollout), with the patch it produced. kiln-grade grades Patch
// in a fresh sandbox; the ids carry over to the grades row.
type Rollout struct {
	RolloutID  int64 `parquet:"rollout_id" json:"rollout_id"`
	Index      int64 `parquet:"index" json:"index"`
	GroupIndex int64 `parquet:"group_index" json:"group_index"`
	// Sample is the run's number within its task, 0..n-1.
	Sample int64  `parquet:"sample" json:"sample"`
	TaskID string `parquet:"task_id" json:"task_id"`
	// Agent is the harness that ran ("claude-code", "codex", "shell", ...).
	Agent          string `parquet:"agent" json:"agent"`
	WeightsVersion string `parquet:"weights_version" json:"weights_version"`
	// Patch is the workspace diff (git diff --binary, tree to tree); "" when
	// the agent changed nothing.
	Patch string `parquet:"patch" json:"patch"`
	// AgentExitCode is the agent's exit status; -1: its time budget ran out.
	AgentExitCode int64 `parquet:"agent_exit_code" json:"agent_exit_code"`
	// AbortReason is set when the run was aborted (missing_image_or_workdir,
	// unevaluatable:<why>, adapter_session_empty, wall_clock_timeout,
	// engine_error, agent_crash, replay_mismatch, weights_changed,
	// exception:<type>; docs/records.md §4); such runs are not graded.
	// Only those are accepted, on write and import (CheckAbortReason).
	AbortReason *string `parquet:"abort_reason,optional" json:"abort_reason"`
	// AbortDetail says why, in words: the error, the missing path, the
	// replay mismatch (docs/rollout.md §2.4). kiln-rollout sets it exactly
	// when AbortReason is set, bounded by BoundAbortDetail. Rows of
	// versions written before the column read it as nil.
	AbortDetail  *string   `parquet:"abort_detail,optional" json:"abort_detail"`
	Turns        int64     `parquet:"turns" json:"turns"`
	PromptTokens int64     `parquet:"prompt_tokens" json:"prompt_tokens"`
	OutputTokens int64     `parquet:"output_tokens" json:"output_tokens"`
	StartedAt    time.Time `parquet:"started_at,timestamp(millisecond)" json:"started_at"`
	EndedAt      time.Time `parquet:"ended_at,timestamp(millisecond)" json:"ended_at"`
	// Artifacts is the store key of the run's artifacts (commands, outputs,
	// CLI logs), saved before its sandbox was removed.
	Artifacts *string `parquet:"artifacts,optional" json:"artifacts"`
}

// RolloutsKind is the rollouts record kind.
func RolloutsKind() Kind { return rolloutsKind }

var rolloutsKind = Kind{
	Name:     "rollouts",
	Encoding: Parquet,
	Ext:      ".parquet",
	Schema:   parquet.SchemaOf(Rollout{}).String(),
	Older:    []string{rolloutsSchemaV1},
	EachJSON: eachJSONValue(EachRollout),
}

// rolloutsSchemaV1 is the rollouts schema before abort_detail: its
// shards lack only that optional column, which reads as null, so versions
// written under it stay readable (docs/records.md §4).
const rolloutsSchemaV1 = `message Rollout {
	required int64 rollout_id (INT(64,true));
	required int64 index (INT(64,true));
	required int64 group_index (INT(64,true));
	required int64 sample (INT(64,true));
	required binary task_id (STRING);
	required binary agent (STRING);
	required binary weights_version (STRING);
	required binary patch (STRING);
	required int64 agent_exit_code (INT(64,true));
	optional binary abort_reason (STRING);
	required int64 turns (INT(64,true));
	required int64 prompt_tokens (INT(64,true));
	required int64 output_tokens (INT(64,true));
	required int64 started_at (TIMESTAMP(isAdjustedToUTC=true,unit=MILLIS));
	required int64 ended_at (TIMESTAMP(isAdjustedToUTC=true,unit=MILLIS));
	optional binary artifacts (STRING);
}`

// MaxAbortDetail bounds a row's abort_detail in bytes, so a huge error
// (an agent's whole stderr, a long wrapped chain) cannot bloat the rows.
const MaxAbortDetail = 2048

// BoundAbortDetail returns s if it fits MaxAbortDetail bytes, else its head
// and tail around a marker saying how many bytes were cut, MaxAbortDetail
// bytes at most and cut at rune boundaries: the head names what failed, the
// tail is where an error's cause and a command's last output lines are.
func BoundAbortDetail(s string) string {
	if len(s) <= MaxAbortDetail {
		return s
	}
	// The marker's digits are at most those of len(s).
	room := MaxAbortDetail - len(fmt.Sprintf(abortDetailCut, len(s)))
	head, tail := room/2, room-room/2
	for head > 0 && !utf8.RuneStart(s[head]) {
		head--
	}
	start := len(s) - tail
	for start < len(s) && !utf8.RuneStart(s[start]) {
		start++
	}
	return s[:head] + fmt.Sprintf(abortDetailCut, start-head) + s[start:]
}

// abortDetailCut is the marker in place of the bytes BoundAbortDetail cut.
const abortDetailCut = " [... %d bytes cut ...] "

// Validate checks the invariants a rollouts row must hold on write, and
// on import: kiln-rollout's rows and imported ones pass the same checks.
func (r *Rollout) Validate() error {
	if err := checkIDs(r.RolloutID, r.Index, r.GroupIndex); err != nil {
		return fmt.Errorf("rollout %d (task %q): %w", r.RolloutID, r.TaskID, err)
	}
	switch {
	case r.TaskID == "":
		return fmt.Errorf("rollout %d: empty task_id", r.RolloutID)
	case r.Sample < 0 || r.Turns < 0 || r.PromptTokens < 0 || r.OutputTokens < 0:
		return fmt.Errorf("rollout %d (task %q): negative sample, turns or token count", r.RolloutID, r.TaskID)
	case r.AbortReason != nil && CheckAbortReason(*r.AbortReason) != nil:
		return fmt.Errorf("rollout %d (task %q): %w", r.RolloutID, r.TaskID, CheckAbortReason(*r.AbortReason))
	case r.Artifacts != nil && checkStoreKey("artifacts", *r.Artifacts, true) != nil:
		return fmt.Errorf("rollout %d (task %q): %w", r.RolloutID, r.TaskID, checkStoreKey("artifacts", *r.Artifacts, true))
	case r.AbortDetail != nil && r.AbortReason == nil:
		return fmt.Errorf("rollout %d (task %q): abort_detail is set but abort_reason is not: a detail says why a run aborted", r.RolloutID, r.TaskID)
	case r.AbortDetail != nil && len(*r.AbortDetail) > MaxAbortDetail:
		return fmt.Errorf("rollout %d (task %q): abort_detail is %d bytes, over the %d-byte bound: shorten it (records.BoundAbortDetail)",
			r.RolloutID, r.TaskID, len(*r.AbortDetail), MaxAbortDetail)
	case !r.StartedAt.IsZero() && !r.EndedAt.IsZero() && r.EndedAt.Before(r.StartedAt):
		return fmt.Errorf("rollout %d (task %q): ended_at %s is before started_at %s", r.RolloutID, r.TaskID,
			r.EndedAt.Format(time.RFC3339Nano), r.StartedAt.Format(time.RFC3339Nano))
	}
	return nil
}

// MarshalRow is the row's JSON view, columns in schema order.
func (r *Rollout) MarshalRow() (json.RawMessage, error) {
	return marshalRow(r, nil)
}

// RolloutEncoder streams rollouts into one Parquet shard (zstd).
type RolloutEncoder = ParquetEncoder[Rollout, *Rollout]

// NewRolloutEncoder writes a Parquet file to w; Close finishes it.
func NewRolloutEncoder(w io.Writer) *RolloutEncoder { return newParquetEncoder[Rollout](w) }

// EachRollout decodes a rollouts shard in row order.
func EachRollout(shard []byte, fn func(Rollout) error) error {
	return eachParquetRow(shard, "rollouts", fn)
}
