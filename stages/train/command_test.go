package train

import (
	"bytes"
	"context"
	"encoding/json"
	"io"
	"os"
	"path/filepath"
	"strconv"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
	"github.com/urfave/cli/v2"

	"github.com/kilnrl/kiln/formats/dataset"
	"github.com/kilnrl/kiln/formats/records"
	"github.com/kilnrl/kiln/formats/store"
	"github.com/kilnrl/kiln/internal/stagecmd"
)

type world struct {
	st           *store.Local
	trajectories dataset.Ref
	advantages   dataset.Ref
	other        dataset.Ref // advantages of other trajectories
	model        string
	fakeGPU      string
	cache, work  string
}

func put(t *testing.T, st store.Store, name string, kind records.Kind, inputs []dataset.Ref, rows int, encode func(io.Writer) error) dataset.Ref {
	t.Helper()
	ctx := context.Background()
	w, err := dataset.NewWriter(ctx, st, dataset.Spec{Name: name, Kind: kind, Identity: dataset.Identity{Stage: "test", Inputs: inputs, Args: map[string]any{"t": t.Name(), "n": name}}})
	require.NoError(t, err)
	_, err = w.WriteShard(ctx, int64(rows), nil, encode)
	require.NoError(t, err)
	res, err := w.Commit(ctx, nil)
	require.NoError(t, err)
	return res.Ref
}

func putSegments(t *testing.T, st store.Store, name string, segs []Segment) dataset.Ref {
	return put(t, st, name, records.TrajectoriesKind(), nil, len(segs), func(w io.Writer) error {
		enc, err := records.NewTrajectoryEncoder(w, records.ArrowOptions{})
		if err != nil {
			return err
		}
		for _, s := range segs {
			tr := records.Trajectory{RolloutID: s.RolloutID, Index: s.RolloutID, Segment: s.Segment, Tokens: s.Tokens, ResponseLength: s.ResponseLength,
				LossMask: s.LossMask, RolloutLogProbs: s.RolloutLogProbs,
				Replay: records.Replay{TopPTokenOffsets: s.TopPOffsets, TopPTokenIDs: s.TopPIDs, TopPLogProbs: s.TopPLogProbs}}
			if err := enc.Write(tr); err != nil {
				return err
			}
		}
		return enc.Close()
	})
}

func putAdvantages(t *testing.T, st store.Store, name string, traj dataset.Ref, segs []Segment) dataset.Ref {
	return put(t, st, name, records.AdvantagesKind(), []dataset.Ref{traj}, len(segs), func(w io.Writer) error {
		enc, err := records.NewAdvantageEncoder(w, records.ArrowOptions{})
		if err != nil {
			return err
		}
		for _, s := range segs {
			if err := enc.Write(records.Advantage{RolloutID: s.RolloutID, Segment: s.Segment, Advantage: s.Advantage, RolloutTrainedTokens: s.RolloutTrainedTokens}); err != nil {
				return err
			}
		}
		return enc.Close()
	})
}

// writeModel writes a model directory: config.json with the context, a
// tokenizer unless noTokenizer, a chat template file and fake weights.
func writeModel(t *testing.T, dir string, context int, noTokenizer bool) string {
	require.NoError(t, os.MkdirAll(dir, 0o755))
	files := map[string]string{
		"config.json":            `{"model_type":"qwen3","max_position_embeddings":` + itoa(context) + `}`,
		"generation_config.json": `{"temperature":0.6}`,
		"model.safetensors":      "weights",
		"chat_template.jinja":    "{{ messages }}",
	}
	if !noTokenizer {
		files["tokenizer.json"] = `{"model":{}}`
		files["tokenizer_config.json"] = `{"chat_template":"{{ messages }}"}`
	}
	for n, body := range files {
		require.NoError(t, os.WriteFile(filepath.Join(dir, n), []byte(body), 0o644))
	}
	return dir
}

func itoa(n int) string { b, _ := json.Marshal(n); return string(b) }

