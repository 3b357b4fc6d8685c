package records

import (
	"encoding/json"
	"strings"
	"testing"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
)

// TestReferenceRowEvalCmdOrder: a task with an eval_cmd grading exports
// metadata in the reference's key order (docs/data-and-grading.md §1.5), eval_cmd after
// problem_statement.
func TestReferenceRowEvalCmdOrder(t *testing.T) {
	task := Task{TaskID: "A", Prompt: `[{"role":"user","content":"P"}]`, Metadata: "{}",
		Image: ptr("img"), Workdir: ptr("/testbed"), ProblemStatement: ptr("P"), EvalUser: ptr("root"), Dataset: ptr("D"),
		Grading: ptr(`{"kind":"eval_cmd","eval_cmd":"true","test_patch":"x"}`)}
	row, err := task.ReferenceRow()
	require.NoError(t, err)
	assert.Equal(t, `{"prompt":[{"role":"user","content":"P"}],"label":"A","metadata":{"instance_id":"A","image":"img","workdir":"/testbed","problem_statement":"P","eval_cmd":"true","eval_user":"root","dataset":"D"}}`, string(row))
}

// TestReferenceRowSWEBench: a swebench grading exports as the reference's
// swebench protocol reads it, metadata.remote_env_info.
func TestReferenceRowSWEBench(t *testing.T) {
	task := Task{TaskID: "o__r-1", Prompt: `"P"`, Metadata: `{"remote_env_info":{"version":"1.0"}}`, Repo: ptr("o/r"),
		Image: ptr("img"), Workdir: ptr("/testbed"), ProblemStatement: ptr("P"),
		Grading: ptr(`{"kind":"swebench","test_patch":"diff","fail_to_pass":["a"],"pass_to_pass":[],"test_cmd":"pytest","log_parser":"pytest","base_commit":"c"}`)}
	row, err := task.ReferenceRow()
	require.NoError(t, err)
	var got struct {
		Metadata struct {
			REI map[string]any `json:"remote_env_info"`
		} `json:"metadata"`
	}
	require.NoError(t, json.NewDecoder(strings.NewReader(string(row))).Decode(&got))
	assert.Equal(t, map[string]any{"version": "1.0", "instance_id": "o__r-1", "repo": "o/r", "problem_statement": "P", "image": "img",
		"workdir": "/testbed", "base_commit": "c", "test_patch": "diff", "FAIL_TO_PASS": []any{"a"}, "PASS_TO_PASS": []any{},
		"test_cmd": "pytest", "log_parser": "pytest"}, got.Metadata.REI)
}

// TestReferenceRowHarbor: a Harbor task's grading payload, which the
// reference has no key for, travels as metadata.kiln_grading and comes
// back into the grading column byte for byte.
func TestReferenceRowHarbor(t *testing.T) {
	grading := `{"kind":"harbor","tests":"harbor/sha256/ab.tar","verifier_timeout_sec":120,"verifier_env":{"A":"1"}}`
	task := Task{TaskID: "org/t", Prompt: `[{"role":"user","content":"P"}]`, Metadata: `{"harbor":{"schema":"1.1"}}`,
		Image: ptr("img"), Workdir: ptr("/app"), ProblemStatement: ptr("P"), EvalUser: ptr("root"), Grading: ptr(grading)}
	row, err := task.ReferenceRow()
	require.NoError(t, err)
	assert.Contains(t, string(row), `"kiln_grading":`+grading)
	back, err := TaskFromReferenceRow(row, 0)
	require.NoError(t, err)
	require.NotNil(t, back.Grading)
	assert.Equal(t, grading, *back.Grading)
	assert.Equal(t, task.Metadata, back.Metadata, "kiln_grading leaves metadata")
	assert.Equal(t, "org/t", back.TaskID)
}
