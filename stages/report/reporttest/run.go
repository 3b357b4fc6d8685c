// Package reporttest writes a training run into a store for kiln report's
// tests and benchmark, without running agents or a trainer: per step a
// weights version, kiln-rollout's three outputs (rollouts, turns,
// trajectories, one version id), grades with grading logs as attachments,
// advantages computed by kiln-advantages itself (advantages.Run, GRPO), and
// a checkpoints version whose manifest carries the metrics kiln-train
// records (docs/train-stage.md §6.2) with made-up trainer numbers. Every row
// passes its kind's Validate, and the manifests' metrics use the stages'
// names, so what kiln report reads is what a real run leaves.
//
// Pipeline then records the run as a pipeline's targets (a spec whose
// recipes print the refs), so kiln report FILE.kiln and kiln status
// --table read it as they read a real run.
package reporttest

import (
	"context"
	"crypto/sha256"
	"encoding/hex"
	"encoding/json"
	"fmt"
	"io"
	"log/slog"
	"math"
	"math/rand/v2"
	"os"
	"path/filepath"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/kilnrl/kiln/formats/dataset"
	"github.com/kilnrl/kiln/formats/records"
	"github.com/kilnrl/kiln/formats/store"
	"github.com/kilnrl/kiln/internal/stagecmd"
	"github.com/kilnrl/kiln/pipelines"
	"github.com/kilnrl/kiln/stages/advantages"
)

// Options size the run.
type Options struct {
	// Prefix is the datasets' name prefix (default "run"): PREFIX/tasks,
	// PREFIX/weights, PREFIX/rollout/step-K/{rollouts,turns,trajectories},
	// PREFIX/grades/step-K, PREFIX/advantages/step-K,
	// PREFIX/checkpoints/step-K.
	Prefix string
	// Steps, Tasks, Samples (per task: the group size) and Turns (model
	// calls per rollout); defaults 3, 4, 4, 3.
	Steps, Tasks, Samples, Turns int
	// Staleness: rollout K samples from the weights published from
	// checkpoint K-1-Staleness (the base model below 1).
	Staleness int
	// OutputBytes is the size of each tool output in the conversations
	// (default 120).
	OutputBytes int
	// Seed makes the rewards and texts (default 1).
	Seed uint64
}

func (o *Options) defaults() {
	if o.Prefix == "" {
		o.Prefix = "run"
	}
	for _, p := range []*int{&o.Steps, &o.Tasks, &o.Samples, &o.Turns} {
		if *p == 0 {
			*p = map[*int]int{&o.Steps: 3, &o.Tasks: 4, &o.Samples: 4, &o.Turns: 3}[p]
		}
	}
	if o.OutputBytes == 0 {
		o.OutputBytes = 120
	}
	if o.Seed == 0 {
		o.Seed = 1
	}
}

// BaseModel is the base model directory the run names (an external input).
const BaseModel = "/models/tiny-qwen3"

// Step is one step's refs.
type Step struct {
	Weights, Rollouts, Turns, Trajectories, Grades, Advantages, Checkpoints dataset.Ref
}

// Run is what Write wrote.
type Run struct {
	Options
	Tasks dataset.Ref
	Steps []Step
}

// Write writes the run into st.
func Write(tb testing.TB, st store.Store, o Options) Run {
	tb.Helper()
	r, err := write(context.Background(), st, o)
	if err != nil {
		tb.Fatalf("reporttest: writing the run: %v", err)
	}
	return r
}