func newWorld(t *testing.T) *world {
	root := t.TempDir()
	st, err := store.NewLocal(filepath.Join(root, "store"))
	require.NoError(t, err)
	w := &world{st: st, cache: filepath.Join(root, "cache"), work: filepath.Join(root, "work")}
	require.NoError(t, os.MkdirAll(w.work, 0o755))
	segs := fixture()
	for i := range segs {
		segs[i].TopPOffsets, segs[i].TopPIDs, segs[i].TopPLogProbs = nil, nil, nil
	}
	// Rollout 15 was left out by kiln-advantages (an infrastructure failure).
	all := append(append([]Segment{}, segs...), withD([]Segment{seg(15, 0, 4, 2, 1)})...)
	w.trajectories = putSegments(t, st, "trajectories", all)
	w.advantages = putAdvantages(t, st, "advantages", w.trajectories, segs)
	otherTraj := putSegments(t, st, "trajectories-b", segs[:3])
	w.other = putAdvantages(t, st, "advantages-b", otherTraj, segs[:3])
	w.model = writeModel(t, filepath.Join(root, "base"), 4096, false)
	w.fakeGPU, err = filepath.Abs(filepath.Join("testdata", "fakegpu"))
	require.NoError(t, err)
	return w
}

// run runs kiln-train as the binary does (stagecmd.Main), with the fake
// trainer, returning stdout, stderr and the exit status.
func (w *world) run(t *testing.T, args ...string) (string, string, int) {
	t.Helper()
	var out, errb bytes.Buffer
	env := &stagecmd.Env{Stdout: &out, Stderr: &errb, Log: stagecmd.NewLogger(&errb, false)}
	base := []string{"kiln-train", "--store", w.st.Root(), "--python", "python3", "--gpu-dir", w.fakeGPU,
		"--cache-dir", w.cache, "--work-dir", w.work, "--global-batch-size", "2", "--max-tokens-per-microbatch", "10"}
	code := stagecmd.Main(App(env), append(base, args...), &errb)
	return out.String(), errb.String(), code
}

func lastLine(s string) string {
	lines := strings.Split(strings.TrimRight(s, "\n"), "\n")
	return lines[len(lines)-1]
}

func TestRunCommitsCheckpoint(t *testing.T) {
	w := newWorld(t)
	ctx := context.Background()
	out, errs, code := w.run(t, "--trajectories", w.trajectories.String(), "--advantages", w.advantages.String(), "--model", w.model, "--out", "ckpt", "--seed", "7")
	require.Equal(t, 0, code, errs)
	ref := lastLine(out)
	assert.True(t, strings.HasPrefix(ref, "ckpt@"), out)
	assert.Contains(t, errs, "trainer: fake trainer: loading")
	v, err := dataset.OpenString(ctx, w.st, ref)
	require.NoError(t, err)
	assert.Equal(t, "checkpoints", v.Kind().Name)
	assert.Contains(t, v.Inputs, w.trajectories)
	assert.Contains(t, v.Inputs, w.advantages)
	require.Len(t, v.External, 1)
	assert.Equal(t, "model", v.External[0].Role)
	files, err := ReadCheckpointFiles(ctx, v)
	require.NoError(t, err)
	var names []string
	for _, f := range files {
		names = append(names, f.Name)
	}
	assert.Equal(t, []string{"chat_template.jinja", "config.json", "generation_config.json", "metrics.jsonl", "model-00001-of-00001.safetensors",
		"model.safetensors.index.json", "optimizer.pt", "tokenizer.json", "tokenizer_config.json", "trainer_state.json"}, names)
	assert.EqualValues(t, 2, v.Metrics["steps"])
	assert.EqualValues(t, 1, v.Metrics["dropped_rollouts"])
	assert.EqualValues(t, 1, v.Metrics["segments_without_advantages"])
	sm := v.Metrics["step_metrics"].(map[string]any)
	assert.Equal(t, []any{0.0, 1.0}, sm["step"])
	// The work directory is removed after the commit.
	ents, _ := os.ReadDir(w.work)
	assert.Empty(t, ents)

	// A rerun finds it committed; --print-version names it.
	out2, errs, code := w.run(t, "--trajectories", w.trajectories.String(), "--advantages", w.advantages.String(), "--model", w.model, "--out", "ckpt", "--seed", "7")
	require.Equal(t, 0, code, errs)
	assert.Equal(t, ref, lastLine(out2))
	assert.Contains(t, errs, "already committed")
	pv, _, code := w.run(t, "--trajectories", w.trajectories.String(), "--advantages", w.advantages.String(), "--model", w.model, "--out", "ckpt", "--seed", "7", "--print-version")
	require.Equal(t, 0, code)
	assert.Equal(t, ref, lastLine(pv))

	// The checkpoint as --model (materialized and checked) and as
	// --resume-from: the trainer gets its directory and optimizer state.
	out3, errs, code := w.run(t, "--trajectories", w.trajectories.String(), "--advantages", w.advantages.String(), "--model", ref, "--resume-from", ref, "--out", "ckpt2")
	require.Equal(t, 0, code, errs)
	v2, err := dataset.OpenString(ctx, w.st, lastLine(out3))
	require.NoError(t, err)
	assert.Contains(t, v2.Inputs, v.Ref())
	assert.Empty(t, v2.External)
	assert.Equal(t, ref, v2.Metrics["resume_from"])
	rc, _, err := v2.OpenAttachment(ctx, "trainer_state.json")
	require.NoError(t, err)
	var state map[string]any
	require.NoError(t, json.NewDecoder(rc).Decode(&state))
	rc.Close()
	assert.Equal(t, filepath.Join(w.cache, v.Dataset+"@"+v.Version), state["resume_from"])
	assert.Equal(t, "fake optimizer state", state["resumed_optimizer"])
}

