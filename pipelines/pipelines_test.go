package pipelines_test

import (
	"bytes"
	"context"
	"encoding/json"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"sort"
	"strconv"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/kilnrl/kiln/formats/store"
	"github.com/kilnrl/kiln/internal/kilncmd"
	"github.com/kilnrl/kiln/internal/stagecmd"
	"github.com/kilnrl/kiln/pipelines"
)

// TestMain doubles as the kiln binary: recipes call "kiln", a link to
// this test binary, which then runs kiln's commands.
func TestMain(m *testing.M) {
	if os.Getenv("KILN_TEST_AS_KILN") == "1" {
		env := &stagecmd.Env{Stdout: os.Stdout, Stderr: os.Stderr, Log: stagecmd.NewLogger(os.Stderr, false)}
		os.Exit(stagecmd.Main(kilncmd.App(env), os.Args, os.Stderr))
	}
	os.Exit(m.Run())
}

// kilnEnv puts a "kiln" link to this binary first on PATH.
func kilnEnv(t *testing.T) (bin string) {
	t.Helper()
	dir := t.TempDir()
	exe, err := os.Executable()
	if err != nil {
		t.Fatal(err)
	}
	if err := os.Symlink(exe, filepath.Join(dir, "kiln")); err != nil {
		t.Fatal(err)
	}
	t.Setenv("PATH", dir+string(os.PathListSeparator)+os.Getenv("PATH"))
	t.Setenv("KILN_TEST_AS_KILN", "1")
	return filepath.Join(dir, "kiln")
}

type fixture struct {
	t     *testing.T
	kiln  string
	store string
	spec  string
}

func newFixture(t *testing.T) *fixture {
	f := &fixture{t: t, kiln: kilnEnv(t), store: t.TempDir()}
	spec, err := os.ReadFile("testdata/rl.kiln")
	if err != nil {
		t.Fatal(err)
	}
	f.spec = filepath.Join(t.TempDir(), "rl.kiln")
	if err := os.WriteFile(f.spec, spec, 0o644); err != nil {
		t.Fatal(err)
	}
	return f
}

func (f *fixture) cmd(args ...string) *exec.Cmd {
	c := exec.Command(f.kiln, append(args[:1:1], append([]string{f.spec, "--store", f.store}, args[1:]...)...)...)
	return c
}

func (f *fixture) run(args ...string) (stdout, stderr string) {
	f.t.Helper()
	c := f.cmd(args...)
	var o, e bytes.Buffer
	c.Stdout, c.Stderr = &o, &e
	if err := c.Run(); err != nil {
		f.t.Fatalf("kiln %v: %v\n%s", args, err, e.String())
	}
	return o.String(), e.String()
}

func (f *fixture) plan(vars ...string) map[string]string {
	f.t.Helper()
	out, _ := f.run(append([]string{"plan"}, vars...)...)
	m := map[string]string{}
	for _, l := range strings.Split(strings.TrimSpace(out), "\n") {
		state, rest, _ := strings.Cut(l, " ")
		name, why, _ := strings.Cut(strings.TrimSpace(rest), ": ")
		m[name] = state + " " + why
	}
	return m
}

func ran(stderr string) []string {
	var out []string
	for _, l := range strings.Split(stderr, "\n") {
		if strings.Contains(l, "msg=start target=") {
			out = append(out, strings.TrimPrefix(l[strings.Index(l, "target="):], "target="))
		}
	}
	sort.Strings(out)
	return out
}

func entries(t *testing.T, storeDir string) map[string]pipelines.Entry {
	t.Helper()
	st, err := store.Open(storeDir)
	if err != nil {
		t.Fatal(err)
	}
	m := map[string]pipelines.Entry{}
	err = st.List(context.Background(), pipelines.RecordPrefix+"rl/targets/", func(info store.Info) error {
		b, _, err := store.ReadAll(context.Background(), st, info.Key)
		if err != nil {
			return err
		}
		var e pipelines.Entry
		if err := json.Unmarshal(b, &e); err != nil {
			return err
		}
		m[e.Target] = e
		return nil
	})
	if err != nil {
		t.Fatal(err)
	}
	return m
}

