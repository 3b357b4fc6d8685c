package records

import (
	"bytes"
	"encoding/json"
	"fmt"
)

// The JSON rows kiln export writes for the Parquet kinds are their column
// names as keys (MarshalRow); these read them back, for kiln import. A key
// that is no column is an error, not dropped: an import keeps every byte
// it was given or refuses the file. Rows are validated as on write.

// The columns of the Parquet kinds' JSON views: each required one must be
// present, and only the optional ones may be null (checkFields).
var (
	rolloutRequired, rolloutNullable = parquetColumns(Rollout{})
	gradeRequired, gradeNullable     = parquetColumns(Grade{})
)

// The turns JSON view's: a row without "turn" is numbered by its place in
// its session and rollout_id defaults to index (TurnJSON.ToTurn), so those
// two may be missing or null, as may the optional columns.
var (
	turnRequired = []string{"index", "group_index", "session", "prompt_ids", "output_ids", "finish_reason", "prompt_messages"}
	turnNullable = map[string]bool{"rollout_id": true, "turn": true, "response_message": true, "reward": true,
		"started_ms": true, "duration_ms": true, "rollout_top_p_token_ids": true, "rollout_top_p_token_offsets": true,
		"rollout_top_p_log_probs": true, "rollout_topk_token_ids": true, "rollout_topk_log_probs": true,
		"rollout_topk_k": true, "rollout_routed_experts": true, "rollout_routed_experts_shape": true}
)

// RolloutFromJSON reads one rollouts row in its JSON view.
func RolloutFromJSON(line []byte) (Rollout, error) {
	if err := checkFields(line, rolloutRequired, rolloutNullable); err != nil {
		return Rollout{}, err
	}
	var r Rollout
	if err := strictJSON(line, &r); err != nil {
		return Rollout{}, err
	}
	return r, r.Validate()
}

// gradeJSON is the JSON view of a grade: tests is embedded JSON, not a string.
type gradeJSON struct {
	Grade
	Tests json.RawMessage `json:"tests"`
}

// GradeFromJSON reads one grades row in its JSON view (MarshalRow: tests
// embedded as JSON; a string there is taken as the JSON text it holds, so
// rows written by hand with tests quoted import too).
func GradeFromJSON(line []byte) (Grade, error) {
	if err := checkFields(line, gradeRequired, gradeNullable); err != nil {
		return Grade{}, err
	}
	var g gradeJSON
	if err := strictJSON(line, &g); err != nil {
		return Grade{}, err
	}
	switch t := bytes.TrimSpace(g.Tests); {
	case len(t) == 0 || string(t) == "null":
	case t[0] == '"':
		var s string
		if err := json.Unmarshal(t, &s); err != nil {
			return Grade{}, fmt.Errorf("tests: %w", err)
		}
		g.Grade.Tests = &s
	default:
		s := string(t)
		g.Grade.Tests = &s
	}
	return g.Grade, g.Grade.Validate()
}

// TurnFromJSON reads one turns row in its JSON view (TurnJSON); order is
// the turn's position in its session, used when the row has no "turn".
func TurnFromJSON(line []byte, order int32) (Turn, error) {
	if err := checkFields(line, turnRequired, turnNullable); err != nil {
		return Turn{}, err
	}
	var j TurnJSON
	if err := strictJSON(line, &j); err != nil {
		return Turn{}, err
	}
	return j.ToTurn(order)
}

// strictJSON decodes one JSON object into v, refusing keys v has no field
// for and anything after the object.
func strictJSON(line []byte, v any) error {
	dec := json.NewDecoder(bytes.NewReader(line))
	dec.DisallowUnknownFields()
	if err := dec.Decode(v); err != nil {
		return err
	}
	if rest := bytes.TrimSpace(line[dec.InputOffset():]); len(rest) > 0 {
		return fmt.Errorf("trailing data %s after the object", shortJSON(rest))
	}
	return nil
}
