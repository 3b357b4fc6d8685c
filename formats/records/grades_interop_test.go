package records_test

import (
	"bytes"
	"encoding/json"
	"os"
	"path/filepath"
	"testing"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/kilnrl/kiln/formats/records"
)

// TestIndependentReadersGradesRollouts reads grades and rollouts shards with
// DuckDB (testdata/interop/duckdb_rows.cjs) and compares every column with
// kiln's JSON view of the same rows.
func TestIndependentReadersGradesRollouts(t *testing.T) {
	npmDir := interopNPMDir(t)
	dir := t.TempDir()
	start := time.Date(2026, 11, 29, 22, 0, 0, 123e6, time.UTC)
	tests := `{"fail_to_pass":{"t::a":"PASSED"}}`
	cases := []struct {
		name   string
		encode func(*bytes.Buffer) error
		view   func(shard []byte, fn func(json.RawMessage) error) error
	}{{
		name: "grades",
		encode: func(b *bytes.Buffer) error {
			enc := records.NewGradeEncoder(b)
			if err := enc.Write(
				records.Grade{RolloutID: 1, Index: 1, GroupIndex: 0, Sample: 1, TaskID: "täsk-1", Reward: 1, Applied: true,
					ApplyMethod: ptr("git_apply"), Failure: records.FailureNone, DurationMS: 1234, Log: ptr("grades/_v/v/attachments/logs/1.jsonl"),
					GradingKind: ptr("swebench"), Tests: &tests},
				records.Grade{RolloutID: 2, Index: 2, TaskID: "t2", ExitCode: 124, Failure: records.FailureTimeout,
					Error: ptr("the grading command timed out"), Baseline: true},
			); err != nil {
				return err
			}
			return enc.Close()
		},
		view: records.GradesKind().EachJSON,
	}, {
		name: "rollouts",
		encode: func(b *bytes.Buffer) error {
			enc := records.NewRolloutEncoder(b)
			if err := enc.Write(
				records.Rollout{RolloutID: 0, Index: 0, TaskID: "t0", Agent: "shell", WeightsVersion: "w1", Patch: "diff --git a/x b/x\n",
					Turns: 3, PromptTokens: 100, OutputTokens: 40, StartedAt: start, EndedAt: start.Add(1500 * time.Millisecond), Artifacts: ptr("a/0")},
				records.Rollout{RolloutID: 1, Index: 1, Sample: 1, TaskID: "t0", AgentExitCode: -1, AbortReason: ptr("wall_clock_timeout"),
					AbortDetail: ptr("the run passed its deadline of 1m0s: sändbox 0e7c: context deadline exceeded"), StartedAt: start, EndedAt: start},
			); err != nil {
				return err
			}
			return enc.Close()
		},
		view: records.RolloutsKind().EachJSON,
	}}
	for _, c := range cases {
		t.Run(c.name, func(t *testing.T) {
			var buf bytes.Buffer
			require.NoError(t, c.encode(&buf))
			file := filepath.Join(dir, c.name+".parquet")
			require.NoError(t, os.WriteFile(file, buf.Bytes(), 0o644))
			var duck []map[string]any
			require.NoError(t, json.Unmarshal(runNode(t, npmDir, "duckdb_rows.cjs", file), &duck))
			var kiln []map[string]any
			require.NoError(t, c.view(buf.Bytes(), func(row json.RawMessage) error {
				var m map[string]any
				if err := json.Unmarshal(row, &m); err != nil {
					return err
				}
				// DuckDB reads JSON columns as the text they are stored as.
				if v, ok := m["tests"]; ok && v != nil {
					b, _ := json.Marshal(v)
					m["tests"] = string(b)
				}
				kiln = append(kiln, m)
				return nil
			}))
			require.Len(t, duck, len(kiln))
			for i := range kiln {
				for k, want := range kiln[i] {
					got := duck[i][k]
					if s, ok := want.(string); ok && (k == "started_at" || k == "ended_at") {
						wt, err := time.Parse(time.RFC3339Nano, s)
						require.NoError(t, err)
						gt, err := time.Parse(time.RFC3339Nano, got.(string))
						require.NoError(t, err, "%s row %d: %v", k, i, got)
						assert.True(t, wt.Equal(gt), "%s row %d: kiln %s, duckdb %s", k, i, s, got)
						continue
					}
					if k == "tests" && want != nil {
						assert.JSONEq(t, want.(string), got.(string))
						continue
					}
					assert.Equal(t, want, got, "%s row %d column %s", c.name, i, k)
				}
			}
		})
	}
}
