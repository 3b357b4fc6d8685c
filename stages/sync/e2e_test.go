package sync_test

import (
	"bytes"
	"context"
	"fmt"
	"io"
	"os"
	"os/exec"
	"path/filepath"
	"runtime"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
	"github.com/urfave/cli/v2"

	"github.com/kilnrl/kiln/fixtures"
	"github.com/kilnrl/kiln/formats/dataset"
	"github.com/kilnrl/kiln/formats/records"
	"github.com/kilnrl/kiln/formats/store"
	"github.com/kilnrl/kiln/internal/agent/engine"
	"github.com/kilnrl/kiln/internal/agent/harness"
	"github.com/kilnrl/kiln/internal/sandbox"
	"github.com/kilnrl/kiln/internal/sandbox/sandboxtest"
	"github.com/kilnrl/kiln/internal/stagecmd"
	"github.com/kilnrl/kiln/internal/stagecmd/stagetest"
	"github.com/kilnrl/kiln/internal/testenv/gputest"
	"github.com/kilnrl/kiln/stages/advantages"
	"github.com/kilnrl/kiln/stages/convert"
	"github.com/kilnrl/kiln/stages/images"
	"github.com/kilnrl/kiln/stages/rollout"
	ksync "github.com/kilnrl/kiln/stages/sync"
	"github.com/kilnrl/kiln/stages/train"
)

