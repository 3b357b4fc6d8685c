package records

import (
	"bytes"
	"encoding/json"
	"fmt"
)

// Reference rows are the JSONL interchange format of the reference Python
// stack: {"prompt": ..., "label": ..., "metadata": {...}} (docs/data-and-grading.md
// §1.5-1.7). A row becomes a Task losslessly:
//
//   - metadata keys with a column of their own move into it when their value
//     has the column's type (a string; pre_commands any non-null JSON):
//     image, workdir, problem_statement, eval_user, dataset, repo, split,
//     agent, pre_commands;
//   - the grading payload moves into grading: metadata.kiln_grading (an
//     object with a "kind": the whole payload of a kind the reference has no
//     key for, such as harbor), else by the reference's priority:
//     metadata.swepro (an object) > metadata.eval_cmd (a string) >
//     metadata.remote_env_info.f2p_script (a string);
//   - task_id is metadata.instance_id (moved), else
//     metadata.remote_env_info.instance_id, else the label when it is a
//     string shorter than 256 bytes;
//   - every other key stays in metadata, in order, byte for byte; the label
//     and other top-level keys are kept in label and extra.
//
// ReferenceRow reverses this. The one normalization: the exported metadata
// always carries instance_id (the reference reads it first).

// refColumns are metadata keys that map to string columns, in the order the
// reference writes them.
var refColumns = []struct {
	key string
	col func(*Task) **string
}{
	{"image", func(t *Task) **string { return &t.Image }},
	{"workdir", func(t *Task) **string { return &t.Workdir }},
	{"problem_statement", func(t *Task) **string { return &t.ProblemStatement }},
	{"eval_user", func(t *Task) **string { return &t.EvalUser }},
	{"dataset", func(t *Task) **string { return &t.Dataset }},
	{"repo", func(t *Task) **string { return &t.Repo }},
	{"split", func(t *Task) **string { return &t.Split }},
	{"agent", func(t *Task) **string { return &t.Agent }},
}

// TaskFromReferenceRow converts one reference JSONL row into a task at index.
func TaskFromReferenceRow(line []byte, index int64) (Task, error) {
	row, err := parseObject(line)
	if err != nil {
		return Task{}, fmt.Errorf("not a JSON object: %w", err)
	}
	prompt, ok := row.take("prompt")
	if !ok || bytes.Equal(prompt, []byte("null")) {
		return Task{}, fmt.Errorf("missing \"prompt\"")
	}
	t := Task{TaskIndex: index, Prompt: string(prompt)}
	md := object{}
	if raw, ok := row.take("metadata"); ok && !bytes.Equal(raw, []byte("null")) {
		if md, err = parseObject(raw); err != nil {
			return Task{}, fmt.Errorf("\"metadata\": %w", err)
		}
	}
	if label, ok := row.take("label"); ok {
		t.Label = ptr(string(label))
	}
	if len(row) > 0 {
		extra, _ := row.MarshalJSON()
		t.Extra = ptr(string(extra))
	}

	if v, ok := md.get("instance_id"); ok {
		if s, ok := asString(v); ok && s != "" {
			md.take("instance_id")
			t.TaskID = s
		}
	}
	for _, c := range refColumns {
		if v, ok := md.get(c.key); ok {
			if s, ok := asString(v); ok {
				md.take(c.key)
				*c.col(&t) = ptr(s)
			}
		}
	}
	if v, ok := md.get("pre_commands"); ok && !bytes.Equal(v, []byte("null")) {
		md.take("pre_commands")
		t.PreCommands = ptr(string(v))
	}
	if err := takeGrading(&t, &md); err != nil {
		return Task{}, err
	}
	if t.TaskID == "" {
		if rei, ok := md.get("remote_env_info"); ok {
			if o, err := parseObject(rei); err == nil {
				if v, ok := o.get("instance_id"); ok {
					t.TaskID, _ = asString(v)
				}
			}
		}
	}
	if t.TaskID == "" && t.Label != nil {
		if s, ok := asString(json.RawMessage(*t.Label)); ok && len(s) < 256 {
			t.TaskID = s
		}
	}
	if t.TaskID == "" {
		return Task{}, fmt.Errorf("no task id: set metadata.instance_id or a string label")
	}
	mdJSON, _ := md.MarshalJSON()
	t.Metadata = string(mdJSON)
	return t, t.Validate()
}

// kilnGradingKey is the metadata key a reference row carries a grading
// payload under when the reference has no key of its own for its kind
// (harbor): the whole grading column, so kiln import gives it back.
const kilnGradingKey = "kiln_grading"

