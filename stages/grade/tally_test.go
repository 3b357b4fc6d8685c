package grade

import (
	"testing"

	"github.com/stretchr/testify/assert"
)

// TestTally pins the end-of-run summary: rewards by failure class in a
// fixed order (the patch's fault, the tests', kiln's), classes with no row
// left out, then what the run did not grade.
func TestTally(t *testing.T) {
	cases := []struct {
		name    string
		metrics map[string]any
		want    string
	}{
		{"all pass",
			map[string]any{"graded": 4, "reward_1": 4, "failure_none": 4, "applied": 4, "resumed": 0},
			"grade: 4 graded: reward 1: 4, reward 0: 0"},
		{"baseline: all fail",
			map[string]any{"graded": 4, "reward_1": 0, "failure_tests_failed": 4, "resumed": 0},
			"grade: 4 graded: reward 1: 0, reward 0: 4 (tests_failed 4)"},
		{"every class, in order",
			map[string]any{"graded": 9, "reward_1": 2, "failure_none": 2, "failure_aborted": 1, "failure_no_grading": 1,
				"failure_infra_error": 1, "failure_timeout": 1, "failure_tests_failed": 2, "failure_patch_failed": 1},
			"grade: 9 graded: reward 1: 2, reward 0: 7 (patch_failed 1, tests_failed 2, timeout 1, infra_error 1, no_grading 1, aborted 1)"},
		{"an unknown class follows by name",
			map[string]any{"graded": 3, "reward_1": 0, "failure_zeta": 1, "failure_alpha": 1, "failure_timeout": 1},
			"grade: 3 graded: reward 1: 0, reward 0: 3 (timeout 1, alpha 1, zeta 1)"},
		{"resumed and other splits",
			map[string]any{"graded": 3, "reward_1": 3, "failure_none": 3, "resumed": 2, "skipped_other_split": 5},
			"grade: 3 graded: reward 1: 3, reward 0: 0; 2 resumed from an earlier attempt; 5 of another split skipped"},
		{"nothing to grade",
			map[string]any{"graded": 0, "reward_1": 0, "resumed": 5},
			"grade: 0 graded: reward 1: 0, reward 0: 0; 5 resumed from an earlier attempt"},
	}
	for _, c := range cases {
		t.Run(c.name, func(t *testing.T) {
			assert.Equal(t, c.want, tally(c.metrics))
		})
	}
}
