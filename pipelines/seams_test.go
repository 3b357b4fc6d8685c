package pipelines_test

import (
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/kilnrl/kiln/formats/store"
	"github.com/kilnrl/kiln/pipelines"
)

// The tests of issue 32's engine seams (several outputs, services,
// failure records, exit statuses, summaries) and issue 31's lock row.

// multiStage is a kiln stage with three outputs, as kiln-rollout run has:
// "kiln-multi --out NAME IN [--print-version]" writes (or with
// --print-version names) NAME/rollouts, NAME/turns and NAME/trajectories
// and prints their refs last, one a line, in that order.
const multiStage = `#!/bin/sh
set -e
out=$2 in=$3 pv=$4
echo "kiln-multi: writing $out" >&2
for s in rollouts turns trajectories; do
	kiln import tasks --out "$out/$s" "$in" $pv | tail -n 1
done
`

// setSpec replaces the fixture's spec with src.
func (f *fixture) setSpec(src string) {
	f.t.Helper()
	if err := os.WriteFile(f.spec, []byte(src), 0o644); err != nil {
		f.t.Fatal(err)
	}
}

// runErr runs kiln and returns its outputs and exit status.
func (f *fixture) runErr(args ...string) (stdout, stderr string, code int) {
	f.t.Helper()
	c := f.cmd(args...)
	var o, e bytes.Buffer
	c.Stdout, c.Stderr = &o, &e
	err := c.Run()
	var ee *exec.ExitError
	switch {
	case errors.As(err, &ee):
		code = ee.ExitCode()
	case err != nil:
		f.t.Fatal(err)
	}
	return o.String(), e.String(), code
}

// TestSeveralOutputs: a one-line kiln-stage recipe that writes three
// datasets (kiln-rollout run's shape) runs, records its three outputs,
// $(ref T NAME) picks one, and kiln plan (through --print-version) and
// kiln run agree on it even with no record. Before, kiln run failed it
// ("the recipe's last stdout line ... is not a ref of rollout/step-1")
// while kiln plan called it done.
func TestSeveralOutputs(t *testing.T) {
	f := newFixture(t)
	bin := filepath.Dir(f.kiln)
	if err := os.WriteFile(filepath.Join(bin, "kiln-multi"), []byte(multiStage), 0o755); err != nil {
		t.Fatal(err)
	}
	in := filepath.Join(filepath.Dir(f.spec), "in.jsonl")
	os.WriteFile(in, []byte(`{"prompt":"p","label":"l","metadata":{}}`+"\n"), 0o644)
	rollout := `STEPS = 1
rollout/$(step):
	kiln-multi --out rollout/step-$(step) ` + in + `
`
	f.setSpec(rollout)
	if _, errs, code := f.runErr("run"); code != 0 {
		t.Fatalf("kiln run of the three-output target: exit %d\n%s", code, errs)
	}
	ro := entries(t, f.store)["rollout/1"]
	var names []string
	for _, o := range ro.Outputs {
		n, _, _ := strings.Cut(o, "@")
		names = append(names, n)
	}
	if got, want := strings.Join(names, " "), "rollout/step-1/rollouts rollout/step-1/turns rollout/step-1/trajectories"; got != want {
		t.Fatalf("rollout/1's outputs %v, want %s", ro.Outputs, want)
	}
	if ro.Ref != ro.Outputs[2] {
		t.Errorf("rollout/1's ref %s, want its last output %s", ro.Ref, ro.Outputs[2])
	}

	// $(ref T NAME) names one output; $(ref T) is the last.
	f.setSpec(rollout + `grade/$(step): rollout/$(step)
	printf '{"prompt":"grade %s of %s","label":"g","metadata":{}}\n' $(ref rollout/$(step) rollouts) $(ref rollout/$(step)) > $$KILN_TMPDIR/in.jsonl
	kiln import tasks --out grades/$(step) $$KILN_TMPDIR/in.jsonl
`)
	out, errs, code := f.runErr("run")
	if code != 0 {
		t.Fatalf("kiln run: exit %d\n%s", code, errs)
	}
	if !strings.HasPrefix(lastLineOf(out), "grades/1@") {
		t.Errorf("last line %q, want grades/1's ref", lastLineOf(out))
	}
	e := entries(t, f.store)
	if rec := strings.Join(e["grade/1"].Recipe, "\n"); !strings.Contains(rec, "grade "+"%s of %s") || !strings.Contains(rec, ro.Outputs[0]+" "+ro.Outputs[2]) {
		t.Errorf("grade/1's recipe does not name rollouts then the ref:\n%s", rec)
	}

	// Without the record, kiln plan finds rollout/1 done through
	// --print-version, and kiln run agrees: it does not run it.
	st, _ := store.Open(f.store)
	ctx := context.Background()
	for _, k := range []string{"rl/done/" + ro.Key + ".json", "rl/targets/rollout/1.json"} {
		if err := st.Delete(ctx, pipelines.RecordPrefix+k); err != nil {
			t.Fatal(err)
		}
	}
	if p := f.plan()["rollout/1"]; !strings.HasPrefix(p, "done the store holds "+ro.Outputs[0]) {
		t.Errorf("plan says rollout/1: %q, want done through --print-version", p)
	}
	_, errs = f.run("run")
	if got := ran(errs); len(got) != 0 {
		t.Errorf("run after plan said done ran %v, want nothing", got)
	}

	// An output the target does not have is a plan error naming its outputs.
	src, _ := os.ReadFile(f.spec)
	f.setSpec(strings.Replace(string(src), "rollouts)", "nope)", 1))
	_, errs, code = f.runErr("plan")
	if code == 0 || !strings.Contains(errs, `has no output "nope"; its outputs are rollout/step-1/rollouts@`) {
		t.Errorf("plan with $(ref rollout/1 nope): exit %d\n%s", code, errs)
	}
}

