package rollout

import (
	"runtime"
	"strconv"
	"strings"

	"github.com/urfave/cli/v2"

	"github.com/kilnrl/kiln/internal/agent/engine"
	"github.com/kilnrl/kiln/internal/agent/harness"
	"github.com/kilnrl/kiln/internal/stagecmd"
)

// runHelp is kiln-rollout run's manual.
const runHelp = `Runs a coding agent on every task × sample in a sandbox booted from the task's
image bundle, every model call through kiln's adapter to the policy engine, and
commits what the later stages read (docs/rollout.md): OUT/rollouts (one row per
run with its patch; kiln-grade --rollouts grades it), OUT/turns (every model
call's exact prompt ids, output ids and logprobs) and OUT/trajectories (the
training segments assembled from the turns), trajectories last. The three
references are the last lines of stdout, trajectories last.

One run: open an adapter session (a random token, the agent's API key); boot
the sandbox (its one way out is the adapter); prepare the workspace (the agent
user, pre_commands, PROBLEM_STATEMENT.md; the baseline snapshot); run the
harness as agent within --budget; capture the patch (tree diff against the
baseline); finish the session into turn records; assemble them into segments.
The whole run ends by --budget + --setup-timeout + --deadline-margin.

A run that cannot give a trainable sample is a rollouts row with abort_reason
and no turns or segments: missing_image_or_workdir (no image, no workdir, or
the bundle is not on this node), adapter_session_empty (no model call),
wall_clock_timeout (the whole-run deadline), engine_error (model calls failed
with a server error and the agent gave up, or the run's engine failed its
health check), agent_crash (exit 126 or more: not
runnable, or killed by a signal), exception:<step> (sandbox boot, workspace,
patch capture, assembly). An agent out of --budget is killed; its row has
agent_exit_code -1 and its patch and turns are kept.

Ids: index = rollout_id = task_index × --samples + sample; group_index is the
task's task_index. They are the same on every rerun.

Harnesses: --agent (env KILN_AGENT) is the default; a task's agent column
overrides it. Built: shell (kiln-agent, found beside this binary or on PATH,
or --agent-binary; bound read-only into the sandbox). claude-code and codex
are named but not built yet.

Engines: --engine URL[,URL...]; a session goes to one engine by a hash of its
token. Every engine is probed at start; if one fails, nothing runs. While runs
go, GET /health is checked every 15 s: a failing engine is left out and its
running runs abort (engine_error); with none left the stage exits 1.

Resumable: runs are committed in batches with row receipts, so a rerun of the
same command runs only what is missing. SIGINT/SIGTERM stops starting runs,
abandons the running ones (preempted: not written, the rerun redoes them),
writes what finished and exits 130. --shard i/n runs every n-th task (inputs
pinned, name@version). The sampling flags, --samples, --agent, --budget,
--weights-version, --split and --max-turns are part of the version id; the
engine URLs, -j and --shard are not.

Example:
   kiln-rollout run --tasks tasks@V --images images@V --bundles /var/lib/kiln/bundles \
       --engine http://gpu1:8000,http://gpu2:8000 --tokenizer-dir /models/qwen3 \
       --samples 8 --weights-version step-3 --out rollout/step-3`

func runCommand(env *stagecmd.Env) *cli.Command {
	return &cli.Command{
		Name:        "run",
		Usage:       "run coding agents in sandboxes against the policy and record rollouts, turns and trajectories",
		Description: runHelp,
		Flags:       runFlags(),
		Action:      func(c *cli.Context) error { return runAction(c, env) },
	}
}