// TestLoopThroughSync closes the loop on real parts (docs/sync.md §4,
// §5): serve.py serves the tiny Qwen3 checkpoint published by kiln-sync as
// weights 1; kiln-rollout run --weights drives the shell agent in bwrap
// sandboxes; kiln-train trains on it (the real trainer, CPU); kiln-sync
// publishes that checkpoint (a delta), pulls it and reloads serve.py as
// weights 2. Then the rollout refuses weights 1 before any sandbox boots
// and runs on weights 2, and the trainer recomputing the new rollouts'
// logprobs with the trained checkpoint matches what the engine sampled
// with to 1e-5 — the served weights are byte for byte the trainer's —
// while the base model's logprobs of the same tokens do not (so the
// comparison can fail). Needs root and bwrap, the gpu venv and the Qwen3
// tokenizer; skips without them, fails under CI=true.
func TestLoopThroughSync(t *testing.T) {
	if testing.Short() {
		t.Skip("serves a model, runs sandboxed agents and trains on CPU")
	}
	ge := gputest.Find(t)
	home, err := os.UserHomeDir()
	require.NoError(t, err)
	sandboxtest.Require(t)
	ctx := context.Background()
	root := t.TempDir()
	tiny := ge.Tiny(t)
	url := ge.Serve(t, tiny, "--seed", "5")
	storeDir := filepath.Join(root, "store")
	st, err := store.NewLocal(storeDir)
	require.NoError(t, err)
	pulled := filepath.Join(root, "engine-weights")

	var logs bytes.Buffer
	env := func(stdout io.Writer) *stagecmd.Env {
		return &stagecmd.Env{Stdout: stdout, Stderr: &logs, Log: stagecmd.NewLogger(&logs, false)}
	}
	kilnSync := func(checkpoint string) dataset.Ref {
		t.Helper()
		var out bytes.Buffer
		code := stagecmd.Main(ksync.App(env(&out)), []string{"kiln-sync", "--store", storeDir, "--checkpoint", checkpoint,
			"--out", "weights/policy", "--to", pulled, "--engine", url, "--cache-dir", filepath.Join(root, "cache")}, &logs)
		require.Equal(t, 0, code, "kiln-sync:\n%s", logs.String())
		ref, err := dataset.ParseRef(lastLine(out.String()))
		require.NoError(t, err)
		return ref
	}
	w1 := kilnSync(tiny)

	// Tasks, images, the shell agent and the sandbox helper, as the
	// rollout's own tests have them.
	tools := filepath.Join(root, "tools")
	require.NoError(t, os.MkdirAll(tools, 0o755))
	_, err = sandboxtest.BuildHelper(tools)
	require.NoError(t, err)
	build := exec.Command(filepath.Join(runtime.GOROOT(), "bin", "go"), "build", "-o", filepath.Join(tools, harness.ShellAgentName), "github.com/kilnrl/kiln/cmd/kiln-agent")
	build.Env = append(os.Environ(), "CGO_ENABLED=0")
	out, err := build.CombinedOutput()
	require.NoError(t, err, "building kiln-agent: %s", out)
	set, err := fixtures.Load(ctx)
	require.NoError(t, err)
	bundles := filepath.Join(home, ".cache", "kiln", "grade-test-bundles-"+fixtures.GeneratorVersion)
	cmds := func(env *stagecmd.Env) []*cli.Command {
		return append(convert.Commands(env), images.Commands(env)...)
	}
	r := stagetest.Run(t, cmds, "mimo", "--store", storeDir, "--data", set.MiMoDir, "--out", "tasks")
	require.Equal(t, 0, r.Code, r.Stderr)
	tasks := r.LastLine()
	r = stagetest.Run(t, cmds, "import", "--store", storeDir, "--tasks", tasks, "--root", bundles,
		"--source", set.Repository+"="+"oci:"+set.Layout, "--out", "images")
	require.Equal(t, 0, r.Code, r.Stderr)
	imgs := r.LastLine()

	roll := func(name string, weights dataset.Ref) (rollout.RunResults, error) {
		o := rollout.RunOptions{Tasks: tasks, Images: imgs, Bundles: bundles, Engines: []string{url}, Mode: engine.ModeGenerate,
			TokenizerDir: tiny, Samples: 1, Agent: "shell", Weights: weights.String(), Jobs: 4,
			Budget: 5 * time.Minute, SetupTimeout: 5 * time.Minute, Margin: 30 * time.Second,
			Temperature: 1, TopP: 1, TopK: -1, MaxTokens: 24, ReasoningParser: "qwen3", ToolParser: "qwen3_coder", MaxTurns: 2,
			Harness: harness.Options{ShellAgent: filepath.Join(tools, harness.ShellAgentName)},
			Sandbox: sandbox.Options{HelperPath: filepath.Join(tools, sandbox.HelperName)}}
		return rollout.Run(ctx, env(io.Discard), st, rollout.RunOutput{Name: name}, o)
	}
	// advantage 1 for every segment (reward 1, the raw estimator), so
	// training moves the weights and no segment is dropped.
	advantagesOf := func(name string, res rollout.RunResults) dataset.Ref {
		t.Helper()
		var rows []records.Rollout
		eachShard(t, st, res.Rollouts.Ref, func(data []byte) error {
			return records.EachRollout(data, func(r records.Rollout) error { rows = append(rows, r); return nil })
		})
		require.Len(t, rows, len(set.Tasks), logs.String())
		g := putGrades(t, st, "grades/"+name, res.Rollouts.Ref, rows)
		a, err := advantages.Run(ctx, env(io.Discard), st, stagecmd.Output{Name: "advantages/" + name}, advantages.RunOptions{
			Trajectories: res.Trajectories.Ref.String(), Grades: g.String(),
			Options: advantages.Options{Estimator: advantages.Raw, StdEps: 1e-6, Infra: advantages.InfraExclude, MinGroupSize: 1}})
		require.NoError(t, err, logs.String())
		return a.Ref
	}
	kilnTrain := func(name string, res rollout.RunResults, adv dataset.Ref, model, lr string) *dataset.Version {
		t.Helper()
		var tout bytes.Buffer
		code := stagecmd.Main(train.App(env(&tout)), []string{"kiln-train", "--store", storeDir, "--python", ge.Python, "--gpu-dir", ge.Dir,
			"--cache-dir", filepath.Join(root, "cache"), "--work-dir", root,
			"--trajectories", res.Trajectories.Ref.String(), "--advantages", adv.String(), "--model", model, "--out", "ckpt/" + name,
			"--global-batch-size", strconv.Itoa(len(set.Tasks)), "--temperature", "1", "--lr", lr, "--seed", "1"}, &logs)
		require.Equal(t, 0, code, "kiln-train:\n%s", logs.String())
		v, err := dataset.OpenString(ctx, st, lastLine(tout.String()))
		require.NoError(t, err)
		return v
	}
	maxDiff := func(v *dataset.Version) float64 {
		t.Helper()
		sm, ok := v.Metrics["step_metrics"].(map[string]any)
		require.True(t, ok, "metrics: %v", v.Metrics)
		col, ok := sm["train_rollout_logprob_max_abs_diff"].([]any)
		require.True(t, ok && len(col) > 0, "step metrics: %v", sm)
		f, ok := col[0].(float64)
		require.True(t, ok)
		return f
	}

	// Step 1 on weights 1, trained with a large step so the weights move.
	// The trainer writes an index and numbered shards where the tiny model
	// has one model.safetensors, so weights 2 is full (the files differ).
	step1, err := roll("rollout/1", w1)
	require.NoError(t, err, logs.String())
	ck1 := kilnTrain("1", step1, advantagesOf("1", step1), tiny, "5e-2")
	w2 := kilnSync(ck1.Ref().String())
	wv, err := dataset.Open(ctx, st, w2)
	require.NoError(t, err)
	assert.Equal(t, true, wv.Metrics["full"], "%v", wv.Metrics)
	assert.Equal(t, 2.0, wv.Metrics["weights_number"])

	// The engine now serves weights 2: a rollout asking for 1 is refused
	// before any run starts, one asking for 2 runs.
	_, err = roll("rollout/stale", w1)
	require.Error(t, err)
	assert.Contains(t, err.Error(), url)
	assert.Equal(t, stagecmd.ExitFailure, stagecmd.ExitCode(err), "%v", err)
	_, err = dataset.OpenString(ctx, st, "rollout/stale/rollouts")
	assert.ErrorIs(t, err, dataset.ErrNotFound, "the refused rollout wrote nothing")

	step2, err := roll("rollout/2", w2)
	require.NoError(t, err, logs.String())
	eachShard(t, st, step2.Rollouts.Ref, func(data []byte) error {
		return records.EachRollout(data, func(r records.Rollout) error {
			assert.Equal(t, w2.String(), r.WeightsVersion)
			return nil
		})
	})
	adv2 := advantagesOf("2", step2)
	ck2 := kilnTrain("2", step2, adv2, ck1.Ref().String(), "5e-2")
	onNew := maxDiff(ck2)
	onBase := maxDiff(kilnTrain("2-base", step2, adv2, tiny, "1e-9"))
	t.Logf("step 2 sampled on synced weights 2 (full): trainer logprob |diff| max %.3g with the trained checkpoint, %.3g with the base model", onNew, onBase)
	assert.LessOrEqual(t, onNew, 1e-5, "the served model's logprobs equal the trainer's for the new weights")
	assert.Greater(t, onBase, 1e-3, "the base model's logprobs differ, so the comparison above can fail")
	gen, ok := ck2.Metrics["generated_with_weights"].([]any)
	require.True(t, ok && len(gen) == 1, "generated_with_weights: %v", ck2.Metrics["generated_with_weights"])
	assert.Equal(t, w2.String(), gen[0].(map[string]any)["weights"])

	// Weights 3 is a delta of 2 (same layout): the engine reloads the
	// reconstructed directory, and the trainer agrees with it again.
	w3 := kilnSync(ck2.Ref().String())
	wv, err = dataset.Open(ctx, st, w3)
	require.NoError(t, err)
	assert.Equal(t, false, wv.Metrics["full"], "%v", wv.Metrics)
	assert.Equal(t, "xor", wv.Metrics["encoding"])
	step3, err := roll("rollout/3", w3)
	require.NoError(t, err, logs.String())
	onDelta := maxDiff(kilnTrain("3", step3, advantagesOf("3", step3), ck2.Ref().String(), "1e-9"))
	t.Logf("step 3 sampled on synced weights 3 (delta): trainer logprob |diff| max %.3g", onDelta)
	assert.LessOrEqual(t, onDelta, 1e-5, "the served delta-reconstructed weights are the trainer's")
}

