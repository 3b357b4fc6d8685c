package slurm

import (
	"bytes"
	"context"
	"fmt"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/urfave/cli/v2"

	"github.com/kilnrl/kiln/internal/stagecmd"
	"github.com/kilnrl/kiln/internal/testenv/slurmtest"
)

// markerPlanner is the unit test's planner: a fixed DAG whose targets are
// done when DIR/done/NAME exists; the run line writes it after the
// target's script succeeded, as kiln run --only records a target in the
// store. (The end-to-end test with the real planner and kiln run is
// TestKilnSlurmPipeline.)
func markerPlanner(dir string, targets []Target) Planner {
	return func(ctx context.Context, c *cli.Context, file string, goals []string, vars map[string]string) ([]Target, error) {
		out := make([]Target, len(targets))
		for i, t := range targets {
			_, err := os.Stat(filepath.Join(dir, "done", t.Name))
			t.Done = err == nil
			out[i] = t
		}
		return out, nil
	}
}

func TestSlurmAndStatusCommands(t *testing.T) {
	c := slurmtest.Start(t)
	t.Setenv("SLURM_CONF", c.Conf)
	dir := t.TempDir()
	os.Chmod(dir, 0o755)
	os.MkdirAll(filepath.Join(dir, "done"), 0o755)
	fix := filepath.Join(dir, "fixed")
	scripts := map[string]string{
		"shards": `echo $SLURM_ARRAY_TASK_ID > ` + dir + `/shard-$KILN_SHARD`,
		"engine": `touch ` + dir + `/engine-up; sleep 300`,
		"gen":    `test -e ` + dir + `/engine-up && ls ` + dir + `/shard-* | wc -l | grep -qx 4`,
		"bad":    `test -e ` + fix,
		"final":  `true`,
	}
	targets := []Target{
		{Name: "shards", Shards: 4, Throttle: 2},
		{Name: "engine", Service: true, Health: "test -e " + dir + "/engine-up"},
		{Name: "gen", Deps: []string{"shards", "engine"}},
		{Name: "bad", Deps: []string{"gen"}},
		{Name: "final", Deps: []string{"bad"}},
	}
	o := Options{
		Plan: markerPlanner(dir, targets),
		RunLine: func(file, store string, tg Target, vars map[string]string) string {
			if tg.Service {
				return scripts[tg.Name]
			}
			done := filepath.Join(dir, "done", tg.Name)
			if tg.Shards > 0 {
				// One marker when every task has written its own.
				return fmt.Sprintf("%s\ntouch %s.$KILN_SHARD\n[ $(ls %s.* | wc -l) = %d ] && touch %s || true", scripts[tg.Name], done, done, tg.Shards, done)
			}
			return scripts[tg.Name] + "\ntouch " + done
		},
	}
	kiln := func(args ...string) string {
		t.Helper()
		var out, errb bytes.Buffer
		env := &stagecmd.Env{Stdout: &out, Stderr: &errb, Log: stagecmd.NewLogger(&errb, false)}
		app := env.App(&cli.App{Name: "kiln", Commands: Commands(env, o)})
		if code := stagecmd.Main(app, append([]string{"kiln"}, args...), &errb); code != 0 {
			t.Fatalf("kiln %v: exit %d\n%s%s", args, code, out.String(), errb.String())
		}
		return out.String()
	}
	file := filepath.Join(dir, "p.kiln")
	os.WriteFile(file, nil, 0o644)
	run := filepath.Join(dir, "run")
	status := func() map[string]string {
		states := map[string]string{}
		for _, line := range strings.Split(kiln("status", file, "--dir", run), "\n")[1:] {
			if f := strings.Fields(line); len(f) >= 2 {
				states[f[0]] = f[1]
			}
		}
		return states
	}
	waitStates := func(want map[string]string) {
		t.Helper()
		deadline := time.Now().Add(90 * time.Second)
		for {
			got := status()
			ok := true
			for k, v := range want {
				ok = ok && got[k] == v
			}
			if ok {
				return
			}
			if time.Now().After(deadline) {
				t.Fatalf("status %v, want %v\n%s", got, want, c.Logs())
			}
			time.Sleep(300 * time.Millisecond)
		}
	}

	// --dry-run writes the scripts and submits nothing.
	dry := filepath.Join(dir, "dry")
	kiln("slurm", file, "--dir", run, "--dry-run", dry)
	if order, err := os.ReadFile(filepath.Join(dry, "submit.order")); err != nil || !strings.Contains(string(order), "gen.sbatch afterok=shards after=engine") {
		t.Fatalf("dry run order %q, %v", order, err)
	}
	if got := status(); got["gen"] != "missing" {
		t.Fatalf("after --dry-run, gen is %q, want missing", got["gen"])
	}

	kiln("slurm", file, "--dir", run)
	waitStates(map[string]string{"shards": "done", "gen": "done", "bad": "failed", "final": "cancelled"})
	if _, err := os.Stat(filepath.Join(dir, "done", "final")); err == nil {
		t.Fatal("final ran though bad failed")
	}

	// Fix it; the second kiln slurm resubmits only bad and final.
	os.WriteFile(fix, nil, 0o644)
	out := kiln("slurm", file, "--dir", run)
	var names []string
	for _, line := range strings.Split(strings.TrimSpace(out), "\n") {
		names = append(names, strings.Fields(line)[0])
	}
	if got := strings.Join(names, " "); got != "bad final" {
		t.Errorf("the resubmission submitted %q, want \"bad final\"", got)
	}
	waitStates(map[string]string{"shards": "done", "gen": "done", "bad": "done", "final": "done"})
	if out := kiln("slurm", file, "--dir", run); out != "" {
		t.Errorf("a third kiln slurm submitted %q, want nothing", out)
	}
}
