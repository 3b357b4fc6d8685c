package datasets_test

import (
	"context"
	"fmt"
	"io"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/kilnrl/kiln/formats/dataset"
	"github.com/kilnrl/kiln/formats/records"
	"github.com/kilnrl/kiln/internal/stagecmd"
)

func sp(s string) *string { return &s }

// kindFixtures are versions of each importable kind as a stage writes them,
// with their optional columns both set and unset.
func kindFixtures() []struct {
	kind   records.Kind
	encode func(io.Writer) error
	rows   int64
} {
	reward, started, dur := 1.0, int64(1700000000123), int64(42)
	t0 := time.Date(2026, 3, 1, 12, 0, 0, 123e6, time.UTC)
	return []struct {
		kind   records.Kind
		encode func(io.Writer) error
		rows   int64
	}{
		{records.TurnsKind(), func(w io.Writer) error {
			enc, err := records.NewTurnEncoder(w, records.ArrowOptions{})
			if err != nil {
				return err
			}
			if err := enc.Write(
				records.Turn{RolloutID: 7, Index: 3, GroupIndex: 1, Session: "s-1", Turn: 0, PromptIDs: []int32{1, 2, 3}, OutputIDs: []int32{4, 5},
					OutputLogProbs: []float32{-0.5, -0.25}, FinishReason: "stop", PromptMessages: `[{"role":"user","content":"hi <b>"}]`,
					ResponseMessage: sp(`{"role":"assistant","content":"ok"}`), MaxContextTokens: 8192, Reward: &reward,
					Replay:    records.Replay{TopKTokenIDs: []int32{4, 9, 5, 8}, TopKLogProbs: []float32{-0.5, -2, -0.25, -3}, TopK: 2},
					StartedMs: &started, DurationMs: &dur},
				records.Turn{RolloutID: 7, Index: 3, GroupIndex: 1, Session: "s-1", Turn: 1, PromptIDs: []int32{1, 2, 3, 4, 5, 6}, OutputIDs: []int32{7},
					FinishReason: "length", IllFormed: true, PromptMessages: `[]`, MaxContextTokens: 8192},
			); err != nil {
				return err
			}
			return enc.Close()
		}, 2},
		{records.RolloutsKind(), func(w io.Writer) error {
			enc := records.NewRolloutEncoder(w)
			if err := enc.Write(
				records.Rollout{RolloutID: 1, Index: 1, Sample: 0, TaskID: "t-1", Agent: "claude-code", WeightsVersion: "step-3",
					Patch: "diff --git a/x b/x\n+é\n", AgentExitCode: 0, Turns: 4, PromptTokens: 100, OutputTokens: 20,
					StartedAt: t0, EndedAt: t0.Add(90 * time.Second), Artifacts: sp("rollouts/_v/x/attachments/1.tar")},
				records.Rollout{RolloutID: 2, Index: 2, Sample: 1, TaskID: "t-1", Agent: "shell", AgentExitCode: -1,
					AbortReason: sp("wall_clock_timeout"), StartedAt: t0, EndedAt: t0},
			); err != nil {
				return err
			}
			return enc.Close()
		}, 2},
		{records.GradesKind(), func(w io.Writer) error {
			enc := records.NewGradeEncoder(w)
			if err := enc.Write(
				records.Grade{RolloutID: 1, Index: 1, TaskID: "t-1", Reward: 1, Applied: true, ApplyMethod: sp("git_apply"), ExitCode: 0,
					Failure: records.FailureNone, DurationMS: 1234, ImageDigest: sp("sha256:ab"), Log: sp("grades/_v/x/attachments/logs/1.jsonl"),
					GradingKind: sp("swebench"), Tests: sp(`{"status":{"a::b":"PASSED"},"fail_to_pass":["a::b"],"pass_to_pass":[],"missing":[]}`)},
				records.Grade{RolloutID: 2, Index: 2, Sample: 1, TaskID: "t-1", ExitCode: 124, Failure: records.FailureTimeout,
					Error: sp("ran past 30m"), Baseline: true},
			); err != nil {
				return err
			}
			return enc.Close()
		}, 2},
	}
}

