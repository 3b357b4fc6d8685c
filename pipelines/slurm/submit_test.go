package slurm

import (
	"context"
	"fmt"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"testing"
	"time"

	"github.com/kilnrl/kiln/internal/testenv/slurmtest"
)

// waitSettled polls Query until no job of ids is active.
func waitSettled(t *testing.T, c *slurmtest.Cluster, ids map[string]string, limit time.Duration) map[string]State {
	t.Helper()
	var list []string
	for _, id := range ids {
		list = append(list, id)
	}
	deadline := time.Now().Add(limit)
	for {
		st, err := Query(context.Background(), list, QueryOptions{Env: c.Env})
		if err != nil {
			t.Fatal(err)
		}
		active := false
		for _, s := range st {
			active = active || s.Active()
		}
		if !active {
			return st
		}
		if time.Now().After(deadline) {
			t.Fatalf("jobs still active after %v: %v\n%s", limit, st, c.Logs())
		}
		time.Sleep(200 * time.Millisecond)
	}
}

// TestSubmitChain runs a dependency chain on a real one-node cluster: a
// 4-shard array (throttle 2) whose tasks each write a file, then a job
// that needs all four files, then one that needs that.
func TestSubmitChain(t *testing.T) {
	c := slurmtest.Start(t)
	dir := t.TempDir()
	os.Chmod(dir, 0o755)
	out := filepath.Join(dir, "out")
	os.MkdirAll(out, 0o755)
	jobs := []Job{
		{Name: "gather", After: []string{"shards"}, Script: fmt.Sprintf("cat %s/shard-* > %s/all\n", out, out)},
		{Name: "shards", Shards: 4, Throttle: 2, CPUs: 1, Script: fmt.Sprintf(
			`echo "$SLURM_ARRAY_TASK_ID $KILN_SHARD $SLURM_ARRAY_JOB_ID $SLURM_ARRAY_TASK_COUNT" > %s/shard-$KILN_SHARD`+"\n", out)},
		{Name: "last", After: []string{"gather"}, Script: fmt.Sprintf("test $(wc -l < %s/all) = 4 && touch %s/last\n", out, out)},
	}
	start := time.Now()
	ids, err := Submit(context.Background(), jobs, SubmitOptions{CompileOptions: CompileOptions{Dir: dir}, Env: c.Env})
	if err != nil {
		t.Fatal(err)
	}
	st := waitSettled(t, c, ids, 90*time.Second)
	t.Logf("chain of 3 jobs (one a 4-task array) ran in %v", time.Since(start).Round(time.Millisecond))
	for name, id := range ids {
		if st[id].State != "COMPLETED" {
			t.Errorf("%s (%s): %+v, want COMPLETED\n%s", name, id, st[id], c.Logs())
		}
	}
	arr := ids["shards"]
	for i := range 4 {
		data, err := os.ReadFile(filepath.Join(out, fmt.Sprintf("shard-%d", i)))
		if err != nil {
			t.Fatal(err)
		}
		if got, want := strings.TrimSpace(string(data)), fmt.Sprintf("%d %d %s 4", i, i, arr); got != want {
			t.Errorf("shard %d wrote %q, want %q (task id, shard, array job id, task count)", i, got, want)
		}
	}
	if _, err := os.Stat(filepath.Join(out, "last")); err != nil {
		t.Errorf("the last job of the chain did not run: %v", err)
	}
	// Slurm itself ran them as the tasks of one array job.
	if tasks := st[arr].Tasks; len(tasks) != 4 {
		t.Errorf("array %s tasks %v, want 4", arr, tasks)
	}
	shown, err := c.Command(context.Background(), "scontrol", "show", "job", arr).Output()
	if err != nil {
		t.Fatal(err)
	}
	for i := range 4 {
		if !strings.Contains(string(shown), fmt.Sprintf("ArrayJobId=%s ArrayTaskId=%d ", arr, i)) {
			t.Errorf("scontrol show job %s lacks array task %d:\n%s", arr, i, shown)
		}
	}
	// With accounting on (a site with slurmdbd) sacct must agree; the test
	// cluster has none.
	if acct, err := c.Command(context.Background(), "sacct", "-X", "-n", "-P", "-o", "JobID,State", "-j", arr).CombinedOutput(); err == nil && !strings.Contains(string(acct), "disabled") {
		for i := range 4 {
			if !strings.Contains(string(acct), fmt.Sprintf("%s_%d|COMPLETED", arr, i)) {
				t.Errorf("sacct lacks completed task %d:\n%s", i, acct)
			}
		}
	}
}

