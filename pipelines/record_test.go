package pipelines_test

import (
	"bytes"
	"context"
	"encoding/json"
	"strings"
	"testing"

	"github.com/kilnrl/kiln/formats/store"
	"github.com/kilnrl/kiln/pipelines"
)

// TestSettleLastOlder is the kill between record.write's two Puts when
// the target had been built before: its last entry is an older build (of
// another key), not missing. The next run that finds it done rewrites the
// last entry from the done one, so kiln why words from the build that is
// done. TestSettleLast covers a missing last entry only; a settleLast
// that repaired only a missing one passed it.
func TestSettleLastOlder(t *testing.T) {
	f := newFixture(t)
	f.run("run")
	older := entries(t, f.store)["rollout/2"]
	f.run("run", "AGENT.2=other")
	newer := entries(t, f.store)["rollout/2"]
	if newer.Key == older.Key || !older.End.Before(newer.End) {
		t.Fatalf("AGENT.2=other built rollout/2 as %s ending %v, want another key than %s, later than %v", newer.Key[:12], newer.End, older.Key[:12], older.End)
	}
	// The crash: the newer build's done entry is there, its last entry
	// never replaced the older one.
	st, err := store.Open(f.store)
	if err != nil {
		t.Fatal(err)
	}
	b, err := json.MarshalIndent(older, "", "  ")
	if err != nil {
		t.Fatal(err)
	}
	if _, err := st.Put(context.Background(), pipelines.RecordPrefix+"rl/targets/rollout/2.json", bytes.NewReader(b), int64(len(b))); err != nil {
		t.Fatal(err)
	}

	_, errs := f.run("run", "AGENT.2=other")
	if got := ran(errs); len(got) != 0 {
		t.Errorf("run ran %v, want nothing (all done)", got)
	}
	if got := entries(t, f.store)["rollout/2"]; got.Key != newer.Key || !got.End.Equal(newer.End) {
		t.Errorf("rollout/2's last entry after the run: key %s ending %v, want the done build's %s ending %v", got.Key[:12], got.End, newer.Key[:12], newer.End)
	}
	// kiln why, back at the default, words from the newer build.
	if why := f.plan()["rollout/2"]; !strings.HasPrefix(why, `done`) {
		t.Errorf("plan at the default says rollout/2: %q, want done (its older build is recorded)", why)
	}
	if why, _ := f.run("why", "rollout/2", "AGENT.2=third"); !strings.Contains(why, `variable AGENT.2 changed: "other" -> "third"`) {
		t.Errorf("kiln why rollout/2 AGENT.2=third does not compare with the last build (AGENT.2=other):\n%s", why)
	}
}
