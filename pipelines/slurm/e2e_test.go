package slurm

import (
	"bytes"
	"context"
	"encoding/json"
	"os"
	"os/exec"
	"path/filepath"
	"slices"
	"strings"
	"testing"
	"time"

	"github.com/kilnrl/kiln/formats/dataset"
	"github.com/kilnrl/kiln/formats/store"
	"github.com/kilnrl/kiln/internal/testenv/slurmtest"
	"github.com/kilnrl/kiln/pipelines"
)

// e2eSpec is the end-to-end pipeline: shell-script stages that write real
// datasets with the real kiln binary. data -> shards (a 4-task array, one
// version written in parts) -> gen (uses the engine service) -> bad (fails
// until FIX=ok) -> final. $(DIR) collects what the jobs saw.
const e2eSpec = `FIX ?= broken

data:
	printf '{"prompt":"data","label":"d","metadata":{}}\n' > $$KILN_TMPDIR/in.jsonl
	kiln import tasks --out data $$KILN_TMPDIR/in.jsonl

shards: [shards=4 throttle=2 cpus=1] data
	echo "$$SLURM_ARRAY_JOB_ID $$SLURM_ARRAY_TASK_ID $(shard) $(shards)" >> $(DIR)/shards.tasks
	for i in 0 1 2 3 4 5 6 7; do printf '{"prompt":"row %s of %s","label":"s%s","metadata":{}}\n' $$i $(ref data) $$i; done > $$KILN_TMPDIR/in.jsonl
	kiln import tasks --shard $(shard)/$(shards) --out shards $$KILN_TMPDIR/in.jsonl

engine: [service health="test -s $(DIR)/engine.up"]
	trap 'rm -f $(DIR)/engine.up; exit 0' TERM
	echo "$$SLURM_JOB_ID" > $(DIR)/engine.up
	while :; do sleep 0.2; done

gen: shards engine
	test -s $(DIR)/engine.up
	echo "$$SLURM_JOB_ID $$(cat $(DIR)/engine.up)" > $(DIR)/gen.engine
	printf '{"prompt":"gen from %s","label":"g","metadata":{}}\n' $(ref shards) > $$KILN_TMPDIR/in.jsonl
	kiln import tasks --out gen $$KILN_TMPDIR/in.jsonl

bad: gen
	echo ran >> $(DIR)/bad.ran
	test "$(FIX)" = ok
	printf '{"prompt":"bad from %s fix %s","label":"b","metadata":{}}\n' $(ref gen) $(FIX) > $$KILN_TMPDIR/in.jsonl
	kiln import tasks --out bad $$KILN_TMPDIR/in.jsonl

final: bad
	echo ran >> $(DIR)/final.ran
	printf '{"prompt":"final from %s","label":"f","metadata":{}}\n' $(ref bad) > $$KILN_TMPDIR/in.jsonl
	kiln import tasks --out final $$KILN_TMPDIR/in.jsonl
`

// buildKiln builds the real kiln binary (static, so that it runs as the
// job of any node) into a temporary directory.
func buildKiln(t *testing.T) string {
	t.Helper()
	bin := filepath.Join(t.TempDir(), "kiln")
	cmd := exec.Command("go", "build", "-o", bin, "../../cmd/kiln")
	cmd.Env = append(os.Environ(), "CGO_ENABLED=0")
	if out, err := cmd.CombinedOutput(); err != nil {
		t.Fatalf("go build ./cmd/kiln: %v\n%s", err, out)
	}
	return bin
}

