package slurm

import (
	"bytes"
	"strings"
	"testing"
)

// TestPrintTable: kiln status --table's numbers from the stages' metric
// names: pass rate reward_1/graded, the mean reward weighted by each
// group's gradeable count, loss and clip fraction as means and the logprob
// diff as the max over the optimizer steps, the weights number, wall time
// per stage; "-" for what no target recorded, a failed step's state, and
// the datasets of the last step with a done target.
func TestPrintTable(t *testing.T) {
	targets := []Target{
		{Name: "tasks", Step: -1},
		{Name: "engine", Step: -1, Service: true},
		{Name: "rollout/1", Step: 1}, {Name: "grade/1", Step: 1}, {Name: "advantages/1", Step: 1}, {Name: "train/1", Step: 1},
		{Name: "rollout/2", Step: 2}, {Name: "grade/2", Step: 2}, {Name: "advantages/2", Step: 2}, {Name: "train/2", Step: 2},
		{Name: "rollout/3", Step: 3}, {Name: "grade/3", Step: 3},
	}
	rows := []Row{{State: "done"}, {State: "missing"},
		{State: "done"}, {State: "done"}, {State: "done"}, {State: "done"},
		{State: "done"}, {State: "failed"}, {State: "missing"}, {State: "missing"},
		{State: "missing"}, {State: "missing"}}
	out := func(ref string, m map[string]any) []Output { return []Output{{Ref: ref, Metrics: m}} }
	details := []Details{
		{Ref: "t/tasks@1", Outputs: out("t/tasks@1", map[string]any{"tasks": 4.0}), WallSeconds: 1},
		{},
		{Ref: "r/1/trajectories@a", WallSeconds: 95, Outputs: append(out("r/1/rollouts@a",
			map[string]any{"runs": 16.0, "aborted": 1.0, "segments": 18.0, "weights_number": "1"}),
			Output{Ref: "r/1/trajectories@a", Metrics: map[string]any{"runs": 16.0}})},
		{Ref: "g/1@b", WallSeconds: 6.5, Outputs: out("g/1@b", map[string]any{"graded": 16.0, "reward_1": 4.0})},
		{Ref: "a/1@c", WallSeconds: 0.2, Outputs: out("a/1@c", map[string]any{"segments": 99.0, "group_stats": map[string]any{
			"reward_mean": []any{1.0, 0.5, 0.0}, "gradeable": []any{2.0, 4.0, 2.0}}})},
		{Ref: "c/1@d", WallSeconds: 44, Outputs: out("c/1@d", map[string]any{"trained_tokens": 512.0, "segments": 99.0,
			"step_metrics": map[string]any{"loss": []any{0.5, 1.5}, "pg_clipfrac": []any{0.1, 0.3},
				"train_rollout_logprob_max_abs_diff": []any{0.002, 0.01}}})},
		{Ref: "r/2/trajectories@e", WallSeconds: 30, Outputs: out("r/2/trajectories@e", map[string]any{"runs": 16.0, "weights_number": "2"})},
		{}, {}, {}, {}, {},
	}
	var b bytes.Buffer
	if err := printTable(&b, "/s", targets, rows, details); err != nil {
		t.Fatal(err)
	}
	got := b.String()
	lines := strings.Split(got, "\n")
	want := [][]string{
		{"STEP", "STATE", "PASS", "REWARD", "ROLLOUTS", "ABORTED", "SEGMENTS", "TRAINED_TOKENS", "LOSS", "CLIPFRAC", "LOGPROB_DIFF", "WEIGHTS", "|", "rollout", "grade", "advantages", "train"},
		{"1", "done", "0.250", "0.500", "16", "1", "18", "512", "1", "0.2", "0.01", "1", "|", "1m35s", "6.5s", "200ms", "44s"},
		{"2", "failed", "-", "-", "16", "-", "-", "-", "-", "-", "-", "2", "|", "30s", "-", "-", "-"},
	}
	for i, w := range want {
		if f := strings.Fields(lines[i]); strings.Join(f, " ") != strings.Join(w, " ") {
			t.Errorf("line %d:\n got %q\nwant %q\n%s", i, f, w, got)
		}
	}
	if strings.Contains(got, "\n     3 ") {
		t.Errorf("step 3 has no target done or failed, yet has a row:\n%s", got)
	}
	for _, s := range []string{"datasets in /s ", "  tasks ", "t/tasks@1", "  rollout/2 ", "r/2/trajectories@e"} {
		if !strings.Contains(got, s) {
			t.Errorf("no %q in:\n%s", s, got)
		}
	}
	if strings.Contains(got, "g/1@b") || strings.Contains(got, "  engine ") {
		t.Errorf("the datasets list more than step 2's and the stepless targets':\n%s", got)
	}
}
