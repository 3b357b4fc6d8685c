package advantages

import (
	"testing"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/kilnrl/kiln/formats/dataset"
	"github.com/kilnrl/kiln/formats/records"
)

// kiln-advantages prints its groups with and without signal, and warns
// when every advantage is 0 (every rollout of every group got the same
// reward).
func TestSummaryAndAllZeroWarning(t *testing.T) {
	w := newWorld(t)
	_, err := w.run(w.opts())
	require.NoError(t, err)
	assert.Contains(t, w.stderr.String(), "advantages: 2 groups: 2 with signal (mixed rewards), 0 without (every advantage 0), 0 dropped; 15 rows\n")
	assert.NotContains(t, w.stderr.String(), "WARN")

	// every rollout fails: one reward per group, every advantage 0
	var grades []records.Grade
	for r := int64(0); r < 8; r++ {
		grades = append(grades, grade(r, r/4, []string{"fixture-duration-001", "fixture-slugify-002"}[r/4], r%4, false))
	}
	w.grades = commitGrades(t, w.st, []dataset.Ref{w.tasks, w.rollouts}, grades)
	w.stderr.Reset()
	_, err = w.run(w.opts())
	require.NoError(t, err)
	errs := w.stderr.String()
	assert.Contains(t, errs, "advantages: 2 groups: 0 with signal (mixed rewards), 2 without (every advantage 0), 0 dropped; 15 rows\n")
	assert.Contains(t, errs, `level=WARN msg="every advantage is 0`)
	assert.Contains(t, errs, "advantages: WARNING: every advantage is 0")
}

func TestAllZero(t *testing.T) {
	assert.False(t, (&Result{}).AllZero(), "no rows: nothing to warn about here")
	assert.True(t, (&Result{Rows: []records.Advantage{{}, {}}}).AllZero())
	assert.False(t, (&Result{Rows: []records.Advantage{{}, {Advantage: -0.5}}}).AllZero())
}
