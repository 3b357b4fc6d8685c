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
	"github.com/kilnrl/kiln/internal/testenv"
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
// checkpoint, kiln-rollout run drives agents in real bwrap sandboxes on the
// fixture tasks through kiln's adapter, kiln-advantages computes advantages
// from grades written here, and kiln-train runs the real trainer (python
// launcher, CPU, float32) on the same weights: every trained token's
// recomputed logprob equals the rollout logprob to 1e-5. One case per way
// the two sides could part (identityCases): the temperature, multi-turn
// prefix reuse (several sampled spans in one trained sequence), the top-p
// and top-k cuts, and the real Claude Code and Codex CLIs' prompts. Needs
// root or user namespaces and bwrap, the gpu venv and the Qwen3 tokenizer
// (scripts/install-test-deps.sh, scripts/install-gpu-deps.sh), and for the
// CLI case the pinned CLIs: skips without them, fails under CI=true.
func TestOnPolicyIdentity(t *testing.T) {
	if testing.Short() {
		t.Skip("serves a model, runs sandboxed agents and trains on CPU")
	}
	w := newIdentityWorld(t)
	for _, c := range identityCases {
		t.Run(c.name, func(t *testing.T) { w.check(t, c) })
	}
}

// identityCase is one rollout-then-train of TestOnPolicyIdentity.
type identityCase struct {
	name string
	// agents is the tasks' agent column, cycling over the fixture tasks
	// (nil: the shell harness for every task).
	agents []string
	// followup runs testdata/followup as the shell harness's binary (a
	// client that echoes each reply and asks again) instead of kiln-agent.
	followup bool
	// ends runs the case on the checkpoint whose turns end (kiln_gpu.tiny
	// --end-rate): the adapter reuses only the tokens of a turn that
	// finished "stop", and the CLIs fail a turn cut at max_tokens.
	ends        bool
	temperature float64
	topP        float64
	topK        int
	maxTurns    int
	maxTokens   int
}

var identityCases = []identityCase{
	// The shell agent, T = 1: the random model's text parses to no tool
	// call, so each agent ends after one turn.
	{name: "shell", temperature: 1, topP: 1, topK: -1, maxTurns: 2, maxTokens: 24},
	// Three turns whose prompts extend the last prompt and output: the
	// adapter reuses the recorded tokens, assembly merges the turns into
	// one segment, and the trainer scores three sampled spans, with the
	// rendered follow-ups between them as context, in one sequence, at T =
	// 0.7 (the trainer divides by T as the sampler does).
	{name: "multi-turn-prefix-reuse-T0.7", followup: true, ends: true, temperature: 0.7, topP: 1, topK: -1, maxTurns: 3, maxTokens: 64},
	// Top-p: the sampler records each token's nucleus and the trainer
	// replays it (docs/train.md §8.2); the logprob compared is still the
	// full-vocabulary one before the cut (docs/serve.md §4).
	{name: "top-p-0.9", temperature: 1, topP: 0.9, topK: -1, maxTurns: 2, maxTokens: 24},
	// Top-k alone (no nucleus is recorded at top_p 1): the sampler draws
	// from 20 ids, the logprob is still the full-vocabulary one.
	{name: "top-k-20-T0.8", temperature: 0.8, topP: 1, topK: 20, maxTurns: 2, maxTokens: 24},
	// The real CLIs, half the tasks each: their own system prompts, tools
	// and chat turns rendered by the real Qwen3 chat template.
	{name: "claude-code-and-codex", agents: []string{harness.ClaudeCodeName, harness.CodexName}, ends: true,
		temperature: 0.7, topP: 1, topK: -1, maxTurns: 4, maxTokens: 64},
}

// identityWorld is what the cases share: one served checkpoint, the store
// with the fixture tasks and images, the agents' binaries.
type identityWorld struct {
	ge                            gputest.Env
	tiny, url, root, storeDir     string
	tinyEnd, urlEnd               string
	bundles, tasks, images, tools string
	st                            store.Store
	set                           *fixtures.Set
}