// TestSubmitFailureStopsDependents: a failing job's dependents are
// cancelled by Slurm (kill-on-invalid-dep), not left pending and not run;
// an independent job still runs. A resubmission of the broken tail, with
// the fix, completes.
func TestSubmitFailureStopsDependents(t *testing.T) {
	c := slurmtest.Start(t)
	dir := t.TempDir()
	os.Chmod(dir, 0o755)
	flag := filepath.Join(dir, "fixed")
	mark := func(n string) string { return fmt.Sprintf("touch %s/ran-%s\n", dir, n) }
	jobs := []Job{
		{Name: "ok", Script: mark("ok")},
		{Name: "bad", After: []string{"ok"}, Script: fmt.Sprintf("test -e %s\n", flag) + mark("bad")},
		{Name: "child", After: []string{"bad"}, Script: mark("child")},
		{Name: "grandchild", After: []string{"child"}, Script: mark("grandchild")},
		{Name: "side", After: []string{"ok"}, Script: mark("side")},
	}
	ids, err := Submit(context.Background(), jobs, SubmitOptions{CompileOptions: CompileOptions{Dir: dir}, Env: c.Env})
	if err != nil {
		t.Fatal(err)
	}
	st := waitSettled(t, c, ids, 90*time.Second)
	want := map[string]string{"ok": "COMPLETED", "bad": "FAILED", "child": "CANCELLED", "grandchild": "CANCELLED", "side": "COMPLETED"}
	for name, w := range want {
		if got := st[ids[name]]; got.State != w {
			t.Errorf("%s: %+v, want %s", name, got, w)
		}
	}
	if r := st[ids["child"]].Reason; r != "DependencyNeverSatisfied" {
		t.Errorf("child reason %q, want DependencyNeverSatisfied", r)
	}
	for _, n := range []string{"bad", "child", "grandchild"} {
		if _, err := os.Stat(filepath.Join(dir, "ran-"+n)); err == nil {
			t.Errorf("%s ran after its dependency failed", n)
		}
	}
	// Fix it and resubmit only the broken tail; "ok" is done, so the
	// tail does not wait on it.
	os.WriteFile(flag, nil, 0o644)
	var tail []Job
	for _, j := range jobs {
		if slices.Contains([]string{"bad", "child", "grandchild"}, j.Name) {
			tail = append(tail, j)
		}
	}
	ids2, err := Submit(context.Background(), tail, SubmitOptions{CompileOptions: CompileOptions{Dir: dir}, Env: c.Env})
	if err != nil {
		t.Fatal(err)
	}
	st = waitSettled(t, c, ids2, 90*time.Second)
	for name, id := range ids2 {
		if st[id].State != "COMPLETED" {
			t.Errorf("resubmitted %s: %+v, want COMPLETED", name, st[id])
		}
		if _, err := os.Stat(filepath.Join(dir, "ran-"+name)); err != nil {
			t.Errorf("resubmitted %s did not run", name)
		}
	}
}

// TestSubmitService: a service job starts, its users wait for its health
// check, reach it through the published host, and the stop job ends it
// with success after the last user.
func TestSubmitService(t *testing.T) {
	c := slurmtest.Start(t)
	dir := t.TempDir()
	os.Chmod(dir, 0o755)
	ready := filepath.Join(dir, "ready")
	jobs := []Job{
		{Name: "engine", Service: true, Health: "test -e " + ready,
			Script: fmt.Sprintf("sleep 2; hostname -s > %s; sleep 300\n", ready)},
		{Name: "use", After: []string{"engine"}, Script: fmt.Sprintf(`test "$KILN_SERVICE_ENGINE_HOST" = "$(cat %s)"; echo used > %s/used`+"\n", ready, dir)},
		{Name: "after-use", After: []string{"use"}, Script: fmt.Sprintf("test -e %s/used\n", dir)},
	}
	ids, err := Submit(context.Background(), jobs, SubmitOptions{CompileOptions: CompileOptions{Dir: dir, HealthTimeout: 60}, Env: c.Env})
	if err != nil {
		t.Fatal(err)
	}
	st := waitSettled(t, c, ids, 90*time.Second)
	for name, id := range ids {
		if st[id].State != "COMPLETED" {
			log, _ := os.ReadFile(filepath.Join(dir, "logs", name+"-"+id+".out"))
			t.Errorf("%s (%s): %+v, want COMPLETED\n%s", name, id, st[id], log)
		}
	}
	if _, ok := ids["engine.stop"]; !ok {
		t.Errorf("no stop job for the service: %v", ids)
	}
}

// TestSubmitServiceHealthWhereItRuns: a service's health check runs in the
// service's own job, where the service is reachable (here: only the
// service's job sees its job name), and its users wait for the host it
// publishes after that. Before, each user ran the health check on its own
// node, where a check on localhost never passes.
func TestSubmitServiceHealthWhereItRuns(t *testing.T) {
	c := slurmtest.Start(t)
	dir := t.TempDir()
	os.Chmod(dir, 0o755)
	jobs := []Job{
		{Name: "engine", Service: true, Health: `test "$SLURM_JOB_NAME" = engine -a "$KILN_SERVICE_ENGINE_HOST" = "$(hostname -s)"`,
			Script: "sleep 300\n"},
		{Name: "use", After: []string{"engine"}, Script: fmt.Sprintf(`test "$KILN_SERVICE_ENGINE_HOST" = "$(hostname -s)"; echo used > %s/used`+"\n", dir)},
	}
	ids, err := Submit(context.Background(), jobs, SubmitOptions{CompileOptions: CompileOptions{Dir: dir, HealthTimeout: 30}, Env: c.Env})
	if err != nil {
		t.Fatal(err)
	}
	st := waitSettled(t, c, ids, 90*time.Second)
	for name, id := range ids {
		if st[id].State != "COMPLETED" {
			log, _ := os.ReadFile(filepath.Join(dir, "logs", name+"-"+id+".out"))
			t.Errorf("%s (%s): %+v, want COMPLETED\n%s", name, id, st[id], log)
		}
	}
	if _, err := os.Stat(filepath.Join(dir, "used")); err != nil {
		t.Errorf("the user did not run: %v", err)
	}
}