func write(ctx context.Context, st store.Store, o Options) (Run, error) {
	o.defaults()
	run := Run{Options: o}
	rng := rand.New(rand.NewPCG(o.Seed, 7))
	var err error
	taskIDs := make([]string, o.Tasks)
	var tasks []records.Task
	for g := range taskIDs {
		taskIDs[g] = fmt.Sprintf("task-%03d", g)
		ps := fmt.Sprintf("Fix bug %d in module m%d.", g, g)
		tasks = append(tasks, records.Task{TaskID: taskIDs[g], TaskIndex: int64(g), Prompt: `"fix it"`, ProblemStatement: &ps, Metadata: "{}"})
	}
	run.Tasks, err = commit(ctx, st, o.Prefix+"/tasks", records.TasksKind(), dataset.Identity{Stage: "convert", Args: map[string]any{"n": o.Tasks, "seed": o.Seed}}, nil, func(w io.Writer) error {
		enc := records.NewTaskEncoder(w)
		if err := enc.Write(tasks...); err != nil {
			return err
		}
		return enc.Close()
	}, len(tasks), map[string]any{"tasks": o.Tasks})
	if err != nil {
		return run, err
	}
	t0 := time.Date(2026, 1, 2, 3, 0, 0, 0, time.UTC)
	for k := 1; k <= o.Steps; k++ {
		var s Step
		// weights/k: the base model, or checkpoint k-1-Staleness.
		src := BaseModel
		var winputs []dataset.Ref
		if j := k - 1 - o.Staleness; j >= 1 {
			src = run.Steps[j-1].Checkpoints.String()
			winputs = []dataset.Ref{run.Steps[j-1].Checkpoints}
		}
		cfg := fmt.Sprintf(`{"model_type":"qwen3","step":%d}`, k)
		sum := sha256.Sum256([]byte(cfg))
		s.Weights, err = commit(ctx, st, o.Prefix+"/weights", records.WeightsKind(),
			dataset.Identity{Stage: "sync", Inputs: winputs, Args: map[string]any{"source": src, "n": k}}, nil, func(w io.Writer) error {
				enc, err := records.NewWeightsEncoder(w, records.ArrowOptions{})
				if err != nil {
					return err
				}
				if err := enc.Write(records.WeightsEntry{Entry: records.EntryFile, Name: "config.json", File: "config.json", Size: int64(len(cfg)),
					Checksum: hex.EncodeToString(sum[:]), Encoding: "stored", Payload: "config.json"}); err != nil {
					return err
				}
				return enc.Close()
			}, 1, map[string]any{"weights_number": float64(k), "source": src})
		if err != nil {
			return run, err
		}

		// rollout/k: the three outputs share one identity, so one version id.
		rid := dataset.Identity{Stage: "rollout-run", Inputs: []dataset.Ref{run.Tasks, s.Weights}, Args: map[string]any{"samples": o.Samples, "turns": o.Turns, "seed": o.Seed}}
		var rolls []records.Rollout
		var turns []records.Turn
		var segs []records.Trajectory
		var grades []records.Grade
		logs := map[int64]string{}
		metrics := map[string]any{"runs": 0.0, "aborted": 0.0, "turns": 0.0, "segments": 0.0, "patches": 0.0,
			"weights": s.Weights.String(), "weights_number": strconv.Itoa(k)}
		inc := func(key string, n int) { v, _ := metrics[key].(float64); metrics[key] = v + float64(n) }
		gm := map[string]any{"graded": 0.0, "reward_1": 0.0, "applied": 0.0}
		ginc := func(key string) { v, _ := gm[key].(float64); gm[key] = v + 1 }
		start := t0.Add(time.Duration(k) * time.Hour)
		for g := 0; g < o.Tasks; g++ {
			// Task g is learned from step g on (its pass chance rises);
			// the last task is never learned.
			p := 0.0
			if g < o.Tasks-1 || o.Tasks == 1 {
				p = math.Min(0.9, math.Max(0, 0.15*float64(k-g)+0.1))
			}
			for smp := 0; smp < o.Samples; smp++ {
				id := int64(g*o.Samples + smp)
				session := fmt.Sprintf("s%d-%d", k, id)
				nt := o.Turns
				var abort *string
				if (k*7+int(id)*3)%23 == 5 {
					r := "wall_clock_timeout"
					if id%2 == 1 {
						r = "engine_error"
					}
					abort, nt = &r, max(1, nt/2)
				}
				ro := records.Rollout{RolloutID: id, Index: id, GroupIndex: int64(g), Sample: int64(smp), TaskID: taskIDs[g], Agent: "shell",
					WeightsVersion: s.Weights.String(), Turns: int64(nt), StartedAt: start.Add(time.Duration(id) * time.Second)}
				if abort != nil {
					d := "the agent's budget ran out"
					ro.AbortReason, ro.AbortDetail, ro.AgentExitCode = abort, &d, -1
				}
				msgs := []map[string]any{{"role": "system", "content": "You are a coding agent. Use the bash tool."},
					{"role": "user", "content": fmt.Sprintf("Fix the issue in PROBLEM_STATEMENT.md (task %s).", taskIDs[g])}}
				var prompt []int32
				for range 12 {
					prompt = append(prompt, int32(rng.IntN(1000)))
				}
				var seg records.Trajectory
				seg = records.Trajectory{RolloutID: id, Index: id, GroupIndex: int64(g)}
				var promptTokens, outTokens int64
				pass := abort == nil && rng.Float64() < p
				for i := 0; i < nt; i++ {
					pm, _ := json.Marshal(msgs)
					last := i == nt-1
					cmd := fmt.Sprintf("grep -n bug%d src/m%d.py", g, g)
					if last {
						cmd = fmt.Sprintf("sed -i 's/bug%d/fix%d/' src/m%d.py", g, g, g)
					}
					resp := map[string]any{"role": "assistant", "content": fmt.Sprintf("Step %d: I run %s.", i+1, "`"+cmd+"`"),
						"reasoning_content": fmt.Sprintf("The bug is likely in m%d; turn %d of %d.", g, i+1, nt),
						"tool_calls":        []any{map[string]any{"type": "function", "function": map[string]any{"name": "bash", "arguments": map[string]any{"cmd": cmd}}}}}
					rm, _ := json.Marshal(resp)
					rms := string(rm)
					nout := 6 + rng.IntN(10)
					out := make([]int32, nout)
					lps := make([]float32, nout)
					for j := range out {
						out[j] = int32(rng.IntN(1000))
						lps[j] = -float32(rng.Float64() * 3)
					}
					ms := start.UnixMilli() + int64(i)*1000
					dur := int64(200 + rng.IntN(800))
					turns = append(turns, records.Turn{RolloutID: id, Index: id, GroupIndex: int64(g), Session: session, Turn: int32(i),
						PromptIDs: append([]int32(nil), prompt...), OutputIDs: out, OutputLogProbs: lps, FinishReason: "stop",
						PromptMessages: string(pm), ResponseMessage: &rms, MaxContextTokens: 4096, StartedMs: &ms, DurationMs: &dur})
					promptTokens += int64(len(prompt))
					outTokens += int64(nout)
					// The segment: the first prompt, then every output
					// (trained) and tool output (context) after it.
					if i == 0 {
						seg.Tokens = append(seg.Tokens, prompt...)
					}
					seg.Tokens = append(seg.Tokens, out...)
					for j := range out {
						seg.LossMask = append(seg.LossMask, 1)
						seg.RolloutLogProbs = append(seg.RolloutLogProbs, lps[j])
					}
					toolOut := toolOutput(rng, o.OutputBytes, g, i)
					msgs = append(msgs, resp, map[string]any{"role": "tool", "content": toolOut})
					prompt = append(prompt, out...)
					if !last {
						ctxToks := make([]int32, 4)
						for j := range ctxToks {
							ctxToks[j] = int32(rng.IntN(1000))
						}
						prompt = append(prompt, ctxToks...)
						seg.Tokens = append(seg.Tokens, ctxToks...)
						for range ctxToks {
							seg.LossMask = append(seg.LossMask, 0)
							seg.RolloutLogProbs = append(seg.RolloutLogProbs, 0)
						}
					}
				}
				seg.UseTool = true
				seg.ResponseLength = int32(len(seg.LossMask))
				segs = append(segs, seg)
				ro.PromptTokens, ro.OutputTokens = promptTokens, outTokens
				ro.EndedAt = ro.StartedAt.Add(time.Duration(nt) * time.Second)
				if abort == nil {
					ro.Patch = fmt.Sprintf("diff --git a/src/m%d.py b/src/m%d.py\n--- a/src/m%d.py\n+++ b/src/m%d.py\n@@ -1 +1 @@\n-x = bug%d()\n+x = fix%d()\n", g, g, g, g, g, g)
					inc("patches", 1)
				}
				rolls = append(rolls, ro)
				inc("runs", 1)
				inc("turns", nt)
				inc("segments", 1)
				if abort != nil {
					inc("aborted", 1)
					inc("abort_"+*abort, 1)
				}

				gr := records.Grade{RolloutID: id, Index: id, GroupIndex: int64(g), Sample: int64(smp), TaskID: taskIDs[g], ExitCode: -1,
					DurationMS: int64(500 + rng.IntN(1000))}
				switch {
				case abort != nil:
					e := "the rollout was aborted: " + *abort
					gr.Failure, gr.Error = records.FailureAborted, &e
				case pass:
					m := "git_apply"
					gr.Reward, gr.Applied, gr.ApplyMethod, gr.ExitCode, gr.Failure = 1, true, &m, 0, records.FailureNone
					ginc("reward_1")
					ginc("applied")
				case rng.IntN(5) == 0:
					e := "patch does not apply: hunk #1 FAILED"
					gr.Failure, gr.Error = records.FailurePatchFailed, &e
				default:
					m := "git_apply"
					gr.Applied, gr.ApplyMethod, gr.ExitCode, gr.Failure = true, &m, 1, records.FailureTestsFailed
					ginc("applied")
				}
				ginc("graded")
				ginc("failure_" + gr.Failure)
				logs[id] = fmt.Sprintf("$ git apply patch.diff\n$ python -m pytest tests/test_m%d.py\n%s\nexit %d\n", g, map[bool]string{true: "1 passed", false: "1 failed"}[gr.Reward == 1], gr.ExitCode)
				grades = append(grades, gr)
			}
		}
		name := fmt.Sprintf("%s/rollout/step-%d", o.Prefix, k)
		if s.Rollouts, err = commit(ctx, st, name+"/rollouts", records.RolloutsKind(), rid, nil, func(w io.Writer) error {
			enc := records.NewRolloutEncoder(w)
			if err := enc.Write(rolls...); err != nil {
				return err
			}
			return enc.Close()
		}, len(rolls), metrics); err != nil {
			return run, err
		}
		if s.Turns, err = commit(ctx, st, name+"/turns", records.TurnsKind(), rid, nil, func(w io.Writer) error {
			enc, err := records.NewTurnEncoder(w, records.ArrowOptions{})
			if err != nil {
				return err
			}
			if err := enc.Write(turns...); err != nil {
				return err
			}
			return enc.Close()
		}, len(turns), metrics); err != nil {
			return run, err
		}
		if s.Trajectories, err = commit(ctx, st, name+"/trajectories", records.TrajectoriesKind(), rid, nil, func(w io.Writer) error {
			enc, err := records.NewTrajectoryEncoder(w, records.ArrowOptions{})
			if err != nil {
				return err
			}
			if err := enc.Write(segs...); err != nil {
				return err
			}
			return enc.Close()
		}, len(segs), metrics); err != nil {
			return run, err
		}

		// grade/k, its logs as attachments.
		gid := dataset.Identity{Stage: "grade", Inputs: []dataset.Ref{s.Rollouts, run.Tasks}}
		gname := fmt.Sprintf("%s/grades/step-%d", o.Prefix, k)
		if s.Grades, err = commit(ctx, st, gname, records.GradesKind(), gid, func(ref dataset.Ref) error {
			for i := range grades {
				rel := fmt.Sprintf("logs/%d.log", grades[i].RolloutID)
				key := dataset.AttachmentKey(ref, rel)
				if _, err := st.Put(ctx, key, strings.NewReader(logs[grades[i].RolloutID]), int64(len(logs[grades[i].RolloutID]))); err != nil {
					return err
				}
				grades[i].Log = &key
			}
			return nil
		}, func(w io.Writer) error {
			enc := records.NewGradeEncoder(w)
			if err := enc.Write(grades...); err != nil {
				return err
			}
			return enc.Close()
		}, len(grades), gm); err != nil {
			return run, err
		}

		// advantages/k: kiln-advantages itself.
		env := &stagecmd.Env{Stdout: io.Discard, Stderr: io.Discard, Log: slog.New(slog.NewTextHandler(io.Discard, nil))}
		ares, err := advantages.Run(ctx, env, st, stagecmd.Output{Name: fmt.Sprintf("%s/advantages/step-%d", o.Prefix, k)}, advantages.RunOptions{
			Trajectories: s.Trajectories.String(), Grades: s.Grades.String(),
			Options: advantages.Options{Estimator: advantages.GRPO, StdEps: 1e-6, Infra: advantages.InfraExclude, MinGroupSize: 2}})
		if err != nil {
			return run, fmt.Errorf("advantages of step %d: %w", k, err)
		}
		s.Advantages = ares.Ref

		// train/k: kiln-train's manifest, the trainer's numbers made up.
		var trained int64
		for _, sg := range segs {
			for _, m := range sg.LossMask {
				trained += int64(m)
			}
		}
		base := BaseModel
		cinputs := []dataset.Ref{s.Trajectories, s.Advantages}
		var ext []dataset.External
		if k > 1 {
			base = run.Steps[k-2].Checkpoints.String()
			cinputs = append(cinputs, run.Steps[k-2].Checkpoints)
		} else {
			ext = []dataset.External{{Role: "model", URI: BaseModel, SHA256: strings.Repeat("ab", 32), Size: 1}}
		}
		fk := float64(k)
		cm := map[string]any{"steps": 2.0, "segments": float64(len(segs)), "rollouts_trained": float64(len(segs)), "base_model": base,
			"tokens": float64(trained * 3), "trained_tokens": float64(trained), "micro_batches": 2.0,
			"generated_with_weights": []any{map[string]any{"weights": s.Weights.String(), "weights_number": fk}},
			"step_metrics": map[string]any{
				"loss":                               []any{0.5 / fk, 0.3 / fk},
				"pg_clipfrac":                        []any{0.01 * fk, 0.02 * fk},
				"ppo_kl":                             []any{0.0, 0.001 * fk},
				"train_rollout_logprob_max_abs_diff": []any{0.001 * fk, 0.002 * fk},
				"grad_norm":                          []any{1.0 + fk, 2.0 + fk},
				"entropy":                            []any{nil, nil},
				"kl_loss":                            []any{0.0, 0.0},
			}}
		if k > 1 {
			cm["resume_from"] = base
		}
		if s.Checkpoints, err = commit(ctx, st, fmt.Sprintf("%s/checkpoints/step-%d", o.Prefix, k), records.CheckpointsKind(),
			dataset.Identity{Stage: "train", Inputs: cinputs, External: ext, Args: map[string]any{"lr": 1e-5}}, nil, func(w io.Writer) error {
				enc, err := records.NewCheckpointEncoder(w, records.ArrowOptions{})
				if err != nil {
					return err
				}
				if err := enc.Write(records.CheckpointFile{Name: "config.json", Size: int64(len(cfg)), SHA256: hex.EncodeToString(sum[:])}); err != nil {
					return err
				}
				return enc.Close()
			}, 1, cm); err != nil {
			return run, err
		}
		run.Steps = append(run.Steps, s)
	}
	return run, nil
}

