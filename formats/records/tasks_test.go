package records

import (
	"bufio"
	"bytes"
	"encoding/json"
	"os"
	"strings"
	"testing"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
)

func TestReferenceRowsRoundTrip(t *testing.T) {
	f, err := os.Open("testdata/reference-rows.jsonl")
	require.NoError(t, err)
	defer f.Close()
	sc := bufio.NewScanner(f)
	sc.Buffer(nil, 1<<20)
	var tasks []Task
	var lines [][]byte
	for i := int64(0); sc.Scan(); i++ {
		line := append([]byte(nil), sc.Bytes()...)
		task, err := TaskFromReferenceRow(line, i)
		require.NoError(t, err, "line %d", i+1)
		tasks = append(tasks, task)
		lines = append(lines, line)
	}
	require.Len(t, tasks, 4)

	// Through Parquet and back.
	var buf bytes.Buffer
	enc := NewTaskEncoder(&buf)
	require.NoError(t, enc.Write(tasks...))
	require.NoError(t, enc.Close())
	var decoded []Task
	require.NoError(t, EachTask(buf.Bytes(), func(t Task) error { decoded = append(decoded, t); return nil }))
	require.Equal(t, tasks, decoded)

	for i, task := range decoded {
		row, err := task.ReferenceRow()
		require.NoError(t, err)
		want := normalize(t, lines[i])
		// The one documented normalization: metadata.instance_id is always written.
		md := want["metadata"].(map[string]any)
		if _, ok := md["instance_id"]; !ok {
			md["instance_id"] = task.TaskID
		}
		assert.Equal(t, want, normalize(t, row), "row %d", i)
	}

	// Columns were filled where the reference has them.
	assert.Equal(t, "format-code-task-002661", decoded[0].TaskID)
	assert.Equal(t, "/testbed", *decoded[0].Workdir)
	assert.JSONEq(t, `{"kind":"eval_cmd","eval_cmd":"bash -lc 'set -e\ngit apply --verbose /tmp/mimo-tests.patch\nbash /testbed/mimo_test_command.sh'"}`, *decoded[0].Grading)
	assert.Equal(t, "swepro", gradingKind(t, decoded[1]))
	assert.Equal(t, "f2p", gradingKind(t, decoded[2]))
	assert.Nil(t, decoded[2].Image, "a non-string image stays in metadata")
	assert.Equal(t, "label-as-id", decoded[3].TaskID)
	assert.Equal(t, "django/django", *decoded[3].Repo)
	assert.Equal(t, "train", *decoded[3].Split)
	assert.Nil(t, decoded[3].Grading)
}

func gradingKind(t *testing.T, task Task) string {
	var g struct{ Kind string }
	require.NoError(t, json.Unmarshal([]byte(*task.Grading), &g))
	return g.Kind
}

func normalize(t *testing.T, b []byte) map[string]any {
	var v map[string]any
	dec := json.NewDecoder(bytes.NewReader(b))
	dec.UseNumber()
	require.NoError(t, dec.Decode(&v), string(b))
	return v
}

func TestTaskFromReferenceRowErrors(t *testing.T) {
	cases := []struct{ name, row, want string }{
		{"not json", `{"prompt": `, "not a JSON object"},
		{"array", `[1,2]`, "want a JSON object"},
		{"no prompt", `{"label": "x", "metadata": {}}`, `missing "prompt"`},
		{"metadata not object", `{"prompt": "p", "label": "x", "metadata": [1]}`, `"metadata"`},
		{"no id", `{"prompt": "p", "metadata": {"image": "i"}}`, "no task id"},
		{"trailing", `{"prompt": "p", "label": "x"} {}`, "trailing data"},
	}
	for _, c := range cases {
		t.Run(c.name, func(t *testing.T) {
			_, err := TaskFromReferenceRow([]byte(c.row), 0)
			require.Error(t, err)
			assert.Contains(t, err.Error(), c.want)
		})
	}
}

func TestTaskValidate(t *testing.T) {
	bad := "{not json"
	cases := []struct {
		name string
		task Task
		want string
	}{
		{"empty id", Task{Prompt: `"p"`, Metadata: `{}`}, "empty task_id"},
		{"bad prompt", Task{TaskID: "a", Prompt: `nope`, Metadata: `{}`}, "prompt is not valid JSON"},
		{"metadata not object", Task{TaskID: "a", Prompt: `"p"`, Metadata: `[]`}, "metadata must be a JSON object"},
		{"bad grading", Task{TaskID: "a", Prompt: `"p"`, Metadata: `{}`, Grading: &bad}, "grading is not valid JSON"},
	}
	for _, c := range cases {
		t.Run(c.name, func(t *testing.T) {
			err := NewTaskEncoder(&bytes.Buffer{}).Write(c.task)
			require.Error(t, err)
			assert.True(t, strings.Contains(err.Error(), c.want), err.Error())
		})
	}
}

func TestKindsLookup(t *testing.T) {
	k, err := Lookup("tasks")
	require.NoError(t, err)
	assert.Equal(t, Parquet, k.Encoding)
	assert.Regexp(t, `^sha256:[0-9a-f]{64}$`, k.Fingerprint())
	_, err = Lookup("bogus")
	assert.ErrorContains(t, err, `unknown record kind "bogus"`)
	assert.NotEqual(t, TasksKind().Fingerprint(), TrajectoriesKind().Fingerprint())
}
