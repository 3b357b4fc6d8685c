package records

import (
	"encoding/json"
	"fmt"
	"io"

	"github.com/parquet-go/parquet-go"
)

// Failure classes of a grade (the grades kind's failure column). A grade
// with reward 1 always has FailureNone; every other outcome names why the
// reward is 0, so a crash, a timeout or a bad patch is a row, never a gap.
const (
	FailureNone        = "none"         // the tests passed: reward 1
	FailurePatchFailed = "patch_failed" // the diff did not apply; no test ran
	FailureTestsFailed = "tests_failed" // the official tests ran and did not all pass
	FailureTimeout     = "timeout"      // a grading command ran past --timeout (exit 124)
	FailureInfraError  = "infra_error"  // kiln could not grade: sandbox, setup, parser or result error
	FailureNoGrading   = "no_grading"   // the task has no grading payload (reward 0, no sandbox)
	FailureAborted     = "aborted"      // the rollout was aborted (abort_reason); its patch is not graded
)

// Grade is one row of the grades kind (Parquet): the verdict of the task's
// official tests on one agent run's patch (kiln-grade). The ids are the
// rollout's (docs/records.md §1); grades are the source of truth for rewards.
type Grade struct {
	RolloutID  int64  `parquet:"rollout_id" json:"rollout_id"`
	Index      int64  `parquet:"index" json:"index"`
	GroupIndex int64  `parquet:"group_index" json:"group_index"`
	Sample     int64  `parquet:"sample" json:"sample"`
	TaskID     string `parquet:"task_id" json:"task_id"`
	// Reward is 1 when the official tests pass on the patched tree, else 0;
	// a Harbor verifier's reward may be any number in [0, 1] (a fraction is
	// failure tests_failed).
	Reward float64 `parquet:"reward" json:"reward"`
	// Applied says the patch applied (an empty patch applies vacuously).
	Applied bool `parquet:"applied" json:"applied"`
	// ApplyMethod is how it applied: "empty", "git_apply", "git_apply_3way"
	// or "patch"; nil when it did not (or nothing was attempted).
	ApplyMethod *string `parquet:"apply_method,optional" json:"apply_method"`
	// ExitCode is the grading command's exit status (124: timed out); -1
	// when no grading command ran.
	ExitCode int64 `parquet:"exit_code" json:"exit_code"`
	// Failure is one of the Failure* classes.
	Failure string `parquet:"failure" json:"failure"`
	// Error is a one-line detail for patch_failed, timeout and infra_error.
	Error *string `parquet:"error,optional" json:"error"`
	// DurationMS is the wall time of the grading, from the sandbox boot to
	// the verdict (the sandbox is removed after).
	DurationMS int64 `parquet:"duration_ms" json:"duration_ms"`
	// ImageDigest is the task image's manifest digest ("sha256:<hex>").
	ImageDigest *string `parquet:"image_digest,optional" json:"image_digest"`
	// Log is the store key of the grading log (every command with its
	// output), saved before the sandbox was removed.
	Log *string `parquet:"log,optional" json:"log"`
	// GradingKind is the task's grading kind (eval_cmd, swebench, swepro, f2p).
	GradingKind *string `parquet:"grading_kind,optional" json:"grading_kind"`
	// Tests is a JSON object of per-test results for test-list grading
	// (swebench, swepro): {"status": {name: status}, "fail_to_pass": [...],
	// "pass_to_pass": [...], "missing": [...]}.
	Tests *string `parquet:"tests,optional" json:"tests"`
	// Baseline marks a grade of the empty patch (kiln-grade --baseline).
	Baseline bool `parquet:"baseline" json:"baseline"`
}

var gradeJSONColumns = map[string]bool{"tests": true}

// GradesKind is the grades record kind.
func GradesKind() Kind { return gradesKind }

var gradesKind = Kind{
	Name:     "grades",
	Encoding: Parquet,
	Ext:      ".parquet",
	Schema:   parquet.SchemaOf(Grade{}).String(),
	EachJSON: eachJSONValue(EachGrade),
}

var failureClasses = map[string]bool{FailureNone: true, FailurePatchFailed: true, FailureTestsFailed: true,
	FailureTimeout: true, FailureInfraError: true, FailureNoGrading: true, FailureAborted: true}

// applyMethods are the ways a patch applies (Grade.ApplyMethod).
var applyMethods = map[string]bool{"empty": true, "git_apply": true, "git_apply_3way": true, "patch": true}

// Validate checks the invariants a grades row must hold on write, and on
// import: kiln-grade's rows and imported ones pass the same checks.
func (g *Grade) Validate() error {
	where := fmt.Sprintf("grade of rollout %d (task %q)", g.RolloutID, g.TaskID)
	if err := checkIDs(g.RolloutID, g.Index, g.GroupIndex); err != nil {
		return fmt.Errorf("%s: %w", where, err)
	}
	switch {
	case g.TaskID == "":
		return fmt.Errorf("grade of rollout %d: empty task_id", g.RolloutID)
	case g.Sample < 0 || g.DurationMS < 0:
		return fmt.Errorf("%s: negative sample (%d) or duration_ms (%d)", where, g.Sample, g.DurationMS)
	case g.ApplyMethod != nil && !applyMethods[*g.ApplyMethod]:
		return fmt.Errorf("%s: unknown apply_method %q (want empty, git_apply, git_apply_3way or patch)", where, *g.ApplyMethod)
	case g.Log != nil && checkStoreKey("log", *g.Log, false) != nil:
		return fmt.Errorf("%s: %w", where, checkStoreKey("log", *g.Log, false))
	case !(g.Reward >= 0 && g.Reward <= 1):
		return fmt.Errorf("%s: reward %v, want a number in [0, 1]", where, g.Reward)
	case !failureClasses[g.Failure]:
		return fmt.Errorf("%s: unknown failure class %q", where, g.Failure)
	case (g.Reward == 1) != (g.Failure == FailureNone):
		return fmt.Errorf("%s: reward %v with failure %q (reward 1 iff failure none)", where, g.Reward, g.Failure)
	case g.Reward == 1 && !g.Applied:
		return fmt.Errorf("%s: reward 1 on a patch that did not apply", where)
	case g.Tests != nil && !json.Valid([]byte(*g.Tests)):
		return fmt.Errorf("%s: tests is not valid JSON", where)
	}
	return nil
}

// MarshalRow is the row's JSON view: columns in schema order, tests embedded.
func (g *Grade) MarshalRow() (json.RawMessage, error) {
	return marshalRow(g, gradeJSONColumns)
}

// GradeEncoder streams grades into one Parquet shard (zstd).
type GradeEncoder = ParquetEncoder[Grade, *Grade]

// NewGradeEncoder writes a Parquet file to w; Close finishes it.
func NewGradeEncoder(w io.Writer) *GradeEncoder { return newParquetEncoder[Grade](w) }

// EachGrade decodes a grades shard in row order.
func EachGrade(shard []byte, fn func(Grade) error) error {
	return eachParquetRow(shard, "grades", fn)
}
