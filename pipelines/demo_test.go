package pipelines_test

import (
	"bytes"
	"context"
	"encoding/json"
	"net"
	"os"
	"os/exec"
	"path/filepath"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/kilnrl/kiln/fixtures"
	"github.com/kilnrl/kiln/formats/dataset"
	"github.com/kilnrl/kiln/formats/records"
	"github.com/kilnrl/kiln/formats/store"
	"github.com/kilnrl/kiln/internal/sandbox/sandboxtest"
	"github.com/kilnrl/kiln/internal/testenv"
	"github.com/kilnrl/kiln/internal/testenv/gputest"
	"github.com/kilnrl/kiln/pipelines"
)

// TestDemo runs the shipped demo.kiln (make demo's pipeline) end to end
// with STEPS=2 on the real stage binaries, in a temporary DEMO directory:
// the tiny checkpoint, serve.py as the engine service, the shell agent in
// bwrap sandboxes over the fixture bundles, grading, GRPO advantages, CPU
// training and kiln-sync between the steps (2 samples a task, not the
// demo's 4, to stay within minutes on a loaded machine). Then:
//
//   - kiln status --table has a done row for each step, with the rollouts
//     run and the weights number they sampled from (1, then 2);
//   - step 2's rollouts record the weights weights/2 (step 1's sync)
//     published from train/1's checkpoint;
//   - a rerun runs nothing and says so, and writes no record;
//   - STEPS=3 would run only step 3's targets (kiln plan).
//
// Needs root and bwrap, the gpu venv and the Qwen3 tokenizer; skips
// without them, fails under CI=true.
func TestDemo(t *testing.T) {
	if testing.Short() {
		t.Skip("runs two RL steps on the real stages")
	}
	ge := gputest.Find(t)
	sandboxtest.Require(t)
	home, _ := os.UserHomeDir()
	if os.Getenv("KILN_QWEN3_TOKENIZER") == "" {
		if _, err := os.Stat(filepath.Join(home, ".cache", "kiln", "qwen3-tokenizer-current")); err != nil {
			testenv.SkipOrFail(t, "no Qwen3 tokenizer (~/.cache/kiln/qwen3-tokenizer-current): run scripts/install-gpu-deps.sh")
		}
	}
	ctx := context.Background()
	set, err := fixtures.Load(ctx)
	if err != nil {
		t.Fatal(err)
	}
	if filepath.Base(set.MiMoDir) != "mimo" || set.Layout != filepath.Join(filepath.Dir(set.MiMoDir), "oci") {
		t.Fatalf("fixtures: mimo %s and oci %s are not FIXTURES/mimo and FIXTURES/oci, as demo.kiln (and make demo) assume", set.MiMoDir, set.Layout)
	}
	demo := t.TempDir()
	bin := filepath.Join(demo, "bin")
	start := time.Now()
	build := exec.Command("go", "build", "-ldflags=-s -w", "-o", bin+"/", "../cmd/...")
	build.Env = append(os.Environ(), "CGO_ENABLED=0")
	if out, err := build.CombinedOutput(); err != nil {
		t.Fatalf("go build ../cmd/...: %v\n%s", err, out)
	}
	t.Logf("built ./cmd/... in %v", time.Since(start).Round(time.Second))
	storeDir := filepath.Join(demo, "data")
	spec, err := filepath.Abs("demo.kiln")
	if err != nil {
		t.Fatal(err)
	}
	// The fixture bundles the other sandbox tests share (unpacked once per
	// machine), not DEMO/bundles: the images target still runs (and finds
	// them unpacked).
	vars := []string{"DEMO=" + demo, "FIXTURES=" + filepath.Dir(set.MiMoDir),
		"BUNDLES=" + filepath.Join(home, ".cache", "kiln", "grade-test-bundles-"+fixtures.GeneratorVersion),
		"PYTHON=" + ge.Python, "GPU_DIR=" + ge.Dir, "ENGINE_PORT=" + strconv.Itoa(demoPort(t)),
		"SAMPLES=2", "TRAIN_BATCH=8", "MAX_TOKENS=16"}
	env := append(os.Environ(), "PATH="+bin+string(os.PathListSeparator)+os.Getenv("PATH"))
	kiln := func(args ...string) (string, string) {
		t.Helper()
		cmd := exec.Command(filepath.Join(bin, "kiln"), append([]string{"--store", storeDir}, args...)...)
		cmd.Env = env
		var out, errb bytes.Buffer
		cmd.Stdout, cmd.Stderr = &out, &errb
		if err := cmd.Run(); err != nil {
			t.Fatalf("kiln %s: %v\n%s\n%s", strings.Join(args[:2], " "), err, out.String(), lastLinesOf(errb.String(), 80))
		}
		return out.String(), errb.String()
	}
	with := func(args ...string) []string { return append(append(args, "STEPS=2"), vars...) }

	start = time.Now()
	kiln(with("run", spec)...)
	t.Logf("kiln run demo.kiln STEPS=2: %v", time.Since(start).Round(time.Second))

	// The table: a done row per step.
	table, _ := kiln(with("status", spec, "--table")...)
	t.Logf("kiln status --table:\n%s", table)
	rows := tableRows(t, table)
	for step, weights := range map[string]string{"1": "1", "2": "2"} {
		r, ok := rows[step]
		if !ok {
			t.Errorf("the table has no row for step %s", step)
			continue
		}
		for col, want := range map[string]string{"STATE": "done", "ROLLOUTS": "8", "ABORTED": "0", "WEIGHTS": weights} {
			if r[col] != want {
				t.Errorf("step %s: %s = %q, want %q", step, col, r[col], want)
			}
		}
		for _, col := range []string{"PASS", "REWARD", "SEGMENTS", "TRAINED_TOKENS", "LOSS", "LOGPROB_DIFF", "rollout", "train"} {
			if r[col] == "" || r[col] == "-" {
				t.Errorf("step %s: no %s in the table", step, col)
			}
		}
	}
	if !strings.Contains(table, "datasets in "+storeDir) || !strings.Contains(table, "demo/checkpoints/step-2@") {
		t.Errorf("the table does not say where the datasets are")
	}

	// Step 2 sampled from what step 1's sync published.
	st, err := store.Open(storeDir)
	if err != nil {
		t.Fatal(err)
	}
	entry := func(target string) pipelines.Entry {
		t.Helper()
		b, _, err := store.ReadAll(ctx, st, pipelines.RecordPrefix+"demo/targets/"+target+".json")
		if err != nil {
			t.Fatalf("%s: no record: %v", target, err)
		}
		var e pipelines.Entry
		if err := json.Unmarshal(b, &e); err != nil {
			t.Fatal(err)
		}
		return e
	}
	w2, t1 := entry("weights/2").Ref, entry("train/1").Ref
	wv, err := dataset.OpenString(ctx, st, w2)
	if err != nil {
		t.Fatal(err)
	}
	if wv.Metrics["weights_number"] != float64(2) {
		t.Errorf("weights/2 = %s: number %v, want 2", w2, wv.Metrics["weights_number"])
	}
	if wv.Metrics["source"] != t1 {
		t.Errorf("weights/2 = %s was published from %v, want train/1's checkpoint %s", w2, wv.Metrics["source"], t1)
	}
	var ro string
	for _, o := range entry("rollout/2").Outputs {
		if strings.HasPrefix(o, "demo/rollout/step-2/rollouts@") {
			ro = o
		}
	}
	rv, err := dataset.OpenString(ctx, st, ro)
	if err != nil {
		t.Fatalf("rollout/2's rollouts (%q): %v", ro, err)
	}
	n := 0
	if err := rv.EachShard(ctx, func(_ int, data []byte) error {
		return records.EachRollout(data, func(r records.Rollout) error {
			n++
			if r.WeightsVersion != w2 {
				t.Errorf("rollout/2: %s sample %d sampled from %q, want %s", r.TaskID, r.Sample, r.WeightsVersion, w2)
			}
			return nil
		})
	}); err != nil {
		t.Fatal(err)
	}
	if n != 8 {
		t.Errorf("rollout/2 has %d rollouts, want 8 (4 tasks x 2 samples)", n)
	}

	// A rerun runs nothing, says so, and records nothing.
	before := recordKeys(t, st)
	out, stderr := kiln(with("run", spec)...)
	if !strings.Contains(stderr, "nothing to run: every target is done") || !strings.Contains(stderr, "ran=0 ") {
		t.Errorf("the rerun did not say it had nothing to run:\n%s", stderr)
	}
	if strings.Contains(stderr, "msg=start") {
		t.Errorf("the rerun started a target:\n%s", stderr)
	}
	if strings.TrimSpace(out) != entry("train/2").Ref {
		t.Errorf("the rerun printed %q, want train/2's ref %s", out, entry("train/2").Ref)
	}
	if after := recordKeys(t, st); after != before {
		t.Errorf("the rerun changed the record:\nbefore %s\nafter  %s", before, after)
	}

	// STEPS=3 continues: only step 3's targets (and the engine) would run.
	plan, _ := kiln(append([]string{"plan", spec, "STEPS=3"}, vars...)...)
	for _, l := range strings.Split(strings.TrimSpace(plan), "\n") {
		f := strings.Fields(l)
		if len(f) < 2 {
			continue
		}
		name := strings.TrimSuffix(f[1], ":")
		if third := strings.HasSuffix(name, "/3") || name == "engine"; (f[0] == "run") != third {
			t.Errorf("kiln plan STEPS=3: %q (want run for step 3's targets and the engine only)", l)
		}
	}
}