func takeGrading(t *Task, md *object) error {
	grading := func(kind, key string, val json.RawMessage) {
		g, _ := object{{"kind", jsonString(kind)}, {key, val}}.MarshalJSON()
		t.Grading = ptr(string(g))
	}
	if v, ok := md.get(kilnGradingKey); ok && len(v) > 0 && v[0] == '{' {
		o, err := parseObject(v)
		if err != nil {
			return fmt.Errorf("metadata.%s: %w", kilnGradingKey, err)
		}
		if k, ok := o.get("kind"); ok {
			if _, isStr := asString(k); isStr {
				md.take(kilnGradingKey)
				t.Grading = ptr(string(v))
				return nil
			}
		}
	}
	if v, ok := md.get("swepro"); ok && len(v) > 0 && v[0] == '{' {
		md.take("swepro")
		grading("swepro", "swepro", v)
		return nil
	}
	if v, ok := md.get("eval_cmd"); ok {
		if _, isStr := asString(v); isStr {
			md.take("eval_cmd")
			grading("eval_cmd", "eval_cmd", v)
			return nil
		}
	}
	if rei, ok := md.get("remote_env_info"); ok && len(rei) > 0 && rei[0] == '{' {
		o, err := parseObject(rei)
		if err != nil {
			return fmt.Errorf("metadata.remote_env_info: %w", err)
		}
		if v, ok := o.get("f2p_script"); ok {
			if _, isStr := asString(v); isStr {
				o.take("f2p_script")
				grading("f2p", "f2p_script", v)
				b, _ := o.MarshalJSON()
				md.set("remote_env_info", b)
			}
		}
	}
	return nil
}

// ReferenceRow renders the task as a reference JSONL row (without newline).
func (t *Task) ReferenceRow() (json.RawMessage, error) {
	left, err := parseObject([]byte(t.Metadata))
	if err != nil {
		return nil, fmt.Errorf("task %q: metadata: %w", t.TaskID, err)
	}
	md := object{{"instance_id", jsonString(t.TaskID)}}
	for _, c := range refColumns {
		if v := *c.col(t); v != nil {
			md = append(md, member{c.key, jsonString(*v)})
		}
	}
	if t.PreCommands != nil {
		md = append(md, member{"pre_commands", json.RawMessage(*t.PreCommands)})
	}
	for _, m := range left {
		md.set(m.Key, m.Val)
	}
	if t.Grading != nil {
		g, err := parseObject([]byte(*t.Grading))
		if err != nil {
			return nil, fmt.Errorf("task %q: grading: %w", t.TaskID, err)
		}
		kind, _ := g.get("kind")
		switch k, _ := asString(kind); k {
		case "swepro":
			if v, ok := g.get("swepro"); ok {
				md.set("swepro", v)
			}
		case "eval_cmd":
			if v, ok := g.get("eval_cmd"); ok {
				// Where the reference writes it (docs/data-and-grading.md §1.5): after problem_statement.
				md.setAfter("problem_statement", "eval_cmd", v)
			}
		case "swebench":
			// The reference's swebench protocol reads these rows from
			// metadata.remote_env_info (docs/data-and-grading.md §1.7); kiln's test command and log
			// parser ride along.
			rei := object{}
			if raw, ok := md.get("remote_env_info"); ok {
				if rei, err = parseObject(raw); err != nil {
					return nil, fmt.Errorf("task %q: metadata.remote_env_info: %w", t.TaskID, err)
				}
			}
			rei.set("instance_id", jsonString(t.TaskID))
			for _, c := range []struct {
				key string
				v   *string
			}{{"repo", t.Repo}, {"problem_statement", t.ProblemStatement}, {"image", t.Image}, {"workdir", t.Workdir}} {
				if c.v != nil {
					rei.set(c.key, jsonString(*c.v))
				}
			}
			for _, k := range [][2]string{{"base_commit", "base_commit"}, {"test_patch", "test_patch"},
				{"fail_to_pass", "FAIL_TO_PASS"}, {"pass_to_pass", "PASS_TO_PASS"}, {"test_cmd", "test_cmd"}, {"log_parser", "log_parser"}} {
				if v, ok := g.get(k[0]); ok {
					rei.set(k[1], v)
				}
			}
			b, _ := rei.MarshalJSON()
			md.set("remote_env_info", b)
		case "f2p":
			if v, ok := g.get("f2p_script"); ok {
				rei := object{}
				if raw, ok := md.get("remote_env_info"); ok {
					if rei, err = parseObject(raw); err != nil {
						return nil, fmt.Errorf("task %q: metadata.remote_env_info: %w", t.TaskID, err)
					}
				}
				rei.set("f2p_script", v)
				b, _ := rei.MarshalJSON()
				md.set("remote_env_info", b)
			}
		default:
			// A kind the reference has no key for (harbor): the whole
			// payload, so that it is not lost (TaskFromReferenceRow).
			md.set(kilnGradingKey, json.RawMessage(*t.Grading))
		}
	}
	label := jsonString(t.TaskID)
	if t.Label != nil {
		label = json.RawMessage(*t.Label)
	}
	mdJSON, _ := md.MarshalJSON()
	row := object{{"prompt", json.RawMessage(t.Prompt)}, {"label", label}, {"metadata", mdJSON}}
	if t.Extra != nil {
		extra, err := parseObject([]byte(*t.Extra))
		if err != nil {
			return nil, fmt.Errorf("task %q: extra: %w", t.TaskID, err)
		}
		row = append(row, extra...)
	}
	return row.MarshalJSON()
}

// setAfter sets key like set; a new key goes right after anchor (or last
// when anchor is absent).
func (o *object) setAfter(anchor, key string, val json.RawMessage) {
	if _, ok := o.get(key); ok {
		o.set(key, val)
		return
	}
	for i, m := range *o {
		if m.Key == anchor {
			*o = append((*o)[:i+1], append(object{{key, val}}, (*o)[i+1:]...)...)
			return
		}
	}
	*o = append(*o, member{key, val})
}
