package datasets_test

import (
	"context"
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
		{"rollouts negative turns", "rollouts", "neg.jsonl", `{"task_id":"t","turns":-1}` + "\n", "neg.jsonl:1: rollout 0"},
		{"turns no session", "turns", "nosession.jsonl", `{"prompt_messages":[]}` + "\n", "nosession.jsonl:1: turn 0 of session \"\": empty session"},
		{"turns bad messages", "turns", "msgs.jsonl", `{"session":"s","prompt_messages":{}}` + "\n", "prompt_messages is not a JSON array"},
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