// tableRows parses kiln status --table's step rows: step -> header -> cell.
func tableRows(t *testing.T, table string) map[string]map[string]string {
	t.Helper()
	lines := strings.Split(table, "\n")
	var head []string
	rows := map[string]map[string]string{}
	for _, l := range lines {
		f := strings.Fields(l)
		if len(f) == 0 {
			if head != nil {
				break
			}
			continue
		}
		if head == nil {
			if f[0] != "STEP" {
				t.Fatalf("the table does not start with its header: %q", l)
			}
			head = f
			continue
		}
		if _, err := strconv.Atoi(f[0]); err != nil {
			break
		}
		if len(f) != len(head) {
			t.Fatalf("table row %q has %d cells, the header %d", l, len(f), len(head))
		}
		r := map[string]string{}
		for i, h := range head {
			r[h] = f[i]
		}
		rows[f[0]] = r
	}
	return rows
}

// recordKeys lists the pipeline record's objects (done entries, last
// builds, logs, failures) with their sizes and ETags, the lock left out.
func recordKeys(t *testing.T, st store.Store) string {
	t.Helper()
	var b strings.Builder
	err := st.List(context.Background(), pipelines.RecordPrefix+"demo/", func(o store.Info) error {
		if strings.HasSuffix(o.Key, "/lock.json") {
			return nil // every run takes and releases the lock
		}
		b.WriteString(o.Key + " " + strconv.FormatInt(o.Size, 10) + " " + o.ETag + "\n")
		return nil
	})
	if err != nil {
		t.Fatal(err)
	}
	return b.String()
}

func demoPort(t *testing.T) int {
	t.Helper()
	l, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	defer l.Close()
	return l.Addr().(*net.TCPAddr).Port
}

func lastLinesOf(s string, n int) string {
	l := strings.Split(s, "\n")
	return strings.Join(l[max(0, len(l)-n):], "\n")
}
