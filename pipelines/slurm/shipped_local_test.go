package slurm

import (
	"bytes"
	"context"
	"encoding/json"
	"net/http/httptest"
	"os"
	"os/exec"
	"path/filepath"
	"reflect"
	"slices"
	"strconv"
	"strings"
	"testing"

	"github.com/kilnrl/kiln/fixtures"
	"github.com/kilnrl/kiln/formats/dataset"
	"github.com/kilnrl/kiln/formats/records"
	"github.com/kilnrl/kiln/formats/store"
	"github.com/kilnrl/kiln/internal/agent/enginetest"
	"github.com/kilnrl/kiln/internal/sandbox/sandboxtest"
	"github.com/kilnrl/kiln/internal/testenv/gputest"
	"github.com/kilnrl/kiln/pipelines"
)

// TestMiMoFullStalenessAndReplay runs the shipped mimo-full.kiln locally
// (kiln run -j 2) on real stages: the four fixture tasks split train/eval,
// a probe against a scripted policy that fixes each task's first sample
// only (so select keeps both train tasks), three steps with STALENESS=1 on
// serve.py and the shell agent, and an eval at step 2. Then:
//
//   - staleness: rollout/2 starts before train/1 has ended (it does not
//     wait for it), rollout/3 runs while train/2 trains (their recorded
//     start and end times overlap), rollouts 1 and 2 record the base
//     weights (number 1) and rollout 3 the weights published from train/1;
//   - eval: eval-stats/2 records pass_at_1 and pass_at_k;
//   - replay: replay.kiln on step 1's saved rollouts re-grades, recomputes
//     the advantages and retrains: the advantages rows are byte for byte
//     step 1's and the trainer's loss is bit for bit the same.
func TestMiMoFullStalenessAndReplay(t *testing.T) {
	if testing.Short() {
		t.Skip("runs three RL steps on real stages")
	}
	ge := gputest.Find(t)
	sandboxtest.Require(t)
	ctx := context.Background()
	set, err := fixtures.Load(ctx)
	if err != nil {
		t.Fatal(err)
	}
	work := t.TempDir()
	bin := buildAll(t)
	tiny := longTiny(t, ge)
	tok := filepath.Join(work, "probe-tokenizer")
	if err := enginetest.WriteTokenizerFiles(tok); err != nil {
		t.Fatal(err)
	}
	one := int64(1)
	probe := httptest.NewServer(enginetest.New(enginetest.Options{Script: fixingPolicy(set.Tasks, true), MaxModelLen: 1 << 16, WeightVersion: &one}))
	t.Cleanup(probe.Close)
	home, _ := os.UserHomeDir()
	bundles := filepath.Join(home, ".cache", "kiln", "grade-test-bundles-"+fixtures.GeneratorVersion)
	storeDir := filepath.Join(work, "store")
	copySpec := func(name string) string {
		src, err := os.ReadFile("../" + name)
		if err != nil {
			t.Fatal(err)
		}
		p := filepath.Join(work, name)
		if err := os.WriteFile(p, src, 0o644); err != nil {
			t.Fatal(err)
		}
		return p
	}
	full, replay := copySpec("mimo-full.kiln"), copySpec("replay.kiln")
	// The tiny model earns no reward, so every advantage is 0 and so would
	// be the policy-gradient loss: the entropy bonus makes the loss depend
	// on the model and the trained tokens, which the replay must reproduce.
	common := []string{"BUNDLES=" + bundles, "MODEL=" + tiny, "TRAIN_BATCH=2", "LR=5e-2", "SEED=3", "TEMPERATURE=1",
		"TRAIN_FLAGS=--entropy-coef 0.01"}
	vars := append(slices.Clone(common),
		"STEPS=3", "STALENESS=1", "EVAL_EVERY=2", "EVAL_SAMPLES=2",
		"MIMO_DATA="+set.MiMoDir, "SPLITS=train=0.5,eval=0.5",
		"IMAGE_SOURCE="+set.Repository+"=oci:"+set.Layout,
		"WEIGHTS_DIR="+filepath.Join(work, "engine-weights"),
		"ENGINE_CMD="+ge.Python+" -m kiln_gpu.serve", "ENGINE_FLAGS=--max-model-len 65536 --seed 5",
		"ENGINE_PORT="+strconv.Itoa(freePort(t)),
		"AGENT=shell", "SAMPLES=2", "ROLLOUT_JOBS=4", "GRADE_JOBS=2", "MAX_TOKENS=8", "MAX_TURNS=2", "BUDGET=2m",
		"PROBE_SAMPLES=2", "PROBE_MIN_SAMPLES=2", "PROBE_ENGINE="+probe.URL, "PROBE_TOKENIZER="+tok, "PROBE_MAX_TOKENS=8192",
		"TRAIN_LAUNCHER=python", "TRAIN_NPROC=1")
	env := append(os.Environ(), "PATH="+bin+string(os.PathListSeparator)+os.Getenv("PATH"),
		"PYTHONPATH="+ge.Dir, "KILN_GPU_DIR="+ge.Dir, "KILN_PYTHON="+ge.Python)
	kiln := func(args ...string) string {
		t.Helper()
		cmd := exec.Command(filepath.Join(bin, "kiln"), append([]string{"--store", storeDir}, args...)...)
		cmd.Env, cmd.Dir = env, work
		var out, errb bytes.Buffer
		cmd.Stdout, cmd.Stderr = &out, &errb
		if err := cmd.Run(); err != nil {
			t.Fatalf("kiln %s: %v\n%s\n%s", strings.Join(args[:2], " "), err, out.String(), lastLines(errb.String(), 80))
		}
		return out.String()
	}
	kiln(append([]string{"run", full, "-j", "2"}, vars...)...)

	st, err := store.Open(storeDir)
	if err != nil {
		t.Fatal(err)
	}
	entry := func(pipeline, target string) pipelines.Entry {
		t.Helper()
		b, _, err := store.ReadAll(ctx, st, pipelines.RecordPrefix+pipeline+"/targets/"+target+".json")
		if err != nil {
			t.Fatalf("%s: no record: %v", target, err)
		}
		var e pipelines.Entry
		if err := json.Unmarshal(b, &e); err != nil {
			t.Fatal(err)
		}
		return e
	}
	// Staleness: rollout/2 did not wait for train/1, and rollout/3 ran
	// while train/2 trained. The second is certain under -j 2, not a race:
	// once train/1 ends, weights/3 and train/2 start together (advantages/2
	// ran during train/1), and rollout/3 follows weights/3's seconds-long
	// sync while the trainer is still starting.
	r2, t1 := entry("mimo-full", "rollout/2"), entry("mimo-full", "train/1")
	r3, t2 := entry("mimo-full", "rollout/3"), entry("mimo-full", "train/2")
	span := func(e pipelines.Entry) string {
		return e.Start.Format("15:04:05.000") + " .. " + e.End.Format("15:04:05.000")
	}
	t.Logf("train/1 %s; rollout/2 %s; train/2 %s; rollout/3 %s", span(t1), span(r2), span(t2), span(r3))
	if !r2.Start.Before(t1.End) {
		t.Errorf("rollout/2 started at %v, after train/1 ended at %v: STALENESS=1 should let it run meanwhile", r2.Start, t1.End)
	}
	if !r3.Start.Before(t2.End) || !t2.Start.Before(r3.End) {
		t.Errorf("rollout/3 ran %s and train/2 %s: with STALENESS=1 they should overlap", span(r3), span(t2))
	}
	for step, want := range map[int]string{1: entry("mimo-full", "probe-weights").Ref, 2: entry("mimo-full", "probe-weights").Ref, 3: entry("mimo-full", "weights/3").Ref} {
		if step == 3 {
			if wv, err := dataset.OpenString(ctx, st, want); err != nil || wv.Metrics["weights_number"] != float64(2) {
				t.Errorf("weights/3 = %s: number %v (%v), want 2 (train/1's checkpoint)", want, wv.Metrics["weights_number"], err)
			}
		}
		eachRollout(t, st, outputOf(t, entry("mimo-full", "rollout/"+strconv.Itoa(step)), "rollouts"), func(r records.Rollout) {
			if r.WeightsVersion != want {
				t.Errorf("rollout/%d: %s sampled from %s, want %s", step, r.TaskID, r.WeightsVersion, want)
			}
		})
	}
	// The eval recorded pass@1 and pass@k.
	ev, err := dataset.OpenString(ctx, st, entry("mimo-full", "eval-stats/2").Ref)
	if err != nil {
		t.Fatal(err)
	}
	if _, ok := ev.Metrics["pass_at_1"]; !ok {
		t.Errorf("eval-stats/2's metrics lack pass_at_1: %v", ev.Metrics)
	}
	if _, ok := ev.Metrics["pass_at_k"]; !ok {
		t.Errorf("eval-stats/2's metrics lack pass_at_k: %v", ev.Metrics)
	}

	// Replay step 1 from its saved rollouts.
	ro := outputOf(t, entry("mimo-full", "rollout/1"), "rollouts")
	_, at, _ := strings.Cut(ro, "@")
	kiln(append([]string{"run", replay}, append(slices.Clone(common),
		"ROLLOUT=mimo-full/rollout/step-1", "AT=@"+at, "TASKS="+entry("mimo-full", "select").Ref,
		"IMAGES="+entry("mimo-full", "images").Ref, "GRADE_JOBS=2", "OUT=replay/step-1")...)...)
	recAdv, repAdv := entry("mimo-full", "advantages/1").Ref, entry("replay", "advantages").Ref
	if a, b := shardBytes(t, st, recAdv), shardBytes(t, st, repAdv); !bytes.Equal(a, b) || len(a) == 0 {
		t.Errorf("replayed advantages %s differ from the recorded %s (%d and %d bytes)", repAdv, recAdv, len(b), len(a))
	}
	recLoss, repLoss := lossOf(t, st, entry("mimo-full", "train/1").Ref), lossOf(t, st, entry("replay", "train").Ref)
	t.Logf("train/1 loss %v, replay %v", recLoss, repLoss)
	if l, _ := recLoss.([]any); !slices.ContainsFunc(l, func(v any) bool { f, ok := v.(float64); return ok && f != 0 }) {
		t.Errorf("train/1's loss %v: want a non-zero loss, or the replay's comparison shows nothing", recLoss)
	}
	if !reflect.DeepEqual(recLoss, repLoss) || recLoss == nil {
		t.Errorf("replayed loss %v, recorded %v: want bit for bit the same", repLoss, recLoss)
	}
}