// A trainer that fails (exits non-zero, is killed, or saves an incomplete
// checkpoint) commits nothing: the version does not exist and latest is not
// moved; the same command afterwards commits.
func TestTrainerFailureCommitsNothing(t *testing.T) {
	cases := []struct{ env, value, want string }{
		{"KILN_FAKE_CRASH_AT", "1", "the trainer failed after 1 step(s)"},
		{"KILN_FAKE_KILL_AT", "0", "the trainer failed after 0 step(s)"},
		{"KILN_FAKE_NO_OPTIMIZER", "1", "lacks optimizer.pt"},
	}
	for _, c := range cases {
		t.Run(c.env, func(t *testing.T) {
			w := newWorld(t)
			args := []string{"--trajectories", w.trajectories.String(), "--advantages", w.advantages.String(), "--model", w.model, "--out", "ckpt"}
			t.Setenv(c.env, c.value)
			out, errs, code := w.run(t, args...)
			assert.Equal(t, stagecmd.ExitFailure, code, errs)
			assert.Contains(t, errs, c.want)
			if c.env == "KILN_FAKE_CRASH_AT" {
				assert.Contains(t, errs, "trainer: fake trainer: crashing in step 1")
			}
			assert.NotContains(t, out, "ckpt@")
			_, err := dataset.Resolve(context.Background(), w.st, "ckpt")
			assert.ErrorIs(t, err, dataset.ErrNotFound)
			ents, _ := os.ReadDir(w.work)
			assert.Empty(t, ents, "the work directory is removed")

			os.Unsetenv(c.env)
			out, errs, code = w.run(t, args...)
			require.Equal(t, 0, code, errs)
			v, err := dataset.OpenString(context.Background(), w.st, lastLine(out))
			require.NoError(t, err)
			assert.EqualValues(t, 10, v.Rows)
		})
	}
}

func TestBadInputs(t *testing.T) {
	w := newWorld(t)
	root := t.TempDir()
	noTok := writeModel(t, filepath.Join(root, "notok"), 4096, true)
	short := writeModel(t, filepath.Join(root, "short"), 8, false)
	cases := []struct {
		name string
		args []string
		code int
		want string
	}{
		{"mismatched advantages", []string{"--advantages", w.other.String()}, stagecmd.ExitBadInput, "were not computed from trajectories " + w.trajectories.String()},
		{"missing advantages", []string{"--advantages", "advantages@00000000000000000000"}, stagecmd.ExitNotFound, "--advantages: dataset advantages@00000000000000000000: not found"},
		{"advantages of another kind", []string{"--advantages", w.trajectories.String()}, stagecmd.ExitUsage, "holds trajectories records, not advantages"},
		{"model without tokenizer", []string{"--model", noTok}, stagecmd.ExitBadInput, "has no tokenizer"},
		{"segment over the context", []string{"--model", short}, stagecmd.ExitBadInput, "rollout 12 segment 0 has 12 tokens, more than the model's context of 8"},
		{"no model", []string{"--model", filepath.Join(root, "nope")}, stagecmd.ExitNotFound, "no such directory"},
		{"too few rollouts", []string{"--global-batch-size", "9"}, stagecmd.ExitBadInput, "fill no step of --global-batch-size 9"},
		{"bad reduction", []string{"--reduction", "mean"}, stagecmd.ExitUsage, "--reduction"},
		{"bad launcher", []string{"--launcher", "mpirun"}, stagecmd.ExitUsage, "--launcher"},
		{"bad dual clip", []string{"--eps-clip-c", "0.5"}, stagecmd.ExitUsage, "must be > 1"},
		{"resume without optimizer", []string{"--resume-from", w.model}, stagecmd.ExitBadInput, "has no optimizer.pt"},
		{"bad old logprobs", []string{"--old-logprobs", "cached"}, stagecmd.ExitUsage, "--old-logprobs \"cached\": want recompute or rollout"},
		{"correction with rollout old logprobs", []string{"--old-logprobs", "rollout", "--correction", "tis"}, stagecmd.ExitUsage, "the rollout logprobs are already the old policy"},
	}
	for _, c := range cases {
		t.Run(c.name, func(t *testing.T) {
			args := []string{"--trajectories", w.trajectories.String(), "--advantages", w.advantages.String(), "--model", w.model, "--out", "ckpt"}
			args = append(args, c.args...)
			if c.name == "segment over the context" {
				args = append(args, "--max-tokens-per-microbatch", "100")
			}
			out, errs, code := w.run(t, args...)
			assert.Equal(t, c.code, code, "stderr: %s", errs)
			assert.Contains(t, errs, c.want)
			assert.NotContains(t, out, "ckpt@")
			_, err := dataset.Resolve(context.Background(), w.st, "ckpt")
			assert.ErrorIs(t, err, dataset.ErrNotFound)
		})
	}
}