func TestRunTwiceAndChangeVariable(t *testing.T) {
	f := newFixture(t)
	out, errs := f.run("run", "-j", "2")
	if got := ran(errs); len(got) != 8 {
		t.Fatalf("first run ran %v, want all 8 targets", got)
	}
	if !strings.HasPrefix(lastLineOf(out), "weights/3@") {
		t.Fatalf("last stdout line %q, want weights/3's ref", out)
	}
	_, errs = f.run("run", "-j", "2")
	if got := ran(errs); len(got) != 0 {
		t.Fatalf("second run ran %v, want nothing", got)
	}
	// AGENT.2 only affects rollout/2, and through it train/2 and train/3
	// (rollout/3 uses train/1).
	p := f.plan("AGENT.2=other")
	if p["rollout/2"] != `run variable AGENT.2 changed: "default" -> "other"` {
		t.Errorf("plan says rollout/2: %q", p["rollout/2"])
	}
	for _, n := range []string{"base", "train/0", "rollout/1", "train/1", "rollout/3"} {
		if !strings.HasPrefix(p[n], "done") {
			t.Errorf("plan says %s: %q, want done", n, p[n])
		}
	}
	_, errs = f.run("run", "AGENT.2=other")
	if got, want := strings.Join(ran(errs), " "), "rollout/2 train/2 train/3"; got != want {
		t.Errorf("after changing AGENT.2 ran %q, want %q", got, want)
	}
}

func lastLineOf(s string) string {
	l := strings.Split(strings.TrimSpace(s), "\n")
	return l[len(l)-1]
}

func finalRefs(t *testing.T, storeDir string) map[string]string {
	m := map[string]string{}
	for k, e := range entries(t, storeDir) {
		m[k] = e.Ref
	}
	return m
}

// TestKillAndResume kills a run (SIGKILL to its process group) once k
// targets are recorded done, and resumes it. The kill must land mid-run,
// some targets done and some not, or the test proves nothing: it waits
// for the record rather than for a wall-clock delay, and fails when the
// kill found the run finished or not yet started.
func TestKillAndResume(t *testing.T) {
	ref := newFixture(t)
	ref.run("run")
	want := finalRefs(t, ref.store)
	for _, k := range []int{1, 3, 6} {
		t.Run(fmt.Sprintf("after %d done", k), func(t *testing.T) {
			f := newFixture(t)
			c := f.cmd("run", "SLEEP=0.2")
			c.SysProcAttr = &syscall.SysProcAttr{Setpgid: true}
			if err := c.Start(); err != nil {
				t.Fatal(err)
			}
			exited := make(chan error, 1)
			go func() { exited <- c.Wait() }()
			waitDone(t, f.store, k, exited)
			_ = syscall.Kill(-c.Process.Pid, syscall.SIGKILL)
			<-exited
			// Done is what the record's done entries say: a kill between a
			// target's done entry and its last entry leaves it done, and
			// entries (which reads the last entries) short of it.
			before := 0
			for _, v := range f.plan("SLEEP=0.2") {
				if strings.HasPrefix(v, "done ") {
					before++
				}
			}
			if before < max(k, 1) || before >= 8 {
				t.Fatalf("the kill did not land mid-run: %d of 8 targets done after it, want %d to 7", before, max(k, 1))
			}
			_, errs := f.run("run", "SLEEP=0.2")
			if n := len(ran(errs)); n != 8-before {
				t.Errorf("killed after %d targets; resume ran %d, want %d", before, n, 8-before)
			}
			// SLEEP is not in the recipes' refs... it is: the keys differ
			// from the reference run's, but the data must not.
			got := finalRefs(t, f.store)
			for k, v := range want {
				if got[k] != v {
					t.Errorf("%s: resumed %s, uninterrupted %s", k, got[k], v)
				}
			}
		})
	}
}