// TestNoOutLastLine: a target without an output dataset has a ref only
// when its last stdout line is a pinned ref (pipelines/README.md §3);
// an unpinned one (a bare dataset name) or any other line leaves it
// identified by its key, and its users' $(ref T) is key:KEY. Before, no
// test printed an unpinned ref as such a target's last line, and reading
// it as the target's ref passed every test.
func TestNoOutLastLine(t *testing.T) {
	for _, tc := range []struct {
		name, last string
		ref        string // the ref recorded; "" for none
	}{
		{"pinned ref", "tasks@v1", "tasks@v1"},
		{"unpinned ref", "tasks", ""},
		{"not a ref", "no ref here", ""},
	} {
		t.Run(tc.name, func(t *testing.T) {
			f := newFixture(t)
			f.setSpec("noout:\n\techo '" + tc.last + "'\n\nuser: noout\n\techo $(ref noout)\n")
			if _, errs, code := f.runErr("run"); code != 0 {
				t.Fatalf("kiln run: exit %d\n%s", code, errs)
			}
			e := entries(t, f.store)
			no := e["noout"]
			if no.Ref != tc.ref {
				t.Errorf("noout printed %q last: recorded ref %q (outputs %q), want %q", tc.last, no.Ref, no.Outputs, tc.ref)
			}
			if tc.ref == "" && len(no.Outputs) != 0 {
				t.Errorf("noout printed %q last: recorded outputs %q, want none", tc.last, no.Outputs)
			}
			want := tc.ref
			if want == "" {
				want = "key:" + no.Key
			}
			if got := strings.Join(e["user"].Recipe, "\n"); got != "echo "+want {
				t.Errorf("user's recipe %q, want $(ref noout) as %s", got, want)
			}
		})
	}
}