func newIdentityWorld(t *testing.T) *identityWorld {
	w := &identityWorld{ge: gputest.Find(t)}
	home, err := os.UserHomeDir()
	require.NoError(t, err)
	sandboxtest.Require(t)
	ctx := context.Background()
	w.root = t.TempDir()

	// The tiny checkpoint: served, and the trainer's base model. The
	// random model all but never samples <|im_end|>, so its turns end at
	// max_tokens; the second checkpoint ends them (about 1 sample in 10 at
	// T = 0.7 is <|im_end|>, kiln_gpu.tiny --end-rate) and has the context
	// the CLIs' system prompts and tool schemas need (Claude Code's first
	// prompt is over 5,000 tokens).
	w.tiny = w.ge.Tiny(t)
	w.url = w.ge.Serve(t, w.tiny, "--seed", "5")
	w.tinyEnd = w.ge.Tiny(t, "--max-position-embeddings", "32768", "--end-rate", "0.006")
	w.urlEnd = w.ge.Serve(t, w.tinyEnd, "--seed", "5")

	// Tasks and images from the fixtures, the shell agent, the follow-up
	// client and the sandbox helper built static (they run on the image's
	// libc).
	w.tools = filepath.Join(w.root, "tools")
	require.NoError(t, os.MkdirAll(w.tools, 0o755))
	_, err = sandboxtest.BuildHelper(w.tools)
	require.NoError(t, err)
	goBin := filepath.Join(runtime.GOROOT(), "bin", "go")
	for bin, pkg := range map[string]string{harness.ShellAgentName: "github.com/kilnrl/kiln/cmd/kiln-agent", "followup": "./testdata/followup"} {
		build := exec.Command(goBin, "build", "-o", filepath.Join(w.tools, bin), pkg)
		build.Env = append(os.Environ(), "CGO_ENABLED=0")
		out, err := build.CombinedOutput()
		require.NoError(t, err, "building %s: %s", pkg, out)
	}
	w.set, err = fixtures.Load(ctx)
	require.NoError(t, err)
	w.storeDir = filepath.Join(w.root, "store")
	// The bundles kiln-grade's and kiln-rollout's tests unpack, reused.
	w.bundles = filepath.Join(home, ".cache", "kiln", "grade-test-bundles-"+fixtures.GeneratorVersion)
	cmds := func(env *stagecmd.Env) []*cli.Command {
		return append(convert.Commands(env), images.Commands(env)...)
	}
	r := stagetest.Run(t, cmds, "mimo", "--store", w.storeDir, "--data", w.set.MiMoDir, "--out", "tasks")
	require.Equal(t, 0, r.Code, r.Stderr)
	w.tasks = r.LastLine()
	r = stagetest.Run(t, cmds, "import", "--store", w.storeDir, "--tasks", w.tasks, "--root", w.bundles,
		"--source", w.set.Repository+"="+"oci:"+w.set.Layout, "--out", "images")
	require.Equal(t, 0, r.Code, r.Stderr)
	w.images = r.LastLine()
	w.st, err = store.NewLocal(w.storeDir)
	require.NoError(t, err)
	return w
}

