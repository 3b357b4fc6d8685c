package images

import (
	"os"
	"path/filepath"
	"strings"
	"testing"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/kilnrl/kiln/formats/records"
	"github.com/kilnrl/kiln/internal/stagecmd"
)

// TestJudge is the gate's rule on grades rows, without sandboxes: each
// case is one task's rows (sample 0 the empty patch, 1 the gold patch).
func TestJudge(t *testing.T) {
	row := func(sample int64, reward float64, failure string) records.Grade {
		return records.Grade{TaskID: "t", Sample: sample, Reward: reward, Failure: failure, ExitCode: 1}
	}
	empty, gold := int64(sampleEmpty), int64(sampleGold)
	cases := []struct {
		name    string
		hasGold bool
		rows    []records.Grade
		problem string // a substring of the verdict's problem; "" = passes
	}{
		{"fails then passes", true, []records.Grade{row(empty, 0, records.FailureTestsFailed), row(gold, 1, records.FailureNone)}, ""},
		{"baseline only, fails", false, []records.Grade{row(empty, 0, records.FailureTestsFailed)}, ""},
		{"baseline times out", true, []records.Grade{row(empty, 0, records.FailureTimeout), row(gold, 1, records.FailureNone)}, ""},
		{"empty patch passes", true, []records.Grade{row(empty, 1, records.FailureNone), row(gold, 1, records.FailureNone)}, "PASS with the empty patch"},
		{"empty patch passes, no gold", false, []records.Grade{row(empty, 1, records.FailureNone)}, "PASS with the empty patch"},
		{"gold fails its tests", true, []records.Grade{row(empty, 0, records.FailureTestsFailed), row(gold, 0, records.FailureTestsFailed)}, "gold patch FAILS: tests_failed (exit 1)"},
		{"gold does not apply", true, []records.Grade{row(empty, 0, records.FailureTestsFailed), row(gold, 0, records.FailurePatchFailed)}, "does not apply"},
		{"gold times out", true, []records.Grade{row(empty, 0, records.FailureTestsFailed), row(gold, 0, records.FailureTimeout)}, "gold patch FAILS: timeout"},
		{"sandbox fails", true, []records.Grade{row(empty, 0, records.FailureInfraError), row(gold, 0, records.FailureInfraError)}, "could not be graded: infra_error"},
		{"no grading path", false, []records.Grade{row(empty, 0, records.FailureNoGrading)}, "could not be graded: no_grading"},
		{"gold row missing", true, []records.Grade{row(empty, 0, records.FailureTestsFailed)}, "no grade of the gold patch"},
		{"no rows", false, nil, "no grade of the empty patch"},
	}
	for _, c := range cases {
		t.Run(c.name, func(t *testing.T) {
			vt := &verifyTask{id: "t", image: "img"}
			if c.hasGold {
				vt.gold = "diff"
			}
			tl := &taskList{order: []*verifyTask{vt}, byID: map[string]*verifyTask{"t": vt}}
			got := judge(tl, map[string]string{"img": "sha256:1"}, c.rows)
			require.Len(t, got, 1)
			assert.Equal(t, "sha256:1", got[0].Digest)
			if c.problem == "" {
				assert.Empty(t, got[0].Problem)
			} else {
				assert.Contains(t, got[0].Problem, c.problem)
			}
		})
	}
}

// TestImageLines: one line per image in first-seen order, refused when any
// of its tasks is.
func TestImageLines(t *testing.T) {
	got := imageLines([]TaskVerdict{
		{TaskID: "a", Image: "i2", Digest: "d2", HasGold: true},
		{TaskID: "b", Image: "i1", Digest: "d1"},
		{TaskID: "c", Image: "i2", Digest: "d2", HasGold: true, Problem: "x"},
	})
	assert.Equal(t, []string{
		"image\ti2\td2\tREFUSED\ttasks=2 gold=2 baseline_only=0 refused=1",
		"image\ti1\td1\tok\ttasks=1 gold=0 baseline_only=1 refused=0",
	}, got)
}

// TestReadGold: file lines win over metadata; a line naming an unknown
// task, a duplicate or a malformed line is a bad input naming the line.
func TestReadGold(t *testing.T) {
	cases := []struct {
		name, body, err string
	}{
		{"ok", `{"task_id":"a","patch":"P"}` + "\n\n", ""},
		{"unknown task", `{"task_id":"zz","patch":"P"}`, `line 1: task "zz" is not in tasks`},
		{"duplicate", `{"task_id":"a","patch":"P"}` + "\n" + `{"task_id":"a","patch":"Q"}`, `line 2: task "a" has a gold patch on line 1`},
		{"no patch", `{"task_id":"a"}`, "line 1: want"},
		{"not json", `{`, "line 1:"},
	}
	for _, c := range cases {
		t.Run(c.name, func(t *testing.T) {
			p := filepath.Join(t.TempDir(), "gold.jsonl")
			require.NoError(t, os.WriteFile(p, []byte(c.body), 0o644))
			a := &verifyTask{id: "a", gold: "from metadata"}
			tl := &taskList{order: []*verifyTask{a}, byID: map[string]*verifyTask{"a": a}}
			err := readGold(p, tl)
			if c.err == "" {
				require.NoError(t, err)
				assert.Equal(t, "P", a.gold)
				return
			}
			require.Error(t, err)
			assert.Contains(t, err.Error(), c.err)
			assert.Equal(t, stagecmd.ExitBadInput, stagecmd.ExitCode(err))
		})
	}
}

// TestJobsBounded: -j outside 1..stagecmd.MaxJobs is a usage error naming
// the bound, on import and on verify (issue 31: absurd counts are exit 2).
func TestJobsBounded(t *testing.T) {
	for _, args := range [][]string{
		{"kiln-images", "import", "--tasks", "t", "--bundles", t.TempDir(), "--out", "images", "-j", "100000"},
		{"kiln-images", "import", "--tasks", "t", "--bundles", t.TempDir(), "--out", "images", "-j", "0"},
		{"kiln-images", "verify", "--tasks", "t", "--images", "i", "--bundles", t.TempDir(), "-j", "100000"},
	} {
		var out, errb strings.Builder
		env := &stagecmd.Env{Stdout: &out, Stderr: &errb, Log: stagecmd.NewLogger(&errb, false)}
		code := stagecmd.Main(App(env), append(args, "--store", t.TempDir()), &errb)
		if code != stagecmd.ExitUsage || !strings.Contains(errb.String(), "want 1 to 4096") {
			t.Errorf("%v: exit %d, stderr %q; want 2 naming the bound", args[1:], code, errb.String())
		}
	}
}