// waitDone waits until the pipeline rl's record in storeDir holds n done
// entries; it fails the test when the run exits first.
func waitDone(t *testing.T, storeDir string, n int, exited <-chan error) {
	t.Helper()
	st, err := store.Open(storeDir)
	if err != nil {
		t.Fatal(err)
	}
	deadline := time.Now().Add(30 * time.Second)
	for {
		done := 0
		err := st.List(context.Background(), pipelines.RecordPrefix+"rl/done/", func(info store.Info) error {
			if strings.HasSuffix(info.Key, ".json") {
				done++
			}
			return nil
		})
		if err == nil && done >= n {
			return
		}
		select {
		case err := <-exited:
			t.Fatalf("the run exited (%v) before %d targets were done (%d were)", err, n, done)
		case <-time.After(5 * time.Millisecond):
		}
		if time.Now().After(deadline) {
			t.Fatalf("%d targets done after 30 s, want %d", done, n)
		}
	}
}

// TestSettleLast is the kill between record.write's two Puts, made
// deterministic: the next run restores the target's last entry from its
// done entry, and leaves a newer last entry alone.
func TestSettleLast(t *testing.T) {
	f := newFixture(t)
	f.run("run")
	want := entries(t, f.store)
	st, err := store.Open(f.store)
	if err != nil {
		t.Fatal(err)
	}
	ctx := context.Background()
	if err := st.Delete(ctx, pipelines.RecordPrefix+"rl/targets/train/3.json"); err != nil {
		t.Fatal(err)
	}
	if p := f.plan()["train/3"]; !strings.HasPrefix(p, "done ") {
		t.Fatalf("plan says train/3: %q, want done (its done entry is there)", p)
	}
	_, errs := f.run("run")
	if got := ran(errs); len(got) != 0 {
		t.Errorf("run ran %v, want nothing", got)
	}
	got := entries(t, f.store)["train/3"]
	if got.Key != want["train/3"].Key || got.Ref != want["train/3"].Ref || !got.End.Equal(want["train/3"].End) {
		t.Errorf("train/3's last entry after the run: %+v, want %+v", got, want["train/3"])
	}

	// A build of another key, then back: rollout/2's last entry stays the
	// newer build, so kiln why words from it.
	f.run("run", "AGENT.2=other")
	other := entries(t, f.store)["rollout/2"]
	if other.Key == want["rollout/2"].Key {
		t.Fatalf("AGENT.2=other built rollout/2 with the same key")
	}
	_, errs = f.run("run")
	if got := ran(errs); len(got) != 0 {
		t.Errorf("back to AGENT.2=default ran %v, want nothing (all recorded)", got)
	}
	if got := entries(t, f.store)["rollout/2"]; got.Key != other.Key {
		t.Errorf("rollout/2's last entry is key %s, want the newer build's %s", got.Key[:12], other.Key[:12])
	}
}

func TestStaleness(t *testing.T) {
	for _, tc := range []struct {
		staleness string
		overlap   bool
		uses      func(k int) int
	}{
		{"1", true, func(k int) int { return max(k-2, 0) }},
		{"0", false, func(k int) int { return k - 1 }},
	} {
		t.Run("STALENESS="+tc.staleness, func(t *testing.T) {
			f := newFixture(t)
			f.run("run", "-j", "2", "SLEEP=0.3", "STALENESS="+tc.staleness, "STEPS=4")
			e := entries(t, f.store)
			overlaps := 0
			for k := 1; k < 4; k++ {
				tr, ro := e[fmt.Sprintf("train/%d", k)], e[fmt.Sprintf("rollout/%d", k+1)]
				if tr.Start.Before(ro.End) && ro.Start.Before(tr.End) {
					overlaps++
				}
			}
			if tc.overlap && overlaps == 0 {
				t.Errorf("train/k and rollout/k+1 never overlapped")
			}
			if !tc.overlap && overlaps > 0 {
				t.Errorf("%d train/k, rollout/k+1 pairs overlapped with STALENESS=0", overlaps)
			}
			for k := 1; k <= 4; k++ {
				ro := e[fmt.Sprintf("rollout/%d", k)]
				w := fmt.Sprintf("train/%d", tc.uses(k))
				if len(ro.Inputs) != 1 || ro.Inputs[0][0] != w || ro.Inputs[0][1] != e[w].Ref {
					t.Errorf("rollout/%d inputs %v, want %s = %s", k, ro.Inputs, w, e[w].Ref)
				}
			}
		})
	}
}