// TestServiceSeams: a service's recipe gets $(ref T) and KILN_TMPDIR, it
// starts only after its own prerequisites (its user has none of its own,
// so before, it started at once, with $(ref data) empty), its users and
// its health check see KILN_SERVICE_<NAME>_HOST, and kiln run --only
// SERVICE resolves its refs too.
func TestServiceSeams(t *testing.T) {
	f := newFixture(t)
	dir := t.TempDir()
	f.setSpec(`data:
	sleep 0.5
	printf '{"prompt":"d","label":"d","metadata":{}}\n' > $$KILN_TMPDIR/in.jsonl
	kiln import tasks --out data $$KILN_TMPDIR/in.jsonl
srv: [service health="test -s ` + dir + `/srv.$$KILN_SERVICE_SRV_HOST"] data
	test -n "$$KILN_TMPDIR" -a -d "$$KILN_TMPDIR"
	echo "$(ref data)" > $$KILN_TMPDIR/ref
	cp $$KILN_TMPDIR/ref ` + dir + `/srv.$$KILN_SERVICE_SRV_HOST
	trap 'exit 0' TERM; while :; do sleep 0.05; done
user: srv
	echo "$$KILN_SERVICE_SRV_HOST" > ` + dir + `/user.host
`)
	if _, errs, code := f.runErr("run", "-j", "2"); code != 0 {
		t.Fatalf("kiln run: exit %d\n%s", code, errs)
	}
	ref, err := os.ReadFile(filepath.Join(dir, "srv.localhost"))
	if err != nil || !strings.HasPrefix(string(ref), "data@") {
		t.Errorf("the service saw $(ref data) = %q (%v), want data's ref", ref, err)
	}
	if h, _ := os.ReadFile(filepath.Join(dir, "user.host")); strings.TrimSpace(string(h)) != "localhost" {
		t.Errorf("the user saw KILN_SERVICE_SRV_HOST=%q, want localhost", h)
	}

	// --only srv (a Slurm service job) resolves the same ref.
	os.Remove(filepath.Join(dir, "srv.localhost"))
	c := f.cmd("run", "--only", "srv")
	if err := c.Start(); err != nil {
		t.Fatal(err)
	}
	deadline := time.Now().Add(20 * time.Second)
	for {
		if b, _ := os.ReadFile(filepath.Join(dir, "srv.localhost")); len(b) > 0 {
			if string(b) != string(ref) {
				t.Errorf("--only srv saw $(ref data) = %q, want %q", b, ref)
			}
			break
		}
		if time.Now().After(deadline) {
			t.Fatal("--only srv did not run its recipe")
		}
		time.Sleep(50 * time.Millisecond)
	}
	c.Process.Signal(syscall.SIGTERM)
	if err := c.Wait(); err != nil {
		t.Errorf("--only srv after SIGTERM: %v", err)
	}
}

// TestFailureRecords: a failed target keeps its reason and its output in
// the store, kiln why and kiln status print them, and kiln run exits 1
// whatever the stage's status was (before: the stage's status, and no
// record).
func TestFailureRecords(t *testing.T) {
	for _, tc := range []struct {
		name, spec, target string
		wantReason         string // in the reason
		wantLog            string // in the kept output
	}{
		{"exit 3", "bad:\n\techo boom-output\n\texit 3\n", "bad", "exit status 3", "[bad] boom-output"},
		{"exit 5 in a step", "STEPS = 1\nbad/$(step):\n\techo step-output\n\texit 5\n", "bad/1", "exit status 5", "[bad/1] step-output"},
		{"service never healthy", "srv: [service health=\"false\"]\n\techo srv-output; exit 4\nuser: srv\n\ttrue\n", "user",
			"service srv", "[srv] srv-output"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			f := newFixture(t)
			f.setSpec(tc.spec)
			_, errs, code := f.runErr("run")
			if code != 1 {
				t.Errorf("kiln run: exit %d, want 1\n%s", code, errs)
			}
			why, _ := f.run("why", tc.target)
			if !strings.Contains(why, "last failure ") || !strings.Contains(why, tc.wantReason) || !strings.Contains(why, tc.wantLog) {
				t.Errorf("kiln why %s lacks the failure (%q, %q):\n%s", tc.target, tc.wantReason, tc.wantLog, why)
			}
			status, _ := f.run("status")
			var row string
			for _, l := range strings.Split(status, "\n") {
				if strings.HasPrefix(l, tc.target+" ") {
					row = l
				}
			}
			if f := strings.Fields(row); len(f) < 2 || f[1] != "failed" || !strings.Contains(row, tc.wantReason) || !strings.Contains(row, "(log _pipelines/rl/logs/") {
				t.Errorf("kiln status row %q, want failed with the reason and the log\n%s", row, status)
			}
		})
	}
}

