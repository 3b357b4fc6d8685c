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

// TestOldEntryWithoutOutputs: a done entry written before targets had
// several outputs has a ref and no outputs field; it reads as done with
// the one output [Ref] (Entry.Outputs), so kiln status lists that output.
// Before, no test read an entry in the older format, and one read with
// no outputs passed every test.
func TestOldEntryWithoutOutputs(t *testing.T) {
	f := newFixture(t)
	f.setSpec(`one:
	printf '{"prompt":"one","label":"1","metadata":{}}\n' > $$KILN_TMPDIR/in.jsonl
	kiln import tasks --out one $$KILN_TMPDIR/in.jsonl
`)
	f.run("run")
	e := entries(t, f.store)["one"]
	if !strings.HasPrefix(e.Ref, "one@") || len(e.Outputs) != 1 {
		t.Fatalf("one's entry %+v, want a ref of one and it as its one output", e)
	}
	// Rewrite its record in the older format: no outputs field.
	st, err := store.Open(f.store)
	if err != nil {
		t.Fatal(err)
	}
	ctx := context.Background()
	for _, k := range []string{"rl/done/" + e.Key + ".json", "rl/targets/one.json"} {
		b, _, err := store.ReadAll(ctx, st, pipelines.RecordPrefix+k)
		if err != nil {
			t.Fatal(err)
		}
		var m map[string]any
		if err := json.Unmarshal(b, &m); err != nil {
			t.Fatal(err)
		}
		delete(m, "outputs")
		if b, err = json.Marshal(m); err != nil {
			t.Fatal(err)
		}
		if bytes.Contains(b, []byte(`"outputs"`)) {
			t.Fatalf("rewritten entry still has outputs: %s", b)
		}
		if _, err := st.Put(ctx, pipelines.RecordPrefix+k, bytes.NewReader(b), int64(len(b))); err != nil {
			t.Fatal(err)
		}
	}

	if why := f.plan()["one"]; !strings.HasPrefix(why, "done recorded: built ") || !strings.HasSuffix(why, " as "+e.Ref) {
		t.Errorf("plan says one: %q, want done, recorded as %s", why, e.Ref)
	}
	out, _ := f.run("status", "--json")
	var row struct {
		State   string `json:"state"`
		Ref     string `json:"ref"`
		Outputs []struct {
			Ref string `json:"ref"`
		} `json:"outputs"`
	}
	if err := json.Unmarshal([]byte(strings.TrimSpace(out)), &row); err != nil {
		t.Fatalf("status --json %q: %v", out, err)
	}
	if row.State != "done" || row.Ref != e.Ref || len(row.Outputs) != 1 || row.Outputs[0].Ref != e.Ref {
		t.Errorf("status --json of the older entry: %+v, want done with ref and one output %s", row, e.Ref)
	}
	if _, errs := f.run("run"); len(ran(errs)) != 0 {
		t.Errorf("run ran %v, want nothing (one is recorded done)", ran(errs))
	}
}