// toolOutput is a tool's output of about n bytes.
func toolOutput(rng *rand.Rand, n, g, i int) string {
	var b strings.Builder
	for line := 1; b.Len() < n; line++ {
		fmt.Fprintf(&b, "src/m%d.py:%d: x = bug%d()  # %x\n", g, line+i, g, rng.Uint32())
	}
	return b.String()
}

// commit writes one version: attach (given the version's ref, before the
// commit) stores its attachments, encode its one shard.
func commit(ctx context.Context, st store.Store, name string, kind records.Kind, id dataset.Identity, attach func(dataset.Ref) error,
	encode func(io.Writer) error, rows int, metrics map[string]any) (dataset.Ref, error) {
	w, err := dataset.NewWriter(ctx, st, dataset.Spec{Name: name, Kind: kind, Identity: id})
	if err != nil {
		return dataset.Ref{}, err
	}
	if ex := w.Existing(); ex != nil {
		return ex.Ref(), nil
	}
	if attach != nil {
		if err := attach(w.Ref()); err != nil {
			return dataset.Ref{}, err
		}
	}
	if _, err := w.WriteShard(ctx, int64(rows), nil, encode); err != nil {
		return dataset.Ref{}, err
	}
	res, err := w.Commit(ctx, metrics)
	if err != nil {
		return dataset.Ref{}, err
	}
	return res.Ref, nil
}