func TestLockCollides(t *testing.T) {
	f := newFixture(t)
	c := f.cmd("run", "SLEEP=1")
	if err := c.Start(); err != nil {
		t.Fatal(err)
	}
	defer c.Wait()
	time.Sleep(300 * time.Millisecond)
	c2 := f.cmd("run", "SLEEP=1")
	out, err := c2.CombinedOutput()
	if err == nil || !strings.Contains(string(out), "locked by another run") {
		t.Errorf("second run: %v\n%s", err, out)
	}
}

// TestShardsServicesOnly: a 3-shard target runs each shard with
// KILN_SHARD; a service is up (health passes) while its user runs and is
// stopped after; --only runs one target whose prerequisites are done.
func TestShardsServicesOnly(t *testing.T) {
	f := newFixture(t)
	dir := t.TempDir()
	src := `srv: [service health="test -f ` + dir + `/up"]
	touch ` + dir + `/up; trap 'rm -f ` + dir + `/up; exit 0' TERM; while :; do sleep 0.05; done
a: [shards=3] srv
	test -f ` + dir + `/up
	echo "$(shard)/$(shards)" > ` + dir + `/shard.$$KILN_SHARD
b: a
	echo b > ` + dir + `/b
`
	if err := os.WriteFile(f.spec, []byte(src), 0o644); err != nil {
		t.Fatal(err)
	}
	f.run("run", "a")
	for i := 0; i < 3; i++ {
		b, err := os.ReadFile(filepath.Join(dir, fmt.Sprintf("shard.%d", i)))
		if err != nil || strings.TrimSpace(string(b)) != fmt.Sprintf("%d/3", i) {
			t.Errorf("shard %d wrote %q (%v)", i, b, err)
		}
	}
	time.Sleep(200 * time.Millisecond)
	if _, err := os.Stat(filepath.Join(dir, "up")); err == nil {
		t.Errorf("service still up after its last user")
	}
	f.run("run", "--only", "b")
	if _, err := os.Stat(filepath.Join(dir, "b")); err != nil {
		t.Errorf("--only b did not run b: %v", err)
	}
	p := f.plan()
	if !strings.HasPrefix(p["b"], "done") || !strings.HasPrefix(p["srv"], "done") {
		t.Errorf("plan after: %v", p)
	}
}

// A service starts once its prerequisites are done and the run builds
// something, while other targets run, not when its first user does; and a
// rerun with every target done starts none (pipelines/README.md §4).
func TestServiceStartsBesideOtherTargets(t *testing.T) {
	f := newFixture(t)
	dir := t.TempDir()
	src := `prep:
	echo prep > ` + dir + `/prep
srv: [service health="test -f ` + dir + `/up"]
	date +%s.%N > ` + dir + `/srv.start; touch ` + dir + `/up; trap 'rm -f ` + dir + `/up; exit 0' TERM; while :; do sleep 0.05; done
slow: prep
	sleep 1.5; date +%s.%N > ` + dir + `/slow.end
user: srv slow
	test -f ` + dir + `/up
`
	if err := os.WriteFile(f.spec, []byte(src), 0o644); err != nil {
		t.Fatal(err)
	}
	f.run("run", "-j", "1", "user")
	read := func(name string) float64 {
		b, err := os.ReadFile(filepath.Join(dir, name))
		if err != nil {
			t.Fatal(err)
		}
		v, err := strconv.ParseFloat(strings.TrimSpace(string(b)), 64)
		if err != nil {
			t.Fatal(err)
		}
		return v
	}
	if started, slowEnd := read("srv.start"), read("slow.end"); started >= slowEnd {
		t.Errorf("the service started at %.2f, after slow ended at %.2f: it waited for its user", started, slowEnd)
	}
	// srv has no prerequisites: it is ready before its user is found done
	if _, e := f.run("run", "user"); strings.Contains(e, "starting service") {
		t.Errorf("a rerun with nothing to do started the service:\n%s", e)
	}
}