// check rolls out one sample per fixture task under c against the served
// checkpoint, trains one step of every rollout on the same weights, and
// holds the trainer's logprobs to the sampler's.
func (w *identityWorld) check(t *testing.T, c identityCase) {
	ctx := context.Background()
	tasks := w.tasks
	if c.agents != nil {
		for _, name := range c.agents {
			if _, err := harness.New(name, harness.Options{}); err != nil {
				testenv.SkipOrFail(t, "%s CLI not available (%v): run scripts/install-test-deps.sh", name, err)
			}
		}
		tasks = w.tasksWithAgents(t, "tasks/"+c.name, c.agents)
	}
	tiny, url := w.tiny, w.url
	if c.ends {
		tiny, url = w.tinyEnd, w.urlEnd
	}
	agent := filepath.Join(w.tools, harness.ShellAgentName)
	if c.followup {
		agent = filepath.Join(w.tools, "followup")
	}
	var logs bytes.Buffer
	env := &stagecmd.Env{Stdout: io.Discard, Stderr: &logs, Log: stagecmd.NewLogger(&logs, false)}
	ro := rollout.RunOptions{Tasks: tasks, Images: w.images, Bundles: w.bundles, Engines: []string{url}, Mode: engine.ModeGenerate,
		TokenizerDir: tiny, Samples: 1, Agent: "shell", WeightsVersion: "tiny", Jobs: 4,
		Budget: 2 * time.Minute, SetupTimeout: 2 * time.Minute, Margin: 30 * time.Second,
		Temperature: c.temperature, TopP: c.topP, TopK: c.topK, MaxTokens: c.maxTokens,
		ReasoningParser: "qwen3", ToolParser: "qwen3_coder", MaxTurns: c.maxTurns,
		Harness: harness.Options{ShellAgent: agent},
		Sandbox: sandbox.Options{HelperPath: filepath.Join(w.tools, sandbox.HelperName)}}
	res, err := rollout.Run(ctx, env, w.st, rollout.RunOutput{Name: "rollout/" + c.name}, ro)
	require.NoError(t, err, logs.String())
	var rows []records.Rollout
	eachShard(t, w.st, res.Rollouts.Ref, func(data []byte) error {
		return records.EachRollout(data, func(r records.Rollout) error { rows = append(rows, r); return nil })
	})
	require.Len(t, rows, len(w.set.Tasks), logs.String())
	agents := map[string]int{}
	turns := 0
	for _, r := range rows {
		require.Nil(t, r.AbortReason, "%s (%s) aborted\n%s", r.TaskID, r.Agent, logs.String())
		if !assert.EqualValues(t, 0, r.AgentExitCode, "%s (%s): the agent's exit code", r.TaskID, r.Agent) && r.Artifacts != nil {
			_ = w.st.List(ctx, *r.Artifacts, func(i store.Info) error {
				b, _, _ := store.ReadAll(ctx, w.st, i.Key)
				t.Logf("%s:\n%s", i.Key, b[:min(len(b), 4000)])
				return nil
			})
		}
		assert.Positive(t, r.Turns, "%s (%s): model calls recorded", r.TaskID, r.Agent)
		agents[r.Agent]++
		turns += int(r.Turns)
	}
	for _, a := range c.agents {
		assert.Positive(t, agents[a], "no rollout ran %s: %v", a, agents)
	}
	var segs []records.Trajectory
	eachShard(t, w.st, res.Trajectories.Ref, func(data []byte) error {
		return records.EachTrajectory(data, func(tr *records.Trajectory) error { segs = append(segs, *tr); return nil })
	})
	trained, maxSpans, promptLen := 0, 0, 0
	for _, s := range segs {
		spans, prev := 0, uint8(0)
		for _, m := range s.LossMask {
			trained += int(m)
			if m == 1 && prev == 0 {
				spans++
			}
			prev = m
		}
		maxSpans = max(maxSpans, spans)
		promptLen = max(promptLen, len(s.Tokens)-int(s.ResponseLength))
		if c.topP < 1 {
			require.Len(t, s.Replay.TopPTokenOffsets, int(s.ResponseLength)+1,
				"rollout %d segment %d: top-p %g records each token's nucleus", s.RolloutID, s.Segment, c.topP)
		}
	}
	require.Positive(t, trained, "the rollouts recorded no trained token:\n%s", logs.String())
	if c.followup {
		// every follow-up turn reused the prefix: one segment per rollout,
		// each with a sampled span per turn
		assert.Len(t, segs, len(rows), "segments of %d rollouts of %d turns", len(rows), turns)
		assert.Equal(t, c.maxTurns, maxSpans, "sampled spans in one segment")
		assert.Equal(t, c.maxTurns*len(rows), turns)
	}

	// Grades written here (the identity is about logprobs, not rewards):
	// reward 1 for every rollout, so the raw estimator gives every segment
	// advantage 1 and none is dropped.
	gref := putGrades(t, w.st, "grades/"+c.name, []dataset.Ref{res.Rollouts.Ref}, rows)
	var aout bytes.Buffer
	aenv := &stagecmd.Env{Stdout: &aout, Stderr: &logs, Log: stagecmd.NewLogger(&logs, false)}
	ares, err := advantages.Run(ctx, aenv, w.st, stagecmd.Output{Name: "advantages/" + c.name}, advantages.RunOptions{
		Trajectories: res.Trajectories.Ref.String(), Grades: gref.String(),
		Options: advantages.Options{Estimator: advantages.Raw, StdEps: 1e-6, Infra: advantages.InfraExclude, MinGroupSize: 1}})
	require.NoError(t, err, logs.String())
	eachShard(t, w.st, ares.Ref, func(data []byte) error {
		return records.EachAdvantage(data, func(a *records.Advantage) error {
			assert.InDelta(t, 1, a.Advantage, 1e-12, "rollout %d segment %d", a.RolloutID, a.Segment)
			return nil
		})
	})

	// The real trainer, one step of every rollout, on the served weights,
	// at the sampling temperature, with the rollout logprobs as PPO's old
	// policy: then step 1's ratio is trainer against sampler (with the
	// default, recompute, it would be 1 by construction and its metrics
	// could not fail).
	var tout, terr bytes.Buffer
	tenv := &stagecmd.Env{Stdout: &tout, Stderr: &terr, Log: stagecmd.NewLogger(&terr, false)}
	code := stagecmd.Main(App(tenv), []string{"kiln-train", "--store", w.storeDir, "--python", w.ge.Python, "--gpu-dir", w.ge.Dir,
		"--cache-dir", filepath.Join(w.root, "cache"), "--work-dir", w.root,
		"--trajectories", res.Trajectories.Ref.String(), "--advantages", ares.Ref.String(), "--model", tiny, "--out", "ckpt/" + c.name,
		"--global-batch-size", strconv.Itoa(len(rows)), "--temperature", strconv.FormatFloat(c.temperature, 'g', -1, 64),
		"--lr", "1e-4", "--seed", "1", "--old-logprobs", "rollout"}, &terr)
	require.Equal(t, 0, code, "kiln-train stderr:\n%s", terr.String())
	v, err := dataset.OpenString(ctx, w.st, lastLine(tout.String()))
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
	t.Logf("on-policy identity (%s): %d rollouts %v, %d turns, %d segments (longest prompt %d tokens, at most %d sampled spans in one), %d trained tokens: "+
		"train vs rollout logprob |diff| mean %.3g, max %.3g (bound %g); ppo_kl %.3g, pg_clipfrac %v",
		c.name, len(rows), agents, turns, len(segs), promptLen, maxSpans, trained, mean, maxDiff, onPolicyTolerance, first("ppo_kl"), first("pg_clipfrac"))
	// The full-vocabulary logprob of every trained token, as the sampler
	// reports it before any top-k/top-p cut (docs/serve.md §4).
	assert.LessOrEqual(t, maxDiff, onPolicyTolerance, "max |trainer logprob - rollout logprob| over the trained tokens")
	if c.topP < 1 {
		// Under top-p replay the trained lp is renormalised on the recorded
		// nucleus S (docs/train.md §8.2), so lp - roll = -log p(S) with p
		// the trainer's distribution: the mean is positive (the nucleus is
		// used) and at most -log(top_p) (the trainer puts at least top_p
		// of its mass on the sampler's nucleus, as the sampler did).
		assert.Greater(t, mean, 1e-4, "mean |lp - roll| with the nucleus replayed")
		assert.LessOrEqual(t, mean, -math.Log(c.topP)+onPolicyTolerance, "mean -log p(nucleus) against -log(top_p)")
	} else {
		assert.LessOrEqual(t, mean, onPolicyTolerance, "mean |trainer logprob - rollout logprob| over the trained tokens")
	}
	// The ratio exp(lp - roll) is within [0.8, 1.2] on every trained token
	// (1 within the tolerance; at most 1/top_p under top-p): nothing
	// clipped (a token off by 0.2 nats would be), and ppo_kl, the reduction
	// of roll - lp, is at most the reduction of |lp - roll| in size (a
	// ppo_kl of other logprobs would not be).
	assert.Zero(t, first("pg_clipfrac"))
	assert.LessOrEqual(t, math.Abs(first("ppo_kl")), mean+1e-12, "|ppo_kl| against the mean |diff|")
}

// tasksWithAgents commits the world's tasks with the agent column cycling
// through agents, as a new tasks version.
func (w *identityWorld) tasksWithAgents(t *testing.T, name string, agents []string) string {
	ctx := context.Background()
	v, err := dataset.OpenString(ctx, w.st, w.tasks)
	require.NoError(t, err)
	var rows []records.Task
	require.NoError(t, v.EachShard(ctx, func(_ int, data []byte) error {
		return records.EachTask(data, func(tk records.Task) error { rows = append(rows, tk); return nil })
	}))
	for i := range rows {
		rows[i].Agent = &agents[i%len(agents)]
	}
	return put(t, w.st, name, records.TasksKind(), nil, len(rows), func(out io.Writer) error {
		enc := records.NewTaskEncoder(out)
		if err := enc.Write(rows...); err != nil {
			return err
		}
		return enc.Close()
	}).String()
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
