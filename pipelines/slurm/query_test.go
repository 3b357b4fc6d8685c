package slurm

import (
	"context"
	"os"
	"path/filepath"
	"testing"
)

// TestQueryAggregates runs Query on canned squeue and sacct output (fake
// commands, unit test only; the real ones are in submit_test.go): an
// array's state is its worst task's, a job squeue forgot comes from sacct,
// "CANCELLED by 0" is CANCELLED, and a job neither knows is UNKNOWN.
func TestQueryAggregates(t *testing.T) {
	dir := t.TempDir()
	squeue := filepath.Join(dir, "squeue")
	sacct := filepath.Join(dir, "sacct")
	os.WriteFile(squeue, []byte(`#!/bin/sh
case "$*" in *"-j 1,2,3,4,5"*) exit 1;; esac
case "$*" in
*"-j 1") printf '1_0|COMPLETED|None\n1_1|FAILED|NonZeroExitCode\n1_2|PENDING|JobArrayTaskLimit\n' ;;
*"-j 2") printf '2_0|COMPLETED|None\n2_1|RUNNING|None\n' ;;
*"-j 3") printf '3|CANCELLED|DependencyNeverSatisfied\n' ;;
*) echo "slurm_load_jobs error: Invalid job id specified" >&2; exit 1 ;;
esac
`), 0o755)
	os.WriteFile(sacct, []byte(`#!/bin/sh
printf '4|CANCELLED by 0|None\n'
`), 0o755)
	st, err := Query(context.Background(), []string{"1", "2", "3", "4", "5"}, QueryOptions{Squeue: squeue, Sacct: sacct})
	if err != nil {
		t.Fatal(err)
	}
	want := map[string]string{"1": "FAILED", "2": "RUNNING", "3": "CANCELLED", "4": "CANCELLED", "5": "UNKNOWN"}
	for id, w := range want {
		if st[id].State != w {
			t.Errorf("job %s: %+v, want %s", id, st[id], w)
		}
	}
	if len(st["1"].Tasks) != 3 || st["1"].Tasks[1] != "FAILED" {
		t.Errorf("job 1 tasks %v", st["1"].Tasks)
	}
	if st["3"].Reason != "DependencyNeverSatisfied" {
		t.Errorf("job 3 reason %q", st["3"].Reason)
	}
	if !st["2"].Active() || st["1"].Active() {
		t.Error("Active: want job 2 active, job 1 not")
	}
}