func outputOf(t *testing.T, e pipelines.Entry, name string) string {
	t.Helper()
	for _, o := range e.Outputs {
		if n, _, _ := strings.Cut(o, "@"); strings.HasSuffix(n, "/"+name) {
			return o
		}
	}
	t.Fatalf("%s has no output %s: %v", e.Target, name, e.Outputs)
	return ""
}

func eachRollout(t *testing.T, st store.Store, ref string, fn func(records.Rollout)) {
	t.Helper()
	v, err := dataset.OpenString(context.Background(), st, ref)
	if err != nil {
		t.Fatal(err)
	}
	if err := v.EachShard(context.Background(), func(_ int, data []byte) error {
		return records.EachRollout(data, func(r records.Rollout) error { fn(r); return nil })
	}); err != nil {
		t.Fatal(err)
	}
}

func shardBytes(t *testing.T, st store.Store, ref string) []byte {
	t.Helper()
	v, err := dataset.OpenString(context.Background(), st, ref)
	if err != nil {
		t.Fatal(err)
	}
	var all []byte
	if err := v.EachShard(context.Background(), func(_ int, data []byte) error { all = append(all, data...); return nil }); err != nil {
		t.Fatal(err)
	}
	return all
}

// lossOf is a checkpoints version's per-step loss column.
func lossOf(t *testing.T, st store.Store, ref string) any {
	t.Helper()
	v, err := dataset.OpenString(context.Background(), st, ref)
	if err != nil {
		t.Fatal(err)
	}
	sm, _ := v.Metrics["step_metrics"].(map[string]any)
	return sm["loss"]
}