// Pipeline records run as the targets of a pipeline named name in st:
// it writes DIR/NAME.kiln, whose recipes print the run's refs (tasks,
// then per step weights/K, rollout/K, grade/K, advantages/K, train/K),
// and runs it, so the store holds its record as after kiln run. It returns
// the spec's path and the variables it needs (none: the refs are in the
// file).
func Pipeline(tb testing.TB, st store.Store, dir, name string, run Run) string {
	tb.Helper()
	var b strings.Builder
	p := run.Prefix
	fmt.Fprintf(&b, "PIPELINE = %s\nSTEPS ?= %d\n", name, len(run.Steps))
	for i, s := range run.Steps {
		k := i + 1
		fmt.Fprintf(&b, "W.%d = %s\nR.%d = %s %s %s\nG.%d = %s\nA.%d = %s\nC.%d = %s\n", k, s.Weights, k, s.Rollouts, s.Turns, s.Trajectories,
			k, s.Grades, k, s.Advantages, k, s.Checkpoints)
	}
	fmt.Fprintf(&b, "W =\nR =\nG =\nA =\nC =\nPREV = train/$(step-1)\nPREV.0 =\n")
	fmt.Fprintf(&b, "tasks: [out=%s/tasks]\n\techo %s\n", p, run.Tasks)
	fmt.Fprintf(&b, "weights/$(step): [out=%s/weights] tasks $(PREV.$(step-1))\n\techo $(W.$(step))\n", p)
	fmt.Fprintf(&b, "rollout/$(step): [out=%s/rollout/step-$(step)] tasks weights/$(step)\n\tprintf '%%s\\n' $(R.$(step))\n", p)
	fmt.Fprintf(&b, "grade/$(step): [out=%s/grades/step-$(step)] rollout/$(step)\n\techo $(G.$(step))\n", p)
	fmt.Fprintf(&b, "advantages/$(step): [out=%s/advantages/step-$(step)] rollout/$(step) grade/$(step)\n\techo $(A.$(step))\n", p)
	fmt.Fprintf(&b, "train/$(step): [out=%s/checkpoints/step-$(step)] rollout/$(step) advantages/$(step) $(PREV.$(step-1))\n\techo $(C.$(step))\n", p)
	file := filepath.Join(dir, name+".kiln")
	if err := os.WriteFile(file, []byte(b.String()), 0o644); err != nil {
		tb.Fatal(err)
	}
	ctx := context.Background()
	spec, err := pipelines.Load(file, nil, nil)
	if err != nil {
		tb.Fatalf("reporttest: %s: %v\n%s", file, err, b.String())
	}
	plan, err := pipelines.NewPlan(ctx, spec, pipelines.PlanOptions{Store: st, Log: slog.New(slog.NewTextHandler(io.Discard, nil))})
	if err != nil {
		tb.Fatalf("reporttest: planning %s: %v", file, err)
	}
	if _, err := plan.Run(ctx, pipelines.RunOptions{}); err != nil {
		tb.Fatalf("reporttest: running %s: %v", file, err)
	}
	return file
}
