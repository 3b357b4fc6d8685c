package train

import (
	"bytes"
	"context"
	"fmt"
	"io"
	"math"
	"os"
	"os/exec"
	"path/filepath"
	"runtime"
	"strconv"
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
)

// onPolicyTolerance is the acceptance bound of the on-policy identity
// (docs/train-stage.md §13): float32 on both sides, the engine's incremental
// KV-cache forward against the trainer's packed full forward.
const onPolicyTolerance = 1e-5

// TestOnPolicyIdentity is the on-policy identity end to end
// (docs/train-stage.md §13): kiln_gpu.serve serves the tiny Qwen3
// checkpoint, kiln-rollout run drives the shell agent in real bwrap
// sandboxes on the fixture tasks through kiln's adapter, kiln-advantages
// computes advantages from grades written here, and kiln-train runs the
// real trainer (python launcher, CPU, float32) on the same weights: every
// trained token's recomputed logprob equals the rollout logprob to 1e-5,
// so the first step's importance ratio is 1. Needs root or user
// namespaces and bwrap, the gpu venv and the Qwen3 tokenizer
// (scripts/install-test-deps.sh, scripts/install-gpu-deps.sh): skips
// without them, fails under CI=true.
func TestOnPolicyIdentity(t *testing.T) {
	if testing.Short() {
		t.Skip("serves a model, runs sandboxed agents and trains on CPU")
	}
	ge := gputest.Find(t)
	py, gpu := ge.Python, ge.Dir
	home, err := os.UserHomeDir()
	require.NoError(t, err)
	sandboxtest.Require(t)
	ctx := context.Background()
	root := t.TempDir()

	// The tiny checkpoint: served, and the trainer's base model.
	tiny := ge.Tiny(t)
	url := ge.Serve(t, tiny, "--seed", "5")

	// Tasks and images from the fixtures, the shell agent and the sandbox
	// helper built static (they run on the image's libc).
	tools := filepath.Join(root, "tools")
	require.NoError(t, os.MkdirAll(tools, 0o755))
	_, err = sandboxtest.BuildHelper(tools)
	require.NoError(t, err)
	goBin := filepath.Join(runtime.GOROOT(), "bin", "go")
	build := exec.Command(goBin, "build", "-o", filepath.Join(tools, harness.ShellAgentName), "github.com/kilnrl/kiln/cmd/kiln-agent")
	build.Env = append(os.Environ(), "CGO_ENABLED=0")
	out, err := build.CombinedOutput()
	require.NoError(t, err, "building kiln-agent: %s", out)
	set, err := fixtures.Load(ctx)
	require.NoError(t, err)
	storeDir := filepath.Join(root, "store")
	// The bundles kiln-grade's and kiln-rollout's tests unpack, reused.
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
	st, err := store.NewLocal(storeDir)
	require.NoError(t, err)

	// One sample per fixture task, a short answer each: the tiny model's
	// text parses to no tool call, so the shell agent ends after one turn,
	// whose sampled tokens the adapter records with their logprobs.
	var logs bytes.Buffer
	env := &stagecmd.Env{Stdout: io.Discard, Stderr: &logs, Log: stagecmd.NewLogger(&logs, false)}
	ro := rollout.RunOptions{Tasks: tasks, Images: r.LastLine(), Bundles: bundles, Engines: []string{url}, Mode: engine.ModeGenerate,
		TokenizerDir: tiny, Samples: 1, Agent: "shell", WeightsVersion: "tiny", Jobs: 4,
		Budget: time.Minute, SetupTimeout: 2 * time.Minute, Margin: 30 * time.Second,
		Temperature: 1, TopP: 1, TopK: -1, MaxTokens: 24, ReasoningParser: "qwen3", ToolParser: "qwen3_coder", MaxTurns: 2,
		Harness: harness.Options{ShellAgent: filepath.Join(tools, harness.ShellAgentName)},
		Sandbox: sandbox.Options{HelperPath: filepath.Join(tools, sandbox.HelperName)}}
	res, err := rollout.Run(ctx, env, st, rollout.RunOutput{Name: "rollout/onpolicy"}, ro)
	require.NoError(t, err, logs.String())
	var rows []records.Rollout
	eachShard(t, st, res.Rollouts.Ref, func(data []byte) error {
		return records.EachRollout(data, func(r records.Rollout) error { rows = append(rows, r); return nil })
	})
	require.Len(t, rows, len(set.Tasks), logs.String())
	var segs []records.Trajectory
	eachShard(t, st, res.Trajectories.Ref, func(data []byte) error {
		return records.EachTrajectory(data, func(tr *records.Trajectory) error { segs = append(segs, *tr); return nil })
	})
	trained := 0
	for _, s := range segs {
		for _, m := range s.LossMask {
			trained += int(m)
		}
	}
	require.Positive(t, trained, "the rollouts recorded no trained token:\n%s", logs.String())

	// Grades written here (the identity is about logprobs, not rewards):
	// reward 1 for every rollout, so the raw estimator gives every segment
	// advantage 1 and none is dropped.
	gref := putGrades(t, st, "grades/onpolicy", []dataset.Ref{res.Rollouts.Ref}, rows)
	var aout bytes.Buffer
	aenv := &stagecmd.Env{Stdout: &aout, Stderr: &logs, Log: stagecmd.NewLogger(&logs, false)}
	ares, err := advantages.Run(ctx, aenv, st, stagecmd.Output{Name: "advantages/onpolicy"}, advantages.RunOptions{
		Trajectories: res.Trajectories.Ref.String(), Grades: gref.String(),
		Options: advantages.Options{Estimator: advantages.Raw, StdEps: 1e-6, Infra: advantages.InfraExclude, MinGroupSize: 1}})
	require.NoError(t, err, logs.String())
	eachShard(t, st, ares.Ref, func(data []byte) error {
		return records.EachAdvantage(data, func(a *records.Advantage) error {
			assert.InDelta(t, 1, a.Advantage, 1e-12, "rollout %d segment %d", a.RolloutID, a.Segment)
			return nil
		})
	})

	// The real trainer, one step of every rollout, on the served weights,
	// with the rollout logprobs as PPO's old policy: then step 1's ratio is
	// trainer against sampler (with the default, recompute, it would be 1
	// by construction and its metrics could not fail).
	var tout, terr bytes.Buffer
	tenv := &stagecmd.Env{Stdout: &tout, Stderr: &terr, Log: stagecmd.NewLogger(&terr, false)}
	code := stagecmd.Main(App(tenv), []string{"kiln-train", "--store", storeDir, "--python", py, "--gpu-dir", gpu,
		"--cache-dir", filepath.Join(root, "cache"), "--work-dir", root,
		"--trajectories", res.Trajectories.Ref.String(), "--advantages", ares.Ref.String(), "--model", tiny, "--out", "ckpt/onpolicy",
		"--global-batch-size", strconv.Itoa(len(rows)), "--temperature", "1", "--lr", "1e-4", "--seed", "1",
		"--old-logprobs", "rollout"}, &terr)
	require.Equal(t, 0, code, "kiln-train stderr:\n%s", terr.String())
	v, err := dataset.OpenString(ctx, st, lastLine(tout.String()))
	require.NoError(t, err)
	sm, ok := v.Metrics["step_metrics"].(map[string]any)
	require.True(t, ok, "metrics: %v", v.Metrics)
	first := func(k string) float64 {
		col, ok := sm[k].([]any)
		require.True(t, ok && len(col) > 0, "step metric %s: %v", k, sm[k])
		f, ok := col[0].(float64)
		require.True(t, ok, "step metric %s[0] = %v", k, col[0])
		return f
	}
	mean, maxDiff := first("train_rollout_logprob_abs_diff"), first("train_rollout_logprob_max_abs_diff")
	t.Logf("on-policy identity: %d rollouts, %d segments, %d trained tokens: train vs rollout logprob |diff| mean %.3g, max %.3g (bound %g); ppo_kl %.3g, pg_clipfrac %v",
		len(rows), len(segs), trained, mean, maxDiff, onPolicyTolerance, first("ppo_kl"), first("pg_clipfrac"))
	assert.LessOrEqual(t, maxDiff, onPolicyTolerance, "max |trainer logprob - rollout logprob| over the trained tokens")
	assert.LessOrEqual(t, mean, onPolicyTolerance, "mean |trainer logprob - rollout logprob| over the trained tokens")
	// The ratio exp(lp - roll) is within the tolerance of 1 on every
	// trained token: nothing clipped (a token off by 0.2 nats would be),
	// and ppo_kl, the reduction of roll - lp, is at most the reduction of
	// |lp - roll| in size (a ppo_kl of other logprobs would not be).
	assert.Zero(t, first("pg_clipfrac"))
	assert.LessOrEqual(t, math.Abs(first("ppo_kl")), mean+1e-12, "|ppo_kl| against the mean |diff|")
}

// putGrades commits a grades version with reward 1 for every rollout row.
func putGrades(t *testing.T, st store.Store, name string, inputs []dataset.Ref, rows []records.Rollout) dataset.Ref {
	t.Helper()
	return put(t, st, name, records.GradesKind(), inputs, len(rows), func(w io.Writer) error {
		enc := records.NewGradeEncoder(w)
		for _, r := range rows {
			g := records.Grade{RolloutID: r.RolloutID, Index: r.Index, GroupIndex: r.GroupIndex, Sample: r.Sample, TaskID: r.TaskID,
				Reward: 1, Applied: true, ExitCode: 0, Failure: records.FailureNone}
			if err := enc.Write(g); err != nil {
				return fmt.Errorf("grade of rollout %d: %w", r.RolloutID, err)
			}
		}
		return enc.Close()
	})
}

func eachShard(t *testing.T, st store.Store, ref dataset.Ref, fn func([]byte) error) {
	t.Helper()
	v, err := dataset.Open(context.Background(), st, ref)
	require.NoError(t, err)
	require.NoError(t, v.EachShard(context.Background(), func(_ int, data []byte) error { return fn(data) }))
}