// putGrades commits reward 1 for every rollout row.
func putGrades(t *testing.T, st store.Store, name string, rollouts dataset.Ref, rows []records.Rollout) dataset.Ref {
	t.Helper()
	ctx := context.Background()
	w, err := dataset.NewWriter(ctx, st, dataset.Spec{Name: name, Kind: records.GradesKind(),
		Identity: dataset.Identity{Stage: "test-grades", CodeVersion: "1", Inputs: []dataset.Ref{rollouts}}})
	require.NoError(t, err)
	if w.Existing() == nil {
		_, err = w.WriteShard(ctx, int64(len(rows)), nil, func(out io.Writer) error {
			enc := records.NewGradeEncoder(out)
			for _, r := range rows {
				g := records.Grade{RolloutID: r.RolloutID, Index: r.Index, GroupIndex: r.GroupIndex, Sample: r.Sample, TaskID: r.TaskID,
					Reward: 1, Applied: true, Failure: records.FailureNone}
				if err := enc.Write(g); err != nil {
					return fmt.Errorf("grade of rollout %d: %w", r.RolloutID, err)
				}
			}
			return enc.Close()
		})
		require.NoError(t, err)
	}
	res, err := w.Commit(ctx, nil)
	require.NoError(t, err)
	return res.Ref
}

func eachShard(t *testing.T, st store.Store, ref dataset.Ref, fn func([]byte) error) {
	t.Helper()
	v, err := dataset.Open(context.Background(), st, ref)
	require.NoError(t, err)
	require.NoError(t, v.EachShard(context.Background(), func(_ int, data []byte) error { return fn(data) }))
}

func lastLine(s string) string {
	lines := strings.Split(strings.TrimRight(s, "\n"), "\n")
	return lines[len(lines)-1]
}