// runFlags are the run command's flags (check shares them).
func runFlags() []cli.Flag {
	return []cli.Flag{
		stagecmd.StoreFlag(),
		&cli.StringFlag{Name: "tasks", Value: "tasks", Usage: "tasks dataset (name or name@version)"},
		&cli.StringFlag{Name: "images", Value: "images", Usage: "images dataset of the tasks' images (kiln-images)"},
		&cli.StringFlag{Name: "bundles", Usage: "bundle root on this node: the directory kiln-images unpacked the images into (required)"},
		&cli.StringFlag{Name: "engine", Usage: "engine base URL(s), comma separated (required)"},
		&cli.StringFlag{Name: "engine-api-key", EnvVars: []string{"KILN_ENGINE_API_KEY"}, Usage: "bearer token for engines started with --api-key"},
		&cli.StringFlag{Name: "mode", Value: "auto", Usage: "engine route: auto, generate, or completions (fallback)"},
		&cli.StringFlag{Name: "tokenizer-dir", Usage: "served checkpoint directory with tokenizer JSON files"},
		&cli.IntFlag{Name: "samples", Value: 1, Usage: "runs per task"},
		&cli.StringFlag{Name: "out", Required: true, Usage: "dataset name prefix: OUT/rollouts, OUT/turns, OUT/trajectories"},
		&cli.StringFlag{Name: "agent", Value: harness.ShellName, EnvVars: []string{"KILN_AGENT"}, Usage: "default harness: shell, claude-code or codex"},
		&cli.StringFlag{Name: "agent-binary", Usage: "the shell agent's binary (default: kiln-agent beside this binary, then PATH)"},
		&cli.StringFlag{Name: "weights-version", Usage: "the policy weights the engines serve (recorded in every row)"},
		&cli.StringFlag{Name: "split", Usage: "run only tasks of this split"},
		&cli.IntFlag{Name: "jobs", Aliases: []string{"j"}, Value: runtime.NumCPU(), Usage: "runs at once"},
		&cli.IntFlag{Name: "boot-concurrency", Usage: "sandboxes booting at once (default: --jobs)"},
		&cli.DurationFlag{Name: "budget", Value: DefaultBudget, Usage: "the agent's time budget"},
		&cli.DurationFlag{Name: "setup-timeout", Value: DefaultSetupTimeout, Usage: "allowance for boot, workspace preparation and patch capture"},
		&cli.DurationFlag{Name: "deadline-margin", Value: DefaultMargin, Usage: "added to budget and setup for the whole-run deadline"},
		&cli.IntFlag{Name: "max-turns", Usage: "model calls per agent run (0: the agent's default)"},
		&cli.Float64Flag{Name: "temperature", Value: 1.0, Usage: "sampling temperature, [0, 2]"},
		&cli.Float64Flag{Name: "top-p", Value: 1.0, Usage: "nucleus top_p, (0, 1]"},
		&cli.IntFlag{Name: "top-k", Value: -1, Usage: "top_k, -1 for off"},
		&cli.IntFlag{Name: "max-tokens", Usage: "max response tokens per turn (a client's own limit can only lower it)", DefaultText: "4096"},
		&cli.IntFlag{Name: "max-context-tokens", Usage: "prompt + response limit per turn (0: the engine's context length)"},
		&cli.StringFlag{Name: "stop-token-ids", Usage: "extra stop token ids, comma separated"},
		&cli.StringFlag{Name: "chat-template-kwargs", Usage: `JSON object passed to the chat template, e.g. '{"reasoning_effort":"medium"}'`},
		&cli.StringFlag{Name: "reasoning-parser", Value: "qwen3", Usage: `"qwen3" or "" (none)`},
		&cli.StringFlag{Name: "tool-parser", Value: "qwen3_coder", Usage: `"qwen3_coder", "hermes" or "" (XML fallback only)`},
		stagecmd.ShardFlag(),
		stagecmd.PrintVersionFlag(),
	}
}

func runAction(c *cli.Context, env *stagecmd.Env) error {
	if c.NArg() != 0 {
		return stagecmd.Usagef("run: takes no arguments")
	}
	o, err := runOptionsFrom(c)
	if err != nil {
		return err
	}
	st, err := stagecmd.OpenStore(c)
	if err != nil {
		return err
	}
	part, err := stagecmd.PartFrom(c)
	if err != nil {
		return err
	}
	_, err = Run(c.Context, env, st, RunOutput{Name: c.String("out"), Part: part, PrintVersion: c.Bool("print-version"), Hook: env.Hook}, o)
	return err
}

// runOptionsFrom reads the run flags.
func runOptionsFrom(c *cli.Context) (RunOptions, error) {
	mode, err := engine.ParseMode(c.String("mode"))
	if err != nil {
		return RunOptions{}, stagecmd.UsageError{Err: err}
	}
	var engines []string
	for _, u := range strings.Split(c.String("engine"), ",") {
		if u = strings.TrimSpace(u); u != "" {
			engines = append(engines, u)
		}
	}
	var stops []int32
	for _, s := range strings.Split(c.String("stop-token-ids"), ",") {
		if s = strings.TrimSpace(s); s == "" {
			continue
		}
		n, err := strconv.ParseInt(s, 10, 32)
		if err != nil || n < 0 {
			return RunOptions{}, stagecmd.Usagef("--stop-token-ids %q: want non-negative integers separated by commas", c.String("stop-token-ids"))
		}
		stops = append(stops, int32(n))
	}
	o := RunOptions{
		Tasks: c.String("tasks"), Images: c.String("images"), Bundles: c.String("bundles"),
		Engines: engines, EngineAPIKey: c.String("engine-api-key"), Mode: mode, TokenizerDir: c.String("tokenizer-dir"),
		Samples: c.Int("samples"), Agent: c.String("agent"), WeightsVersion: c.String("weights-version"), Split: c.String("split"),
		Jobs: c.Int("jobs"), BootConcurrency: c.Int("boot-concurrency"),
		Budget: c.Duration("budget"), SetupTimeout: c.Duration("setup-timeout"), Margin: c.Duration("deadline-margin"),
		MaxTurns: c.Int("max-turns"), Temperature: c.Float64("temperature"), TopP: c.Float64("top-p"), TopK: c.Int("top-k"),
		MaxTokens: c.Int("max-tokens"), MaxContextTokens: c.Int("max-context-tokens"), StopTokenIDs: stops,
		ChatTemplateKwargs: c.String("chat-template-kwargs"), ReasoningParser: c.String("reasoning-parser"), ToolParser: c.String("tool-parser"),
		Harness: harness.Options{ShellAgent: c.String("agent-binary")},
	}
	return o, nil
}