// TestFailureRecordCleared: a target that fails, then succeeds, has no
// failure left.
func TestFailureRecordCleared(t *testing.T) {
	f := newFixture(t)
	flag := filepath.Join(t.TempDir(), "ok")
	f.setSpec("t:\n\ttest -e " + flag + "\n")
	if _, _, code := f.runErr("run"); code != 1 {
		t.Fatalf("first run: exit %d, want 1", code)
	}
	os.WriteFile(flag, nil, 0o644)
	f.run("run")
	if why, _ := f.run("why", "t"); strings.Contains(why, "last failure") {
		t.Errorf("kiln why after a successful build still shows a failure:\n%s", why)
	}
}

// TestStatusSummary: kiln status --json and --summary give each target's
// step, wall time and its output's manifest metrics from the store.
func TestStatusSummary(t *testing.T) {
	f := newFixture(t)
	f.run("run", "STEPS=2")
	out, _ := f.run("status", "STEPS=2", "--json")
	type row struct {
		Target  string  `json:"target"`
		Step    int     `json:"step"`
		State   string  `json:"state"`
		Ref     string  `json:"ref"`
		Wall    float64 `json:"wall_s"`
		Outputs []struct {
			Ref     string         `json:"ref"`
			Rows    int64          `json:"rows"`
			Metrics map[string]any `json:"metrics"`
		} `json:"outputs"`
	}
	rows := map[string]row{}
	for _, l := range strings.Split(strings.TrimSpace(out), "\n") {
		var r row
		if err := json.Unmarshal([]byte(l), &r); err != nil {
			t.Fatalf("status --json line %q: %v", l, err)
		}
		rows[r.Target] = r
	}
	e := entries(t, f.store)
	r := rows["rollout/2"]
	if r.Step != 2 || r.State != "done" || r.Ref != e["rollout/2"].Ref || r.Wall <= 0 {
		t.Errorf("rollout/2: %+v, want step 2, done, ref %s, a wall time", r, e["rollout/2"].Ref)
	}
	if len(r.Outputs) != 1 || r.Outputs[0].Rows != 1 || r.Outputs[0].Metrics["rows_written"] != float64(1) {
		t.Errorf("rollout/2's outputs %+v, want one of 1 row with its manifest's metrics (rows_written 1)", r.Outputs)
	}
	if rows["base"].Step != -1 {
		t.Errorf("base: step %d, want -1 (not a step target)", rows["base"].Step)
	}
	sum, _ := f.run("status", "STEPS=2", "--summary")
	if !strings.Contains(sum, "STEP") || !containsLine(sum, "2 ", "rollout/2", "rollouts/2@", "rows_written=1") {
		t.Errorf("status --summary lacks rollout/2's step line:\n%s", sum)
	}
}

// containsLine reports whether a line of s starts with prefix and holds
// every part.
func containsLine(s, prefix string, parts ...string) bool {
	for _, l := range strings.Split(s, "\n") {
		ok := strings.HasPrefix(l, prefix)
		for _, p := range parts {
			ok = ok && strings.Contains(l, p)
		}
		if ok {
			return true
		}
	}
	return false
}

// TestLockStaleByStoreClock: a lock refreshed "in the future" (by a host
// whose clock runs ahead) still goes stale: staleness is the store's
// ModTime, not the writer's Refreshed. Before, it was never stale.
func TestLockStaleByStoreClock(t *testing.T) {
	f := newFixture(t)
	f.setSpec("t:\n\ttrue\n")
	st, _ := store.Open(f.store)
	future := time.Now().Add(time.Hour)
	b, _ := json.Marshal(pipelines.Lock{Host: "elsewhere", PID: 1, Time: future, Refreshed: future})
	if _, err := st.Put(context.Background(), pipelines.RecordPrefix+"rl/lock.json", bytes.NewReader(b), int64(len(b))); err != nil {
		t.Fatal(err)
	}
	if _, errs, code := f.runErr("run", "--lock-stale", "5s"); code == 0 || !strings.Contains(errs, "locked by another run") {
		t.Fatalf("a fresh lock was taken: exit %d\n%s", code, errs)
	}
	time.Sleep(700 * time.Millisecond)
	if _, errs, code := f.runErr("run", "--lock-stale", "500ms"); code != 0 {
		t.Fatalf("a lock last written 700ms ago (--lock-stale 500ms) was not taken: exit %d\n%s", code, errs)
	}
	// The run released it: a released lock is free.
	if _, errs, code := f.runErr("run", "--lock-stale", "1h"); code != 0 {
		t.Fatalf("the lock a finished run released was not free: exit %d\n%s", code, errs)
	}
}