// longTiny is gputest's tiny Qwen3 checkpoint with a 64Ki-token context
// (max_position_embeddings; RoPE has no other limit): the real CLIs'
// prompts (Codex's alone is over 5,000 tokens) exceed the 4,096 it is
// built with, and kiln-train refuses a segment longer than the model's
// context. The engines are started with the same --max-model-len.
func longTiny(t *testing.T, ge gputest.Env) string {
	t.Helper()
	dir := ge.Tiny(t)
	p := filepath.Join(dir, "config.json")
	b, err := os.ReadFile(p)
	if err != nil {
		t.Fatal(err)
	}
	var cfg map[string]any
	if err := json.Unmarshal(b, &cfg); err != nil {
		t.Fatalf("%s: %v", p, err)
	}
	if _, ok := cfg["max_position_embeddings"]; !ok {
		t.Fatalf("%s has no max_position_embeddings to raise", p)
	}
	cfg["max_position_embeddings"] = 1 << 16
	if b, err = json.MarshalIndent(cfg, "", "  "); err != nil {
		t.Fatal(err)
	}
	if err := os.WriteFile(p, b, 0o644); err != nil {
		t.Fatal(err)
	}
	return dir
}

func lastLines(s string, n int) string {
	l := strings.Split(s, "\n")
	return strings.Join(l[max(0, len(l)-n):], "\n")
}