// TestKilnSlurmPipeline submits a real pipeline to a real one-node Slurm
// cluster with the built kiln binary: kiln slurm submits and exits, each
// job runs kiln run --only (--shard for the array's tasks), a failing
// target stops its dependents, kiln status shows it, and kiln slurm again,
// after the fix, submits only the failed tail and completes the pipeline.
func TestKilnSlurmPipeline(t *testing.T) {
	c := slurmtest.Start(t)
	kiln := buildKiln(t)
	work := t.TempDir()
	os.Chmod(work, 0o755)
	marks := filepath.Join(work, "marks")
	storeDir := filepath.Join(work, "store")
	runDir := filepath.Join(work, "run")
	if err := os.MkdirAll(marks, 0o755); err != nil {
		t.Fatal(err)
	}
	file := filepath.Join(work, "p.kiln")
	if err := os.WriteFile(file, []byte(e2eSpec), 0o644); err != nil {
		t.Fatal(err)
	}
	// The jobs inherit this environment (sbatch --export=ALL): kiln on
	// PATH, the cluster's SLURM_CONF.
	env := append(slices.Clone(c.Env), "PATH="+filepath.Dir(kiln)+string(os.PathListSeparator)+os.Getenv("PATH"))
	kilnCmd := func(args ...string) (string, string, error) {
		cmd := exec.Command(kiln, args...)
		cmd.Env, cmd.Dir = env, work
		var out, errb bytes.Buffer
		cmd.Stdout, cmd.Stderr = &out, &errb
		err := cmd.Run()
		return out.String(), errb.String(), err
	}
	mustKiln := func(args ...string) string {
		t.Helper()
		out, errs, err := kilnCmd(args...)
		if err != nil {
			t.Fatalf("kiln %s: %v\n%s%s\n%s", strings.Join(args, " "), err, out, errs, c.Logs())
		}
		return out
	}
	common := []string{"--store", storeDir}
	slurmRun := func(vars ...string) map[string]string {
		t.Helper()
		out := mustKiln(append(append(slices.Clone(common), "slurm", file, "--dir", runDir, "DIR="+marks), vars...)...)
		ids := map[string]string{}
		for _, line := range strings.Split(strings.TrimSpace(out), "\n") {
			if f := strings.Fields(line); len(f) == 2 {
				ids[f[0]] = f[1]
			}
		}
		return ids
	}
	status := func(vars ...string) (map[string]string, string) {
		t.Helper()
		out := mustKiln(append(append(slices.Clone(common), "status", file, "--dir", runDir, "DIR="+marks), vars...)...)
		states := map[string]string{}
		for _, line := range strings.Split(out, "\n")[1:] {
			if f := strings.Fields(line); len(f) >= 2 {
				states[f[0]] = f[1]
			}
		}
		return states, out
	}
	wait := func(limit time.Duration, want map[string]string, vars ...string) {
		t.Helper()
		deadline := time.Now().Add(limit)
		for {
			got, out := status(vars...)
			ok := true
			for k, v := range want {
				ok = ok && got[k] == v
			}
			if ok {
				return
			}
			if time.Now().After(deadline) {
				t.Fatalf("after %v kiln status says\n%s\nwant %v\n%s", limit, out, want, c.Logs())
			}
			time.Sleep(300 * time.Millisecond)
		}
	}
	read := func(name string) string {
		b, _ := os.ReadFile(filepath.Join(marks, name))
		return string(b)
	}

	start := time.Now()
	ids := slurmRun()
	names := slices.Sorted(func(yield func(string) bool) {
		for k := range ids {
			if !yield(k) {
				return
			}
		}
	})
	if got := strings.Join(names, " "); got != "bad data engine final gen shards" {
		t.Fatalf("the first kiln slurm submitted %q, want every target", got)
	}
	wait(60*time.Second, map[string]string{"data": "done", "shards": "done", "gen": "done", "bad": "failed", "final": "cancelled"})
	t.Logf("first submission settled in %v", time.Since(start).Round(time.Millisecond))
	if s := read("final.ran"); s != "" {
		t.Errorf("final ran though bad failed: %q", s)
	}
	if s := read("bad.ran"); s != "ran\n" {
		t.Errorf("bad ran %q, want once", s)
	}

	// The array: four tasks of the one array job, task i running shard i.
	var tasks []string
	for _, line := range strings.Split(strings.TrimSpace(read("shards.tasks")), "\n") {
		f := strings.Fields(line)
		if len(f) != 4 || f[0] != ids["shards"] || f[1] != f[2] || f[3] != "4" {
			t.Errorf("shard line %q: want array job %s, task = shard, 4 shards", line, ids["shards"])
			continue
		}
		tasks = append(tasks, f[1])
	}
	if slices.Sort(tasks); strings.Join(tasks, " ") != "0 1 2 3" {
		t.Errorf("array tasks %v, want 0 1 2 3 once each", tasks)
	}
	// The service ran as its own job, started before gen and seen by it.
	if f := strings.Fields(read("gen.engine")); len(f) != 2 || f[0] != ids["gen"] || f[1] != ids["engine"] {
		t.Errorf("gen saw %q, want its job %s and the engine's job %s", read("gen.engine"), ids["gen"], ids["engine"])
	}

	// Fix the failure. kiln slurm again submits only bad and final.
	ids2 := slurmRun("FIX=ok")
	if len(ids2) != 2 || ids2["bad"] == "" || ids2["final"] == "" {
		t.Fatalf("the resubmission submitted %v, want bad and final only", ids2)
	}
	wait(60*time.Second, map[string]string{"data": "done", "shards": "done", "engine": "done", "gen": "done", "bad": "done", "final": "done"}, "FIX=ok")
	if s := read("final.ran"); s != "ran\n" {
		t.Errorf("final ran %q, want once", s)
	}
	if got := slurmRun("FIX=ok"); len(got) != 0 {
		t.Errorf("a third kiln slurm submitted %v, want nothing", got)
	}
	t.Logf("pipeline complete in %v", time.Since(start).Round(time.Millisecond))

	// Every target committed its dataset; shards is one version of 4
	// parts, the one the record names.
	st, err := store.Open(storeDir)
	if err != nil {
		t.Fatal(err)
	}
	ctx := context.Background()
	for _, name := range []string{"data", "shards", "gen", "bad", "final"} {
		b, _, err := store.ReadAll(ctx, st, pipelines.RecordPrefix+"p/targets/"+name+".json")
		if err != nil {
			t.Errorf("%s: no record: %v", name, err)
			continue
		}
		var e pipelines.Entry
		if err := json.Unmarshal(b, &e); err != nil {
			t.Fatal(err)
		}
		ref, err := dataset.ParseRef(e.Ref)
		if err != nil || ref.Name != name {
			t.Errorf("%s: recorded ref %q", name, e.Ref)
			continue
		}
		v, err := dataset.Open(ctx, st, ref)
		if err != nil {
			t.Errorf("%s: %s is not committed: %v", name, e.Ref, err)
			continue
		}
		latest, err := dataset.Open(ctx, st, dataset.Ref{Name: name})
		if err != nil || latest.Version != v.Version {
			t.Errorf("%s: latest is not the recorded %s (%v)", name, e.Ref, err)
		}
		if name == "shards" && (v.Parts != 4 || v.Rows != 8) {
			t.Errorf("shards: %d parts, %d rows; want one version of 4 parts, 8 rows", v.Parts, v.Rows)
		}
	}
	if s := read("engine.up"); s != "" {
		t.Errorf("the engine is still up after its last user: %q", s)
	}
	c.WaitIdle(t, time.Minute)
}
