package records

import (
	"bytes"
	"encoding/json"
	"fmt"
	"io"

	"github.com/parquet-go/parquet-go"
)

// Task is one row of the tasks kind (Parquet): one coding task. Columns
// holding JSON are JSON text. Nullable columns are nil when the source had
// no such field; stages apply the documented defaults when they read them.
type Task struct {
	TaskID string `parquet:"task_id" json:"task_id"`
	// TaskIndex is the row's ordinal in the version: the stable group_index.
	TaskIndex        int64   `parquet:"task_index" json:"task_index"`
	Dataset          *string `parquet:"dataset,optional" json:"dataset"`
	Split            *string `parquet:"split,optional" json:"split"`
	Repo             *string `parquet:"repo,optional" json:"repo"`
	Prompt           string  `parquet:"prompt" json:"prompt"` // JSON: a message list or a string
	ProblemStatement *string `parquet:"problem_statement,optional" json:"problem_statement"`
	Image            *string `parquet:"image,optional" json:"image"`
	Workdir          *string `parquet:"workdir,optional" json:"workdir"`
	EvalUser         *string `parquet:"eval_user,optional" json:"eval_user"`
	PreCommands      *string `parquet:"pre_commands,optional" json:"pre_commands"` // JSON
	// Grading is JSON {"kind": "eval_cmd"|"swebench"|"swepro"|"f2p", ...payload}.
	Grading *string `parquet:"grading,optional" json:"grading"`
	Agent   *string `parquet:"agent,optional" json:"agent"`
	// Metadata is a JSON object holding every input key that has no column
	// of its own, losslessly.
	Metadata string `parquet:"metadata" json:"metadata"`
	// Label is the reference row's label (JSON), usually the instance id.
	Label *string `parquet:"label,optional" json:"label"`
	// Extra is a JSON object of top-level input row keys other than prompt,
	// label and metadata.
	Extra *string `parquet:"extra,optional" json:"extra"`
}

// taskJSONColumns are embedded as JSON in the row view, not as strings.
var taskJSONColumns = map[string]bool{"prompt": true, "pre_commands": true, "grading": true, "metadata": true, "label": true, "extra": true}

// TasksKind is the tasks record kind.
func TasksKind() Kind { return tasksKind }

var tasksKind = Kind{
	Name:     "tasks",
	Encoding: Parquet,
	Ext:      ".parquet",
	Schema:   parquet.SchemaOf(Task{}).String(),
	EachJSON: eachJSONValue(EachTask),
}

// Validate checks the invariants a tasks row must hold on write.
func (t *Task) Validate() error {
	if t.TaskID == "" {
		return fmt.Errorf("task at index %d: empty task_id", t.TaskIndex)
	}
	check := func(col string, v *string, object bool) error {
		if v == nil {
			return nil
		}
		if !json.Valid([]byte(*v)) {
			return fmt.Errorf("task %q: column %s is not valid JSON", t.TaskID, col)
		}
		if object && (len(*v) == 0 || (*v)[0] != '{') {
			return fmt.Errorf("task %q: column %s must be a JSON object", t.TaskID, col)
		}
		return nil
	}
	for _, c := range []struct {
		name   string
		v      *string
		object bool
	}{{"prompt", &t.Prompt, false}, {"metadata", &t.Metadata, true}, {"pre_commands", t.PreCommands, false},
		{"grading", t.Grading, true}, {"label", t.Label, false}, {"extra", t.Extra, true}} {
		if err := check(c.name, c.v, c.object); err != nil {
			return err
		}
	}
	return nil
}

// MarshalRow is the task's JSON view: columns in schema order, JSON columns embedded.
func (t *Task) MarshalRow() (json.RawMessage, error) {
	return marshalRow(t, taskJSONColumns)
}

// TaskEncoder streams tasks into one Parquet shard (zstd).
type TaskEncoder = ParquetEncoder[Task, *Task]

// NewTaskEncoder writes a Parquet file to w; Close finishes it.
func NewTaskEncoder(w io.Writer) *TaskEncoder {
	return newParquetEncoder[Task](w, parquet.MaxRowsPerRowGroup(8192))
}

// EachTask decodes a tasks shard in row order.
func EachTask(shard []byte, fn func(Task) error) error {
	return eachParquetRow(shard, "tasks", fn)
}

// embedJSONColumns rewrites string fields named in cols to embedded JSON,
// preserving field order.
func embedJSONColumns(raw []byte, cols map[string]bool) (json.RawMessage, error) {
	dec := json.NewDecoder(bytes.NewReader(raw))
	dec.UseNumber()
	if _, err := dec.Token(); err != nil { // {
		return nil, err
	}
	var out bytes.Buffer
	out.WriteByte('{')
	for first := true; dec.More(); first = false {
		tok, err := dec.Token()
		if err != nil {
			return nil, err
		}
		key := tok.(string)
		var val json.RawMessage
		if err := dec.Decode(&val); err != nil {
			return nil, err
		}
		if cols[key] && len(val) > 0 && val[0] == '"' {
			var s string
			if err := json.Unmarshal(val, &s); err == nil && json.Valid([]byte(s)) {
				val = json.RawMessage(s)
			}
		}
		if !first {
			out.WriteByte(',')
		}
		k, _ := json.Marshal(key)
		out.Write(k)
		out.WriteByte(':')
		out.Write(val)
	}
	out.WriteByte('}')
	return out.Bytes(), nil
}
