package pipelines_test

import (
	"context"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"testing"

	"github.com/kilnrl/kiln/formats/store"
	"github.com/kilnrl/kiln/pipelines"
)

// keySpec is the planner's key, term by term (pipelines/README.md §3):
// up writes a version of $(A); blind uses up but its recipe does not spell
// $(ref up), so only the key's inputs term ties it to up's version; tail
// spells $(ref blind). sharded has a key attribute (shards, from SH) and a
// scheduling one (cpus, from CPUS) that its recipe does not spell, and no
// output, so its users see it as key:KEY; after uses it.
const keySpec = `A ?= a1
SH ?= 2
CPUS ?= 1

up:
	printf '{"prompt":"up %s","label":"u","metadata":{}}\n' $(A) > $$KILN_TMPDIR/in.jsonl
	kiln import tasks --out up $$KILN_TMPDIR/in.jsonl

blind: up
	printf '{"prompt":"blind","label":"b","metadata":{}}\n' > $$KILN_TMPDIR/in.jsonl
	kiln import tasks --out blind $$KILN_TMPDIR/in.jsonl

tail: blind
	printf '{"prompt":"tail of %s","label":"t","metadata":{}}\n' $(ref blind) > $$KILN_TMPDIR/in.jsonl
	kiln import tasks --out tail $$KILN_TMPDIR/in.jsonl

sharded: [shards=$(SH) cpus=$(CPUS)]
	true

after: sharded
	true
`

// ranOnce is ran without the repeats of a sharded target's shards.
func ranOnce(stderr string) string {
	return strings.Join(slices.Compact(ran(stderr)), " ")
}

// TestKeyTerms: after a full run, changing one thing reruns exactly the
// targets whose key it enters. Before, every test recipe spelled $(ref
// ...) and no test changed a key attribute, so a key without its inputs'
// refs or without the attributes passed every test.
func TestKeyTerms(t *testing.T) {
	for _, tc := range []struct {
		name string
		vars []string
		want string // the targets the second run runs, sorted
	}{
		{"nothing changed", nil, ""},
		// up's version changes; blind's key changes through its inputs
		// term alone and it reruns; it writes the same version, so tail
		// (keyed on blind's ref) does not.
		{"input version, recipe does not spell it", []string{"A=a2"}, "blind up"},
		// shards enters the key: sharded reruns, and after, which sees it
		// as key:KEY, with it.
		{"key attribute shards", []string{"SH=3"}, "after sharded"},
		// cpus is scheduling: nothing reruns.
		{"scheduling attribute cpus", []string{"CPUS=2"}, ""},
	} {
		t.Run(tc.name, func(t *testing.T) {
			f := newFixture(t)
			f.setSpec(keySpec)
			if _, errs, code := f.runErr("run"); code != 0 {
				t.Fatalf("first kiln run: exit %d\n%s", code, errs)
			}
			_, errs, code := f.runErr(append([]string{"run"}, tc.vars...)...)
			if code != 0 {
				t.Fatalf("kiln run %v: exit %d\n%s", tc.vars, code, errs)
			}
			if got := ranOnce(errs); got != tc.want {
				t.Errorf("kiln run %v ran %q, want %q", tc.vars, got, tc.want)
			}
		})
	}
}

// TestWhyInputChanged: when a prerequisite was rebuilt at a new version,
// kiln plan names that input and both versions as the reason its user
// reruns. Before, only the reruns were asserted, and a why that named the
// first unchanged input (or none) passed every test.
func TestWhyInputChanged(t *testing.T) {
	f := newFixture(t)
	f.setSpec(keySpec)
	if _, errs, code := f.runErr("run"); code != 0 {
		t.Fatalf("first kiln run: exit %d\n%s", code, errs)
	}
	v1 := entries(t, f.store)["up"].Ref
	if _, errs, code := f.runErr("run", "up", "A=a2"); code != 0 {
		t.Fatalf("kiln run up A=a2: exit %d\n%s", code, errs)
	}
	v2 := entries(t, f.store)["up"].Ref
	if v1 == v2 || v2 == "" {
		t.Fatalf("up's ref %q after A=a2, want a new version (was %q)", v2, v1)
	}
	want := "run input up changed: " + v1 + " -> " + v2
	if got := f.plan("A=a2")["blind"]; got != want {
		t.Errorf("kiln plan A=a2 says blind: %q, want %q", got, want)
	}
}

// TestProbeOneLineRecipe: a one-line kiln-stage recipe is done when the
// stage, with --print-version, names a version the store holds, even
// with no record of it; one that names a version the store lacks runs.
// Before, no test recipe was one line, and a planner that never probed
// passed every test. shards=1 is one shard, not a sharded target: it is
// probed as a target without the attribute is (before, no test wrote
// shards=1, and a probe skipped for Shards >= 1 passed every test).
func TestProbeOneLineRecipe(t *testing.T) {
	for _, tc := range []struct {
		name  string
		attrs string // after "one:"
	}{
		{"no attributes", ""},
		{"shards=1", " [shards=1]"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			f := newFixture(t)
			dir := filepath.Dir(f.spec)
			for name, row := range map[string]string{"in1.jsonl": `{"prompt":"one","label":"1","metadata":{}}`, "in2.jsonl": `{"prompt":"two","label":"2","metadata":{}}`} {
				if err := os.WriteFile(filepath.Join(dir, name), []byte(row+"\n"), 0o644); err != nil {
					t.Fatal(err)
				}
			}
			f.setSpec("IN ?= in1.jsonl\none:" + tc.attrs + "\n\tkiln import tasks --out one $(IN)\n")
			if _, errs, code := f.runErr("run"); code != 0 {
				t.Fatalf("kiln run: exit %d\n%s", code, errs)
			}
			e := entries(t, f.store)["one"]
			if !strings.HasPrefix(e.Ref, "one@") {
				t.Fatalf("one's entry %+v, want a ref of one", e)
			}
			// Forget the record: only the store's version says one is done.
			st, err := store.Open(f.store)
			if err != nil {
				t.Fatal(err)
			}
			ctx := context.Background()
			for _, k := range []string{"rl/done/" + e.Key + ".json", "rl/targets/one.json"} {
				if err := st.Delete(ctx, pipelines.RecordPrefix+k); err != nil {
					t.Fatal(err)
				}
			}
			if got, want := f.plan()["one"], "done the store holds "+e.Ref+" (--print-version)"; got != want {
				t.Errorf("plan says one: %q, want %q", got, want)
			}
			if _, errs, code := f.runErr("run"); code != 0 || ranOnce(errs) != "" {
				t.Errorf("kiln run after the plan said done: exit %d, ran %q, want nothing\n%s", code, ranOnce(errs), errs)
			}
			// Another input: --print-version names a version the store lacks.
			if got := f.plan("IN=in2.jsonl")["one"]; got != "run never built" {
				t.Errorf("plan IN=in2.jsonl says one: %q, want run never built", got)
			}
			if _, errs, code := f.runErr("run", "IN=in2.jsonl"); code != 0 || ranOnce(errs) != "one" {
				t.Errorf("kiln run IN=in2.jsonl: exit %d, ran %q, want one\n%s", code, ranOnce(errs), errs)
			}
		})
	}
}