// --dry-run prints plan.json and the command for each launcher, and
// writes nothing.
func TestDryRun(t *testing.T) {
	w := newWorld(t)
	for _, c := range []struct{ launcher, want string }{
		{"python", "python3 -m kiln_gpu.train --plan WORK/plan.json"},
		{"torchrun", "python3 -m torch.distributed.run --nproc-per-node 2 -m kiln_gpu.train --plan WORK/plan.json"},
		{"srun", "srun --ntasks 2 --kill-on-bad-exit=1 sh -c " + srunShim + " python3 -m kiln_gpu.train --plan WORK/plan.json"},
	} {
		out, errs, code := w.run(t, "--trajectories", w.trajectories.String(), "--advantages", w.advantages.String(), "--model", w.model,
			"--out", "ckpt", "--dry-run", "--launcher", c.launcher, "--nproc", "2")
		require.Equal(t, 0, code, errs)
		assert.Contains(t, out, `"format": "kiln-train-plan/1"`)
		assert.Contains(t, out, `"dropped_rollouts": 1`)
		assert.Contains(t, out, c.want+"\n")
		assert.Contains(t, out, "# would commit ckpt@")
	}
	_, err := dataset.Resolve(context.Background(), w.st, "ckpt")
	assert.ErrorIs(t, err, dataset.ErrNotFound)
	ents, _ := os.ReadDir(w.work)
	assert.Empty(t, ents)
}

// --old-logprobs reaches plan.json's loss and, since it changes what is
// trained, the version id (docs/train-stage.md §7).
func TestOldLogprobsInPlanAndIdentity(t *testing.T) {
	w := newWorld(t)
	version := map[string]string{}
	for _, mode := range []string{"recompute", "rollout"} {
		out, errs, code := w.run(t, "--trajectories", w.trajectories.String(), "--advantages", w.advantages.String(), "--model", w.model,
			"--out", "ckpt", "--dry-run", "--old-logprobs", mode)
		require.Equal(t, 0, code, errs)
		assert.Contains(t, out, `"old_logprobs": "`+mode+`"`)
		version[mode] = lastLine(out)
	}
	assert.NotEqual(t, version["recompute"], version["rollout"])
	// the default is recompute: the same version as passing it
	out, errs, code := w.run(t, "--trajectories", w.trajectories.String(), "--advantages", w.advantages.String(), "--model", w.model,
		"--out", "ckpt", "--dry-run")
	require.Equal(t, 0, code, errs)
	assert.Equal(t, version["recompute"], lastLine(out))
}

// --epochs N runs the steps N times in the same order over the same
// micro-batch files (plan.json), enters the version id only when N > 1
// (one-epoch runs keep their ids), and must be at least 1.
func TestEpochs(t *testing.T) {
	w := newWorld(t)
	plan := func(args ...string) (Plan, string) {
		t.Helper()
		out, errs, code := w.run(t, append([]string{"--trajectories", w.trajectories.String(), "--advantages", w.advantages.String(),
			"--model", w.model, "--out", "ckpt", "--dry-run"}, args...)...)
		require.Equal(t, 0, code, errs)
		var p Plan
		require.NoError(t, json.NewDecoder(strings.NewReader(out[strings.Index(out, "{"):])).Decode(&p))
		return p, lastLine(out)
	}
	one, v1 := plan()
	three, v3 := plan("--epochs", "3")
	_, v1again := plan("--epochs", "1")
	require.NotEmpty(t, one.Steps)
	require.Len(t, three.Steps, 3*len(one.Steps))
	for i, st := range three.Steps {
		first := one.Steps[i%len(one.Steps)]
		assert.Equal(t, i, st.Index, "step %d", i)
		assert.Equal(t, first.MicroBatches, st.MicroBatches, "step %d", i)
		assert.Equal(t, first.Divisor, st.Divisor, "step %d", i)
	}
	assert.NotEqual(t, v1, v3)
	assert.Equal(t, v1, v1again)
	_, errs, code := w.run(t, "--trajectories", w.trajectories.String(), "--advantages", w.advantages.String(),
		"--model", w.model, "--out", "ckpt", "--dry-run", "--epochs", "0")
	assert.Equal(t, 2, code)
	assert.Contains(t, errs, "--epochs 0: want at least 1")
}

