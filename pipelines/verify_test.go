package pipelines_test

import (
	"context"
	"regexp"
	"strings"
	"testing"

	"github.com/kilnrl/kiln/formats/dataset"
	"github.com/kilnrl/kiln/formats/store"
	"github.com/kilnrl/kiln/internal/stagecmd"
)

// verifySpec has a deterministic target and one whose every build writes
// other content (the time in nanoseconds).
const verifySpec = `same:
	printf '{"prompt":"same","label":"s","metadata":{}}\n' > $$KILN_TMPDIR/in.jsonl
	kiln import tasks --out same $$KILN_TMPDIR/in.jsonl

noisy:
	printf '{"prompt":"noisy %s","label":"n","metadata":{}}\n' "$$(date +%s%N)" > $$KILN_TMPDIR/in.jsonl
	kiln import tasks --out noisy $$KILN_TMPDIR/in.jsonl
`

// TestVerifyPipelineTarget: kiln verify FILE.kiln TARGET passes a
// deterministic target, fails a non-deterministic one with exit 4 naming
// the difference (and keeps the rerun), and refuses a target not yet
// done. Before, no test ran it on a pipeline, and a verify that never
// reported a difference passed every test.
func TestVerifyPipelineTarget(t *testing.T) {
	f := newFixture(t)
	f.setSpec(verifySpec)

	// Not done yet: an error naming the target and its state, no rerun.
	_, errs, code := f.runErr("verify", "noisy")
	if code != stagecmd.ExitFailure || !strings.Contains(errs, "verify noisy: it must be done and write a dataset (--out); state: never built") {
		t.Errorf("kiln verify of a target not yet done: exit %d, want %d naming it\n%s", code, stagecmd.ExitFailure, errs)
	}
	st, err := store.Open(f.store)
	if err != nil {
		t.Fatal(err)
	}
	ctx := context.Background()
	if _, err := dataset.Resolve(ctx, st, "noisy-verify"); err == nil {
		t.Errorf("kiln verify of a target not yet done wrote noisy-verify")
	}

	if _, errs, code := f.runErr("run"); code != 0 {
		t.Fatalf("kiln run: exit %d\n%s", code, errs)
	}
	e := entries(t, f.store)

	for _, tc := range []struct {
		target string
		code   int
		want   *regexp.Regexp // in stderr
		kept   bool           // the rerun's scratch dataset is left
	}{
		{"same", 0, regexp.MustCompile(`verify same: ok, the rerun same-verify@[0-9a-f]+ had the same content as ` + regexp.QuoteMeta(e["same"].Ref)), false},
		{"noisy", stagecmd.ExitCorrupt, regexp.MustCompile(`verify noisy: NOT deterministic: shard 0 of ` + regexp.QuoteMeta(e["noisy"].Ref) + ` differs from the rerun noisy-verify@[0-9a-f]+ \(kept for inspection\)`), true},
	} {
		t.Run(tc.target, func(t *testing.T) {
			out, errs, code := f.runErr("verify", tc.target)
			if code != tc.code || !tc.want.MatchString(errs) {
				t.Errorf("kiln verify %s: exit %d, want %d and %s\n%s", tc.target, code, tc.code, tc.want, errs)
			}
			if tc.code == 0 && strings.TrimSpace(out) != e[tc.target].Ref {
				t.Errorf("kiln verify %s printed %q, want its ref %s", tc.target, out, e[tc.target].Ref)
			}
			_, err := dataset.Resolve(ctx, st, tc.target+"-verify")
			if kept := err == nil; kept != tc.kept {
				t.Errorf("after kiln verify %s the scratch dataset %s-verify is there: %v, want %v (%v)", tc.target, tc.target, kept, tc.kept, err)
			}
		})
	}
}
