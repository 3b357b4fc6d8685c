package pipelines_test

import (
	"context"
	"errors"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/kilnrl/kiln/formats/dataset"
	"github.com/kilnrl/kiln/formats/store"
)

// TestOnlyShardAndService is what Slurm jobs run: kiln run --only T
// --shard N runs one shard (an array task) and the target is done only
// when every shard has committed its part of the one version; --only on a
// service runs it in the foreground until SIGTERM, never recorded done,
// and a user run finds it healthy and does not start another.
func TestOnlyShardAndService(t *testing.T) {
	f := newFixture(t)
	dir := t.TempDir()
	src := `data: [shards=3]
	for i in 0 1 2 3 4 5; do printf '{"prompt":"row %s","label":"s%s","metadata":{}}\n' $$i $$i; done > $$KILN_TMPDIR/in.jsonl
	echo $(shard) >> ` + dir + `/shards
	kiln import tasks --shard $(shard)/$(shards) --out data $$KILN_TMPDIR/in.jsonl
srv: [service health="test -f ` + dir + `/up"]
	trap 'rm -f ` + dir + `/up; exit 0' TERM; echo $$$$ > ` + dir + `/up; while :; do sleep 0.05; done
use: data srv
	echo "$(ref data)" > ` + dir + `/use
`
	if err := os.WriteFile(f.spec, []byte(src), 0o644); err != nil {
		t.Fatal(err)
	}
	for i, shard := range []string{"0", "2", "1"} {
		f.run("run", "--only", "data", "--shard", shard)
		want := "run"
		if i == 2 {
			want = "done"
		}
		if p := f.plan(); !strings.HasPrefix(p["data"], want) {
			t.Fatalf("after shard %s, plan says data %q, want %s", shard, p["data"], want)
		}
	}
	if b, _ := os.ReadFile(filepath.Join(dir, "shards")); string(b) != "0\n2\n1\n" {
		t.Errorf("shards ran %q, want 0, 2, 1 once each", b)
	}
	st, err := store.Open(f.store)
	if err != nil {
		t.Fatal(err)
	}
	v, err := dataset.Open(context.Background(), st, dataset.Ref{Name: "data"})
	if err != nil || v.Parts != 3 || v.Rows != 6 {
		t.Fatalf("data: %v, want one version of 3 parts and 6 rows (%+v)", err, v)
	}
	if e := entries(t, f.store)["data"]; e.Ref != v.Ref().String() {
		t.Errorf("the record says data is %q, the store %s", e.Ref, v.Ref())
	}
	for _, bad := range [][]string{{"run", "--only", "data", "--shard", "3"}, {"run", "--shard", "0"}} {
		out, err := f.cmd(bad...).CombinedOutput()
		var ee *exec.ExitError
		if !errors.As(err, &ee) || ee.ExitCode() != 2 || !strings.Contains(string(out), "--shard") {
			t.Errorf("kiln %v: %v, want a usage error (exit 2) naming --shard\n%s", bad, err, out)
		}
	}

	// The service in the foreground, as its Slurm job runs it.
	srv := f.cmd("run", "--only", "srv")
	if err := srv.Start(); err != nil {
		t.Fatal(err)
	}
	exited := make(chan error, 1)
	go func() { exited <- srv.Wait() }()
	up := filepath.Join(dir, "up")
	deadline := time.Now().Add(20 * time.Second)
	for {
		if _, err := os.Stat(up); err == nil {
			break
		}
		if time.Now().After(deadline) {
			t.Fatal("kiln run --only srv did not start the service")
		}
		time.Sleep(20 * time.Millisecond)
	}
	pid, _ := os.ReadFile(up)
	_, errs := f.run("run", "--only", "use")
	if !strings.Contains(errs, "service already healthy") {
		t.Errorf("the user's run did not use the running service:\n%s", errs)
	}
	if b, _ := os.ReadFile(up); string(b) != string(pid) {
		t.Errorf("the service's marker changed (%q -> %q): the user's run started or stopped it", pid, b)
	}
	if b, _ := os.ReadFile(filepath.Join(dir, "use")); strings.TrimSpace(string(b)) != v.Ref().String() {
		t.Errorf("use saw %q, want %s", b, v.Ref())
	}
	select {
	case err := <-exited:
		t.Fatalf("the service's run ended before SIGTERM: %v", err)
	default:
	}
	srv.Process.Signal(syscall.SIGTERM)
	select {
	case err := <-exited:
		if err != nil {
			t.Errorf("the service's run after SIGTERM: %v, want exit 0", err)
		}
	case <-time.After(10 * time.Second):
		srv.Process.Kill()
		t.Fatal("the service's run did not end on SIGTERM")
	}
	if _, err := os.Stat(up); err == nil {
		t.Error("the service was not stopped (its TERM trap did not run)")
	}
	if p := f.plan(); !strings.HasPrefix(p["use"], "done") {
		t.Errorf("plan after: %v", p)
	}
}