// --dtype reaches plan.json (the trainer's optional "dtype") and, when
// not float32, the version id (docs/train-stage.md §7); float32 runs
// keep the ids they had before the flag, and other dtypes are refused.
func TestDtype(t *testing.T) {
	w := newWorld(t)
	plan := func(args ...string) (map[string]any, string) {
		t.Helper()
		out, errs, code := w.run(t, append([]string{"--trajectories", w.trajectories.String(), "--advantages", w.advantages.String(),
			"--model", w.model, "--out", "ckpt", "--dry-run"}, args...)...)
		require.Equal(t, 0, code, errs)
		var p map[string]any
		require.NoError(t, json.NewDecoder(strings.NewReader(out[strings.Index(out, "{"):])).Decode(&p))
		return p, lastLine(out)
	}
	def, vdef := plan()
	f32, v32 := plan("--dtype", "float32")
	f64, v64 := plan("--dtype", "float64")
	assert.NotContains(t, def, "dtype")
	assert.NotContains(t, f32, "dtype")
	assert.Equal(t, "float64", f64["dtype"])
	assert.Equal(t, vdef, v32)
	assert.NotEqual(t, vdef, v64)
	_, errs, code := w.run(t, "--trajectories", w.trajectories.String(), "--advantages", w.advantages.String(),
		"--model", w.model, "--out", "ckpt", "--dry-run", "--dtype", "bfloat16")
	assert.Equal(t, 2, code)
	assert.Contains(t, errs, `--dtype "bfloat16": want float32 or float64`)
}

var _ = cli.App{}

// Cancelling kiln-train (a signal) stops the trainer's whole process
// group, its children included, and commits nothing.
func TestCancelStopsTrainerGroup(t *testing.T) {
	w := newWorld(t)
	pidfile := filepath.Join(t.TempDir(), "child.pid")
	t.Setenv("KILN_FAKE_HANG_AT", "1")
	t.Setenv("KILN_FAKE_PIDFILE", pidfile)
	ctx, cancel := context.WithCancel(context.Background())
	go func() {
		for {
			if _, err := os.Stat(pidfile); err == nil {
				time.Sleep(100 * time.Millisecond)
				cancel()
				return
			}
			time.Sleep(50 * time.Millisecond)
		}
	}()
	var out, errb bytes.Buffer
	env := &stagecmd.Env{Stdout: &out, Stderr: &errb, Log: stagecmd.NewLogger(&errb, false)}
	o := Options{Trajectories: w.trajectories.String(), Advantages: w.advantages.String(), Model: w.model,
		Batching: Batching{GlobalBatchSize: 2, MaxTokens: 10, Packing: FirstFit, Reduction: ReduceRollout},
		Loss:     LossConfig{Objective: "ppo", Reduction: "rollout"}, Optimizer: OptimizerConfig{LR: 1e-6},
		Temp: 1, Launcher: LaunchPython, NProc: 1, Python: "python3", GPUDir: w.fakeGPU, CacheDir: w.cache, WorkDir: w.work}
	t0 := time.Now()
	_, err := Run(ctx, env, w.st, stagecmd.Output{Name: "ckpt"}, o)
	require.ErrorIs(t, err, context.Canceled, errb.String())
	assert.Less(t, time.Since(t0), 60*time.Second)
	b, rerr := os.ReadFile(pidfile)
	require.NoError(t, rerr)
	pid, _ := strconv.Atoi(strings.TrimSpace(string(b)))
	require.Positive(t, pid)
	deadline := time.Now().Add(5 * time.Second)
	for syscall.Kill(pid, 0) == nil && time.Now().Before(deadline) {
		time.Sleep(50 * time.Millisecond)
	}
	assert.Error(t, syscall.Kill(pid, 0), "the trainer's child %d still runs", pid)
	_, err = dataset.Resolve(context.Background(), w.st, "ckpt")
	assert.ErrorIs(t, err, dataset.ErrNotFound)
}
