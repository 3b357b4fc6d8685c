package records

import (
	"bytes"
	"encoding/json"
	"testing"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
)

func TestGradesRoundTrip(t *testing.T) {
	tests := `{"status":{"t::a":"PASSED"},"fail_to_pass":["t::a"],"pass_to_pass":[],"missing":[]}`
	rows := []Grade{
		{RolloutID: 7, Index: 7, GroupIndex: 2, Sample: 1, TaskID: "fixture-calc-003", Reward: 1, Applied: true,
			ApplyMethod: ptr("git_apply"), ExitCode: 0, Failure: FailureNone, DurationMS: 812,
			ImageDigest: ptr("sha256:" + string(bytes.Repeat([]byte("a"), 64))), Log: ptr("grades/_v/v/attachments/logs/7.jsonl"),
			GradingKind: ptr("swebench"), Tests: &tests},
		{RolloutID: 8, Index: 8, GroupIndex: 2, TaskID: "fixture-calc-003", Applied: false, ExitCode: -1,
			Failure: FailurePatchFailed, Error: ptr("no method applied"), Baseline: true},
	}
	var buf bytes.Buffer
	enc := NewGradeEncoder(&buf)
	require.NoError(t, enc.Write(rows...))
	require.NoError(t, enc.Close())
	var got []Grade
	require.NoError(t, EachGrade(buf.Bytes(), func(g Grade) error { got = append(got, g); return nil }))
	assert.Equal(t, rows, got)

	// The JSON view embeds tests and keeps schema order.
	var views []json.RawMessage
	require.NoError(t, GradesKind().EachJSON(buf.Bytes(), func(row json.RawMessage) error {
		views = append(views, append(json.RawMessage(nil), row...))
		return nil
	}))
	require.Len(t, views, 2)
	assert.Contains(t, string(views[0]), `"tests":{"status":{"t::a":"PASSED"}`)
	assert.True(t, bytes.HasPrefix(views[0], []byte(`{"rollout_id":7,"index":7,"group_index":2,"sample":1,"task_id":"fixture-calc-003","reward":1,`)), string(views[0]))
	assert.Contains(t, string(views[1]), `"tests":null`)

	k, err := Lookup("grades")
	require.NoError(t, err)
	assert.Equal(t, GradesKind().Fingerprint(), k.Fingerprint())
}

func TestGradeValidate(t *testing.T) {
	bad := "{nope"
	cases := []struct {
		name string
		g    Grade
		want string
	}{
		{"empty id", Grade{Failure: FailureNone, Reward: 1, Applied: true}, "empty task_id"},
		{"reward above 1", Grade{TaskID: "a", Reward: 1.5, Failure: FailureTestsFailed}, "want a number in [0, 1]"},
		{"negative reward", Grade{TaskID: "a", Reward: -0.5, Failure: FailureTestsFailed}, "want a number in [0, 1]"},
		{"partial reward passing", Grade{TaskID: "a", Reward: 0.5, Applied: true, Failure: FailureNone}, "reward 1 iff failure none"},
		{"unknown failure", Grade{TaskID: "a", Failure: "oops"}, `unknown failure class "oops"`},
		{"reward without none", Grade{TaskID: "a", Reward: 1, Applied: true, Failure: FailureTestsFailed}, "reward 1 iff failure none"},
		{"none without reward", Grade{TaskID: "a", Failure: FailureNone}, "reward 1 iff failure none"},
		{"reward unapplied", Grade{TaskID: "a", Reward: 1, Failure: FailureNone}, "did not apply"},
		{"bad tests", Grade{TaskID: "a", Failure: FailureTestsFailed, Tests: &bad}, "tests is not valid JSON"},
	}
	for _, c := range cases {
		t.Run(c.name, func(t *testing.T) {
			err := NewGradeEncoder(&bytes.Buffer{}).Write(c.g)
			require.Error(t, err)
			assert.Contains(t, err.Error(), c.want)
		})
	}
}

func TestRolloutsRoundTrip(t *testing.T) {
	start := time.Date(2026, 11, 29, 22, 0, 0, 123e6, time.UTC)
	rows := []Rollout{
		{RolloutID: 0, Index: 0, GroupIndex: 0, Sample: 0, TaskID: "t0", Agent: "shell", WeightsVersion: "w1",
			Patch: "diff --git a/x b/x\n", AgentExitCode: 0, Turns: 3, PromptTokens: 100, OutputTokens: 40,
			StartedAt: start, EndedAt: start.Add(2 * time.Second), Artifacts: ptr("rollouts/_artifacts/0")},
		{RolloutID: 1, Index: 1, GroupIndex: 0, Sample: 1, TaskID: "t0", Agent: "shell", WeightsVersion: "w1",
			AgentExitCode: -1, AbortReason: ptr("wall_clock_timeout"), StartedAt: start, EndedAt: start},
	}
	var buf bytes.Buffer
	enc := NewRolloutEncoder(&buf)
	require.NoError(t, enc.Write(rows...))
	require.NoError(t, enc.Close())
	var got []Rollout
	require.NoError(t, EachRollout(buf.Bytes(), func(r Rollout) error { got = append(got, r); return nil }))
	require.Len(t, got, 2)
	for i := range rows {
		assert.True(t, rows[i].StartedAt.Equal(got[i].StartedAt), "started_at %d: %v vs %v", i, rows[i].StartedAt, got[i].StartedAt)
		assert.True(t, rows[i].EndedAt.Equal(got[i].EndedAt))
		got[i].StartedAt, got[i].EndedAt = rows[i].StartedAt, rows[i].EndedAt
	}
	assert.Equal(t, rows, got)

	var first json.RawMessage
	require.NoError(t, RolloutsKind().EachJSON(buf.Bytes(), func(row json.RawMessage) error {
		if first == nil {
			first = append(json.RawMessage(nil), row...)
		}
		return nil
	}))
	assert.Contains(t, string(first), `"abort_reason":null,"abort_detail":null,"turns":3,"prompt_tokens":100,"output_tokens":40,"started_at":"2026-11-29T22:00:00.123Z"`)

	err := NewRolloutEncoder(&bytes.Buffer{}).Write(Rollout{RolloutID: 3, TaskID: "t", StartedAt: start, EndedAt: start.Add(-time.Second)})
	assert.ErrorContains(t, err, "is before started_at")
	err = NewRolloutEncoder(&bytes.Buffer{}).Write(Rollout{RolloutID: 3})
	assert.ErrorContains(t, err, "empty task_id")
}