// Every kind kiln export writes as JSON lines comes back equal through kiln
// import: export, import the file, export again.
func TestExportImportRoundTripEachKind(t *testing.T) {
	eachStore(t, func(t *testing.T, sc storeCase) {
		ctx := context.Background()
		for _, f := range kindFixtures() {
			t.Run(f.kind.Name, func(t *testing.T) {
				w, err := dataset.NewWriter(ctx, sc.st, dataset.Spec{Name: "made/" + f.kind.Name, Kind: f.kind,
					Identity: dataset.Identity{Stage: "fixture", CodeVersion: "1"}})
				require.NoError(t, err)
				_, err = w.WriteShard(ctx, f.rows, nil, f.encode)
				require.NoError(t, err)
				res, err := w.Commit(ctx, nil)
				require.NoError(t, err)

				exp := kiln(t, "export", "--store", sc.uri, res.Ref.String())
				require.Equal(t, 0, exp.Code, exp.Stderr)
				require.Equal(t, int(f.rows), strings.Count(exp.Stdout, "\n"))
				file := filepath.Join(t.TempDir(), f.kind.Name+".jsonl")
				require.NoError(t, os.WriteFile(file, []byte(exp.Stdout), 0o644))

				imp := kiln(t, "import", f.kind.Name, "--store", sc.uri, "--out", "imported/"+f.kind.Name, file)
				require.Equal(t, 0, imp.Code, imp.Stderr)
				ref := imp.LastLine()
				assert.Regexp(t, `^imported/`+f.kind.Name+`@[0-9a-f]{20}$`, ref)
				back := kiln(t, "export", "--store", sc.uri, ref)
				require.Equal(t, 0, back.Code, back.Stderr)
				assert.Equal(t, exp.Stdout, back.Stdout, "the rows come back byte for byte")

				v, err := dataset.OpenString(ctx, sc.st, ref)
				require.NoError(t, err)
				assert.Equal(t, "import-"+f.kind.Name, v.Producer.Stage)
				require.Len(t, v.External, 1, "lineage names the file")
				assert.NotEmpty(t, v.External[0].SHA256, "by content")

				// The same content under another name is the same version.
				other := filepath.Join(t.TempDir(), "renamed.jsonl")
				require.NoError(t, os.WriteFile(other, []byte(exp.Stdout), 0o644))
				again := kiln(t, "import", f.kind.Name, "--store", sc.uri, "--out", "imported/"+f.kind.Name, other)
				require.Equal(t, 0, again.Code, again.Stderr)
				assert.Equal(t, ref, again.LastLine())
			})
		}
	})
}