// TestLockLost is issue 31's row: a run holding the lock is stopped
// (SIGSTOP) past --lock-stale, a second run takes the lock, the first is
// resumed. The first must stop its targets and exit 1 saying so, and must
// not remove the second's lock, so a third run is still refused. Before,
// the first only logged "refreshing the pipeline lock failed", kept
// running, and on exit deleted the second run's lock.
func TestLockLost(t *testing.T) {
	f := newFixture(t)
	dir := t.TempDir()
	// long: ran by both runs; its recipe records each start's pid.
	f.setSpec(`long:
	echo $$$$ >> ` + dir + `/long.pids
	sleep 4
after: long
	touch ` + dir + `/after.$$PPID
`)
	first := f.cmd("run", "--lock-stale", "600ms")
	var firstErr bytes.Buffer
	first.Stderr = &firstErr
	if err := first.Start(); err != nil {
		t.Fatal(err)
	}
	waitFile(t, filepath.Join(dir, "long.pids"))
	first.Process.Signal(syscall.SIGSTOP)
	time.Sleep(1200 * time.Millisecond)
	second := f.cmd("run", "--lock-stale", "600ms")
	var secondErr bytes.Buffer
	second.Stderr = &secondErr
	if err := second.Start(); err != nil {
		t.Fatal(err)
	}
	defer second.Wait()
	time.Sleep(500 * time.Millisecond) // the second takes the lock
	first.Process.Signal(syscall.SIGCONT)
	done := make(chan error, 1)
	go func() { done <- first.Wait() }()
	select {
	case err := <-done:
		var ee *exec.ExitError
		if !errors.As(err, &ee) || ee.ExitCode() != 1 {
			t.Errorf("the first run: %v, want exit 1\n%s", err, firstErr.String())
		}
		if !strings.Contains(firstErr.String(), "lost the pipeline lock") {
			t.Errorf("the first run did not say it lost the lock:\n%s", firstErr.String())
		}
	case <-time.After(3 * time.Second):
		first.Process.Kill()
		t.Fatalf("the first run kept running after losing its lock\n%s", firstErr.String())
	}
	// Its target's process group is gone: only the second run's long runs.
	pids, _ := os.ReadFile(filepath.Join(dir, "long.pids"))
	if p := strings.Fields(string(pids)); len(p) > 0 {
		var pid int
		json.Unmarshal([]byte(p[0]), &pid)
		if pid > 0 && syscall.Kill(pid, 0) == nil {
			t.Errorf("the first run's target (pid %d) still runs", pid)
		}
	}
	// The second run still holds its lock: a third is refused.
	_, errs, code := f.runErr("run", "--lock-stale", "600ms")
	if code == 0 || !strings.Contains(errs, "locked by another run") {
		t.Errorf("a third run beside the second: exit %d, want refused\n%s", code, errs)
	}
	if err := second.Wait(); err != nil {
		t.Errorf("the second run: %v\n%s", err, secondErr.String())
	}
	if m, _ := filepath.Glob(filepath.Join(dir, "after.*")); len(m) != 1 {
		t.Errorf("after ran %d times, want once (by the second run)", len(m))
	}
}

func waitFile(t *testing.T, path string) {
	t.Helper()
	deadline := time.Now().Add(20 * time.Second)
	for {
		if _, err := os.Stat(path); err == nil {
			return
		}
		if time.Now().After(deadline) {
			t.Fatalf("%s never appeared", path)
		}
		time.Sleep(20 * time.Millisecond)
	}
}
