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
// with its defaults (4 tasks x 4 samples, 3 GRPO steps, the seeds it
// ships with) on the real stage binaries, in a temporary DEMO directory:
// the tiny checkpoint, the warm start (demonstrations recorded through
// serve.py's forced decoding, graded, trained on), serve.py as the engine
// service, the shell agent in bwrap sandboxes over the fixture bundles,
// grading, GRPO advantages, CPU training and kiln-sync between the steps.
// Then:
//
//   - the demonstrations all pass their tasks' tests (they are fixes);
//   - kiln status --table has a done row for each step, with the rollouts
//     run and the weights number they sampled from (1, 2, 3);
//   - step 1's pass rate is strictly between 0 and 1 (mixed rewards);
//   - step 1 is on-policy: train/1's max |trainer logprob - engine
//     logprob| is at most 1e-5;
//   - step 2's rollouts record the weights weights/2 (step 1's sync)
//     published from train/1's checkpoint;
//   - a rerun runs nothing and says so, and writes no record;
//   - STEPS=4 would run only step 4's targets (kiln plan).
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
		"TEACHER_PORT=" + strconv.Itoa(demoPort(t))}
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
	with := func(args ...string) []string { return append(args, vars...) }

	start = time.Now()
	kiln(with("run", spec)...)
	t.Logf("kiln run demo.kiln: %v", time.Since(start).Round(time.Second))

	// The table: a done row per step.
	table, _ := kiln(with("status", spec, "--table")...)
	t.Logf("kiln status --table:\n%s", table)
	rows := tableRows(t, table)
	for step, weights := range map[string]string{"1": "1", "2": "2", "3": "3"} {
		r, ok := rows[step]
		if !ok {
			t.Errorf("the table has no row for step %s", step)
			continue
		}
		for col, want := range map[string]string{"STATE": "done", "ROLLOUTS": "16", "ABORTED": "0", "WEIGHTS": weights} {
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
	if !strings.Contains(table, "datasets in "+storeDir) || !strings.Contains(table, "demo/checkpoints/step-3@") {
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
	// The demonstrations are fixes: every one passes its task's tests.
	if g := manifestMetrics(t, ctx, st, entry("demo-grades").Ref); g["graded"] != float64(4) || g["reward_1"] != float64(4) {
		t.Errorf("demo-grades %s: the demonstrations do not all pass: %v", entry("demo-grades").Ref, g)
	}
	// The warm start leaves mixed rewards: some samples fix their bug and
	// others do not, so the RL steps have something to learn from. (That
	// the pass rate rises over the steps is issue 33's goal, not yet met on
	// this tiny model: README's quick start has the measured figures.)
	first, err := strconv.ParseFloat(rows["1"]["PASS"], 64)
	if err != nil {
		t.Fatalf("step 1's PASS cell %q: not a number", rows["1"]["PASS"])
	}
	if first <= 0 || first >= 1 {
		t.Errorf("step 1's pass rate %v: the warm start should leave mixed rewards (0 < pass < 1)", first)
	}
	// Step 1 samples from the weights train/1 starts from: on-policy.
	if d, ok := manifestMetrics(t, ctx, st, entry("train/1").Ref)["step_metrics"].(map[string]any); !ok {
		t.Errorf("train/1 has no step_metrics")
	} else if v, ok := d["train_rollout_logprob_max_abs_diff"].([]any); !ok || len(v) == 0 {
		t.Errorf("train/1: no train_rollout_logprob_max_abs_diff in %v", d)
	} else {
		for i, x := range v {
			if f, ok := x.(float64); !ok || f > 1e-5 {
				t.Errorf("train/1 step %d: max |trainer - engine logprob| = %v, want <= 1e-5 (on-policy)", i, x)
			}
		}
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
	if n != 16 {
		t.Errorf("rollout/2 has %d rollouts, want 16 (4 tasks x 4 samples)", n)
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
	if strings.TrimSpace(out) != entry("train/3").Ref {
		t.Errorf("the rerun printed %q, want train/3's ref %s", out, entry("train/3").Ref)
	}
	if after := recordKeys(t, st); after != before {
		t.Errorf("the rerun changed the record:\nbefore %s\nafter  %s", before, after)
	}

	// STEPS=4 continues: only step 4's targets (and the engine) would run.
	plan, _ := kiln(append([]string{"plan", spec, "STEPS=4"}, vars...)...)
	for _, l := range strings.Split(strings.TrimSpace(plan), "\n") {
		f := strings.Fields(l)
		if len(f) < 2 {
			continue
		}
		name := strings.TrimSuffix(f[1], ":")
		if fourth := strings.HasSuffix(name, "/4") || name == "engine"; (f[0] == "run") != fourth {
			t.Errorf("kiln plan STEPS=4: %q (want run for step 4's targets and the engine only)", l)
		}
	}
}

// manifestMetrics is the metrics of the version ref names.
func manifestMetrics(t *testing.T, ctx context.Context, st store.Store, ref string) map[string]any {
	t.Helper()
	v, err := dataset.OpenString(ctx, st, ref)
	if err != nil {
		t.Fatalf("%s: %v", ref, err)
	}
	return v.Metrics
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