func TestImportRefusesBadLines(t *testing.T) {
	dir := t.TempDir()
	write := func(name, content string) string {
		p := filepath.Join(dir, name)
		require.NoError(t, os.WriteFile(p, []byte(content), 0o644))
		return p
	}
	storeDir := filepath.Join(dir, "store")
	task := `{"prompt": "p", "label": "a", "metadata": {}}`
	grade := `{"rollout_id":1,"index":1,"group_index":0,"sample":0,"task_id":"t","reward":0,"applied":false,"apply_method":null,"exit_code":1,"failure":"tests_failed","error":null,"duration_ms":1,"image_digest":null,"log":null,"grading_kind":null,"tests":null,"baseline":false}`
	rollout := `{"rollout_id":0,"index":0,"group_index":0,"sample":0,"task_id":"t","agent":"shell","weights_version":"w","patch":"","agent_exit_code":0,"abort_reason":null,"abort_detail":null,"turns":1,"prompt_tokens":1,"output_tokens":1,"started_at":"2024-01-01T00:00:00Z","ended_at":"2024-01-01T00:00:01Z","artifacts":null}`
	turn := `{"rollout_id":0,"index":0,"group_index":0,"session":"s","turn":0,"prompt_ids":[1],"output_ids":[2],"output_log_probs":[-0.5],"finish_reason":"stop","ill_formed":false,"prompt_messages":[],"response_message":null,"max_context_tokens":0,"reward":null}`
	cases := []struct {
		name, kind, file, content, want string
	}{
		{"tasks trailing garbage", "tasks", "garbage.jsonl", task + "}}]garbage\n", "garbage.jsonl:1: not a JSON object: trailing data"},
		{"tasks garbage on line 2", "tasks", "garbage2.jsonl", `{"prompt": "q", "label": "b", "metadata": {}}` + "\n" + task + "}}]garbage\n", "garbage2.jsonl:2: "},
		{"tasks empty", "tasks", "empty-tasks.jsonl", "", "has no rows"},
		{"turns empty", "turns", "empty-turns.jsonl", "", `"` + filepath.Join(dir, "empty-turns.jsonl") + `" has no rows`},
		{"rollouts empty", "rollouts", "empty-rollouts.jsonl", "\n", "has no rows"},
		{"grades empty", "grades", "empty-grades.jsonl", "", "has no rows"},
		{"grades truncated", "grades", "trunc.jsonl", grade + "\n" + grade[:40] + "\n", "trunc.jsonl:2: not a JSON object: truncated"},
		{"grades unknown column", "grades", "unknown.jsonl", strings.Replace(grade, `"baseline"`, `"verdict":1,"baseline"`, 1) + "\n", `unknown.jsonl:1: json: unknown field "verdict"`},
		{"grades invalid reward", "grades", "reward.jsonl", strings.Replace(grade, `"reward":0`, `"reward":1`, 1) + "\n", "reward.jsonl:1: grade of rollout 1"},
		{"rollouts negative turns", "rollouts", "neg.jsonl", strings.Replace(rollout, `"turns":1`, `"turns":-1`, 1) + "\n", "neg.jsonl:1: rollout 0"},
		{"turns no session", "turns", "nosession.jsonl", strings.Replace(turn, `"session":"s"`, `"session":""`, 1) + "\n", "nosession.jsonl:1: turn 0 of session \"\": empty session"},
		{"turns bad messages", "turns", "msgs.jsonl", strings.Replace(turn, `"prompt_messages":[]`, `"prompt_messages":{}`, 1) + "\n", "prompt_messages is not a JSON array"},
	}
	for _, c := range cases {
		t.Run(c.name, func(t *testing.T) {
			r := kiln(t, "import", c.kind, "--store", storeDir, write(c.file, c.content))
			assert.Equal(t, stagecmd.ExitBadInput, r.Code, r.Stderr)
			assert.Contains(t, r.Stderr, c.want)
			assert.Contains(t, r.Stderr, c.file, "the error names the file")
		})
	}
	all, err := dataset.List(context.Background(), mustLocal(t, storeDir), "")
	require.NoError(t, err)
	assert.Empty(t, all, "no refused import left a version")
}

// TestImportIsAsStrictAsWrites is issue 31's hostile import: every row a
// stage could not write is refused at import (exit 5), naming the file,
// the line and the field, and no version appears; a row a stage writes
// (a weights_changed abort, an exception:<type> one) imports.
func TestImportIsAsStrictAsWrites(t *testing.T) {
	dir := t.TempDir()
	storeDir := filepath.Join(dir, "store")
	rollout := `{"rollout_id":0,"index":0,"group_index":0,"sample":0,"task_id":"t","agent":"shell","weights_version":"w","patch":"","agent_exit_code":0,"abort_reason":null,"abort_detail":null,"turns":1,"prompt_tokens":1,"output_tokens":1,"started_at":"2024-01-01T00:00:00Z","ended_at":"2024-01-01T00:00:01Z","artifacts":null}`
	grade := `{"rollout_id":0,"index":0,"group_index":0,"sample":0,"task_id":"t","reward":0,"applied":false,"apply_method":null,"exit_code":1,"failure":"tests_failed","error":null,"duration_ms":1,"image_digest":null,"log":null,"grading_kind":null,"tests":null,"baseline":false}`
	turn := `{"rollout_id":0,"index":0,"group_index":0,"session":"s","turn":0,"prompt_ids":[1,2],"output_ids":[3],"output_log_probs":[-0.5],"finish_reason":"stop","ill_formed":false,"prompt_messages":[],"response_message":null,"max_context_tokens":0,"reward":null}`
	edit := func(row, old, new string) string {
		require.Contains(t, row, old)
		return strings.Replace(row, old, new, 1)
	}
	other := func(row string) string {
		return edit(edit(row, `"rollout_id":0`, `"rollout_id":1`), `"index":0`, `"index":1`)
	}
	cases := []struct {
		name, kind string
		lines      []string
		want       string // "" = imports
	}{
		{"turns negative token id", "turns", []string{edit(turn, `"prompt_ids":[1,2]`, `"prompt_ids":[1,-2]`)}, ":1: turn 0 of session \"s\": prompt_ids[1] = -2: token ids are 0 or more"},
		{"turns negative output id", "turns", []string{edit(turn, `"output_ids":[3]`, `"output_ids":[-3]`)}, ":1: turn 0 of session \"s\": output_ids[0] = -3"},
		{"turns logprob 3.0", "turns", []string{edit(turn, `[-0.5]`, `[3.0]`)}, ":1: turn 0 of session \"s\": output_log_probs[0] = 3: a logprob is finite and at most 0"},
		{"turns negative id", "turns", []string{edit(turn, `"index":0`, `"index":-4`)}, ":1: turn 0 of session \"s\": negative id"},
		{"turns missing prompt_ids", "turns", []string{edit(turn, `"prompt_ids":[1,2],`, ``)}, `:1: field "prompt_ids" is missing`},
		{"turns duplicate", "turns", []string{turn, turn}, `:2: duplicate turn 0 of session "s" (first on line 1)`},
		{"grades reward null", "grades", []string{edit(grade, `"reward":0`, `"reward":null`)}, `:1: field "reward" is null`},
		{"grades missing failure", "grades", []string{edit(grade, `"failure":"tests_failed",`, ``)}, `:1: field "failure" is missing`},
		{"grades log escapes", "grades", []string{edit(grade, `"log":null`, `"log":"../../etc/passwd"`)}, `:1: grade of rollout 0 (task "t"): log "../../etc/passwd": empty, "." or ".." path segment`},
		{"grades log absolute", "grades", []string{edit(grade, `"log":null`, `"log":"/etc/passwd"`)}, `:1: grade of rollout 0 (task "t"): log "/etc/passwd"`},
		{"grades unknown failure", "grades", []string{edit(grade, `"tests_failed"`, `"flaky"`)}, `:1: grade of rollout 0 (task "t"): unknown failure class "flaky"`},
		{"grades unknown apply method", "grades", []string{edit(grade, `"apply_method":null`, `"apply_method":"rsync"`)}, `:1: grade of rollout 0 (task "t"): unknown apply_method "rsync"`},
		{"grades negative duration", "grades", []string{edit(grade, `"duration_ms":1`, `"duration_ms":-1`)}, `:1: grade of rollout 0 (task "t"): negative sample`},
		{"grades duplicate", "grades", []string{grade, other(grade), grade}, `:3: duplicate grade of rollout_id 0 (first on line 1)`},
		{"rollouts unknown abort reason", "rollouts", []string{edit(rollout, `"abort_reason":null`, `"abort_reason":"because"`)}, `:1: rollout 0 (task "t"): unknown abort_reason "because"`},
		{"rollouts empty exception type", "rollouts", []string{edit(rollout, `"abort_reason":null`, `"abort_reason":"exception:"`)}, `:1: rollout 0 (task "t"): unknown abort_reason "exception:"`},
		{"rollouts artifacts escape", "rollouts", []string{edit(rollout, `"artifacts":null`, `"artifacts":"runs/../../x/"`)}, `:1: rollout 0 (task "t"): artifacts "runs/../../x/"`},
		{"rollouts negative rollout_id", "rollouts", []string{edit(rollout, `"rollout_id":0`, `"rollout_id":-1`)}, `:1: rollout -1 (task "t"): negative id`},
		{"rollouts missing task_id", "rollouts", []string{edit(rollout, `"task_id":"t",`, ``)}, `:1: field "task_id" is missing`},
		{"rollouts null turns", "rollouts", []string{edit(rollout, `"turns":1`, `"turns":null`)}, `:1: field "turns" is null`},
		{"rollouts duplicate", "rollouts", []string{rollout, rollout}, `:2: duplicate rollout_id 0 (first on line 1)`},
		{"rollouts weights_changed imports", "rollouts", []string{
			edit(rollout, `"abort_reason":null,"abort_detail":null`, `"abort_reason":"weights_changed","abort_detail":"turn 2 generated with weights 4"`),
			other(edit(rollout, `"abort_reason":null`, `"abort_reason":"exception:sandbox_boot"`))}, ""},
	}
	for i, c := range cases {
		t.Run(c.name, func(t *testing.T) {
			file := filepath.Join(dir, fmt.Sprintf("case%02d.jsonl", i))
			require.NoError(t, os.WriteFile(file, []byte(strings.Join(c.lines, "\n")+"\n"), 0o644))
			out := fmt.Sprintf("strict/%s%02d", c.kind, i)
			r := kiln(t, "import", c.kind, "--store", storeDir, "--out", out, file)
			if c.want == "" {
				require.Equal(t, 0, r.Code, r.Stderr)
				return
			}
			assert.Equal(t, stagecmd.ExitBadInput, r.Code, r.Stderr)
			assert.Contains(t, r.Stderr, file+c.want, "the error names the file, the line and the field")
			_, err := dataset.Resolve(context.Background(), mustLocal(t, storeDir), out)
			assert.ErrorIs(t, err, dataset.ErrNotFound, "no version appears")
		})
	}
}

// TestWriteRefusesAnotherKind: a writing command refuses to commit another
// kind under a name than it holds (exit 2, naming both), before it writes.
func TestWriteRefusesAnotherKind(t *testing.T) {
	dir := t.TempDir()
	storeDir := filepath.Join(dir, "store")
	tasks := kiln(t, "import", "tasks", "--store", storeDir, "--out", "held", rowsFile(t, 1, 2))
	require.Equal(t, 0, tasks.Code, tasks.Stderr)
	grade := `{"rollout_id":0,"index":0,"group_index":0,"sample":0,"task_id":"t","reward":0,"applied":false,"apply_method":null,"exit_code":1,"failure":"tests_failed","error":null,"duration_ms":1,"image_digest":null,"log":null,"grading_kind":null,"tests":null,"baseline":false}`
	file := filepath.Join(dir, "grades.jsonl")
	require.NoError(t, os.WriteFile(file, []byte(grade+"\n"), 0o644))
	r := kiln(t, "import", "grades", "--store", storeDir, "--out", "held", file)
	assert.Equal(t, stagecmd.ExitUsage, r.Code, r.Stderr)
	assert.Contains(t, r.Stderr, "dataset held holds tasks ("+tasks.LastLine()+"), and this command writes grades")
	vs, err := dataset.List(context.Background(), mustLocal(t, storeDir), "held")
	require.NoError(t, err)
	assert.Len(t, vs, 1, "nothing was written")
}
