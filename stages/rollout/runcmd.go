package rollout

import (
	"fmt"
	"runtime"
	"strconv"
	"strings"
	"time"

	"github.com/urfave/cli/v2"

	"github.com/kilnrl/kiln/internal/agent/engine"
	"github.com/kilnrl/kiln/internal/agent/harness"
	"github.com/kilnrl/kiln/internal/enginectl"
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

A run that cannot give a trainable sample is a rollouts row with abort_reason,
abort_detail (why, in words: the error, the missing path, the mismatch) and no
turns or segments: missing_image_or_workdir (no image, no workdir, or
the bundle is not on this node), adapter_session_empty (no model call),
wall_clock_timeout (the whole-run deadline), engine_error (model calls failed
with a server error and the agent gave up, or the run's engine failed its
health check), agent_crash (exit 126 or more: not
runnable, or killed by a signal), weights_changed (with --weights: an engine
reports a token of the run generated with other weights), exception:<step>
(sandbox boot, workspace, patch capture, assembly). An agent out of --budget is killed; its row has
agent_exit_code -1 and its patch and turns are kept.

Ids: index = rollout_id = task_index × --samples + sample; group_index is the
task's task_index. They are the same on every rerun.

Harnesses: --agent (env KILN_AGENT) is the default; a task's agent column
overrides it. shell: kiln-agent, found beside this binary or on PATH, or
--agent-binary. claude-code and codex: the pinned CLIs' native builds, found
by --claude-code / --codex, else $KILN_AGENT_CLAUDE_CODE / $KILN_AGENT_CODEX,
else the install of scripts/install-test-deps.sh (an npm install directory,
or the binary). Each is bound read-only into the sandbox, configured to talk
only to the adapter with the session token, no telemetry or updates, tools
run without asking, its request timeouts the budget (docs/rollout.md §3).
--agent-args and --agent-env add arguments and environment (JSON), for every
harness or per harness name.

Engines: --engine URL[,URL...]; a session goes to one engine by a hash of its
token. Every engine is probed at start; if one fails, nothing runs. While runs
go, GET /health is checked every 15 s: a failing engine is left out and its
running runs abort (engine_error); with none left the stage exits 1.

Weights: --weights REF names a weights version kiln-sync published (a bare
name is pinned to its latest). Before any sandbox boots, every engine is asked
which weights number it serves (--engine-protocol vllm, also kiln's serve.py:
/v1/models weight_version, else /weight_info; sglang: /get_weight_version;
--engine-api-key as the bearer token); unless every engine serves REF's
number, nothing runs and the stage exits 1 naming each engine, what it serves
and what was asked (run kiln-sync reload, then rerun). Where an engine reports
per-token weight versions (serve.py does), a model call with a token of other
weights aborts its run (weights_changed). The pinned REF is every row's
weights_version, an input of the version id, and the manifests' weights and
weights_number. --weights-version V instead records V as given, for engines
kiln-sync does not manage; the two exclude each other. Replay engines are not
asked (docs/rollout.md §2.1).

Replay: --engine replay://NAME/turns@VERSION (the only engine) serves a recorded
turns version back instead of sampling, to check a harness or adapter change
offline: the nth model call of the run with rollout id R must send exactly the
prompt ids of R's nth recorded turn, and is answered its recorded output ids,
logprobs and finish reason. --replay-renderer URL (required with replay://) is
an engine with the recorded checkpoint's tokenizer and chat template; only
GET, /tokenize and /detokenize go to it, never a generation. A call that
differs ends its run as abort replay_mismatch, the row's abort_detail naming
the rollout, the turn and the first differing prompt token. The replayed version is part
of the version id (docs/rollout.md §7).

Resumable: runs are committed in batches with row receipts, so a rerun of the
same command runs only what is missing. SIGINT/SIGTERM stops starting runs,
abandons the running ones (preempted: not written, the rerun redoes them),
writes what finished and exits 130. --shard i/n runs every n-th task (inputs
pinned, name@version). The sampling flags, --samples, --agent, --budget,
--weights (an input), --weights-version, --split and --max-turns are part of
the version id; the engine URLs, -j and --shard are not.

Examples:
   kiln-rollout run --tasks tasks@V --images images@V --bundles /var/lib/kiln/bundles \
       --engine http://gpu1:8000,http://gpu2:8000 --tokenizer-dir /models/qwen3 \
       --samples 8 --weights-version step-3 --out rollout/step-3
   kiln-rollout run --tasks tasks@V --images images@V --bundles /var/lib/kiln/bundles \
       --engine http://gpu1:8000,http://gpu2:8000 --tokenizer-dir /models/qwen3 \
       --samples 8 --weights weights/policy@W --out rollout/step-4
   kiln-rollout run --tasks tasks@V --images images@V --bundles /var/lib/kiln/bundles \
       --engine replay://rollout/step-3/turns@V --replay-renderer http://gpu1:8000 \
       --tokenizer-dir /models/qwen3 --samples 8 --weights-version step-3 --out replay/step-3`

func runCommand(env *stagecmd.Env) *cli.Command {
	f := &runFlagValues{}
	return &cli.Command{
		Name:        "run",
		Usage:       "run coding agents in sandboxes against the policy and record rollouts, turns and trajectories",
		Description: runHelp,
		Flags:       runFlags(f),
		Action:      func(c *cli.Context) error { return runAction(c, env, f) },
	}
}

// runFlagValues are what the run flags set (check shares them): every flag
// is bound to a field, so a misspelt name is a compile error, not "".
type runFlagValues struct {
	tasks, images, bundles, engine, engineAPIKey, mode, tokenizerDir string
	replayRenderer, weights, engineProtocol                          string
	out, agent, agentBinary, weightsVersion, split                   string
	stopTokenIDs, chatTemplateKwargs, reasoningParser, toolParser    string
	agentArgs, agentEnv, claudeCode, codex                           string
	samples, jobs, bootConcurrency, maxTurns, topK                   int
	maxTokens, maxContextTokens                                      int
	budget, setupTimeout, margin                                     time.Duration
	temperature, topP                                                float64
	printVersion                                                     bool
	seed                                                             *int64
}

// runFlags are the run command's flags, bound to f.
func runFlags(f *runFlagValues) []cli.Flag {
	return []cli.Flag{
		stagecmd.StoreFlag(),
		&cli.StringFlag{Name: "tasks", Value: "tasks", Destination: &f.tasks, Usage: "tasks dataset (name or name@version)"},
		&cli.StringFlag{Name: "images", Value: "images", Destination: &f.images, Usage: "images dataset of the tasks' images (kiln-images)"},
		&cli.StringFlag{Name: "bundles", Destination: &f.bundles, Usage: "bundle root on this node: the directory kiln-images unpacked the images into (required)"},
		&cli.StringFlag{Name: "engine", Destination: &f.engine, Usage: "engine base URL(s), comma separated, or one replay://NAME/turns@VERSION (required)"},
		&cli.StringFlag{Name: "replay-renderer", Destination: &f.replayRenderer, Usage: "with --engine replay://NAME/turns@VERSION: the engine that renders and decodes for the replay (the recorded checkpoint's tokenizer and chat template; never asked to generate)"},
		&cli.StringFlag{Name: "engine-api-key", EnvVars: []string{"KILN_ENGINE_API_KEY"}, Destination: &f.engineAPIKey, Usage: "bearer token for engines started with --api-key"},
		&cli.StringFlag{Name: "mode", Value: "auto", Destination: &f.mode, Usage: "engine route: auto, generate, or completions (fallback)"},
		&cli.StringFlag{Name: "tokenizer-dir", Destination: &f.tokenizerDir, Usage: "served checkpoint directory with tokenizer JSON files"},
		&cli.IntFlag{Name: "samples", Value: 1, Destination: &f.samples, Usage: "runs per task"},
		&cli.StringFlag{Name: "out", Required: true, Destination: &f.out, Usage: "dataset name prefix: OUT/rollouts, OUT/turns, OUT/trajectories"},
		&cli.StringFlag{Name: "agent", Value: harness.ShellName, EnvVars: []string{"KILN_AGENT"}, Destination: &f.agent, Usage: "default harness: shell, claude-code or codex"},
		&cli.StringFlag{Name: "agent-binary", Destination: &f.agentBinary, Usage: "the shell agent's binary (default: kiln-agent beside this binary, then PATH)"},
		&cli.StringFlag{Name: "claude-code", Destination: &f.claudeCode, Usage: "Claude Code install: npm install directory or native binary (default: $" + harness.ClaudeCodeEnv + ", then the install of scripts/install-test-deps.sh)"},
		&cli.StringFlag{Name: "codex", Destination: &f.codex, Usage: "Codex install: npm install directory, platform directory or native binary (default: $" + harness.CodexEnv + ", then the install of scripts/install-test-deps.sh)"},
		&cli.StringFlag{Name: "agent-args", Destination: &f.agentArgs, Usage: `extra agent arguments as JSON: '["--x"]' for every harness or '{"codex":["--x"]}'`},
		&cli.StringFlag{Name: "agent-env", Destination: &f.agentEnv, Usage: `extra agent environment as JSON: '{"NAME":"v"}' for every harness or '{"claude-code":{"NAME":"v"}}'`},
		&cli.StringFlag{Name: "weights", Destination: &f.weights, Usage: "weights dataset kiln-sync published (name or name@version): every engine must serve its weights number before any run starts, and a run whose tokens report other weights aborts (weights_changed); the pinned reference is recorded in every row and the lineage"},
		&cli.StringFlag{Name: "engine-protocol", Value: string(enginectl.VLLM), Destination: &f.engineProtocol, Usage: "how --weights asks the engines which weights they serve: vllm (also kiln's serve.py) or sglang"},
		&cli.StringFlag{Name: "weights-version", Destination: &f.weightsVersion, Usage: "the policy weights the engines serve, recorded in every row as given, for engines kiln-sync does not manage (excludes --weights)"},
		&cli.StringFlag{Name: "split", Destination: &f.split, Usage: "run only tasks of this split"},
		&cli.IntFlag{Name: "jobs", Aliases: []string{"j"}, Value: runtime.NumCPU(), Destination: &f.jobs, Usage: "runs at once"},
		&cli.IntFlag{Name: "boot-concurrency", Destination: &f.bootConcurrency, Usage: "sandboxes booting at once (default: --jobs)"},
		&cli.DurationFlag{Name: "budget", Value: DefaultBudget, Destination: &f.budget, Usage: "the agent's time budget"},
		&cli.DurationFlag{Name: "setup-timeout", Value: DefaultSetupTimeout, Destination: &f.setupTimeout, Usage: "allowance for boot, workspace preparation and patch capture"},
		&cli.DurationFlag{Name: "deadline-margin", Value: DefaultMargin, Destination: &f.margin, Usage: "added to budget and setup for the whole-run deadline"},
		&cli.IntFlag{Name: "max-turns", Destination: &f.maxTurns, Usage: "model calls per agent run (0: the agent's default)"},
		&cli.Float64Flag{Name: "temperature", Value: 1.0, Destination: &f.temperature, Usage: "sampling temperature, [0, 2]"},
		&cli.Float64Flag{Name: "top-p", Value: 1.0, Destination: &f.topP, Usage: "nucleus top_p, (0, 1]"},
		&cli.IntFlag{Name: "top-k", Value: -1, Destination: &f.topK, Usage: "top_k, -1 for off"},
		&cli.Int64Flag{Name: "seed", Usage: "make the runs reproducible: each model call samples with a seed that is a function of N, the rollout's index and the turn (docs/rollout.md §2.1), so the same inputs give the same tokens whatever the engine batches; the k-th sample of a task gets the same noise in every run with this seed (default: the engine's own, arrival order)", Action: func(_ *cli.Context, v int64) error { f.seed = &v; return nil }},
		&cli.IntFlag{Name: "max-tokens", Destination: &f.maxTokens, Usage: "max response tokens per turn (a client's own limit can only lower it)", DefaultText: "4096"},
		&cli.IntFlag{Name: "max-context-tokens", Destination: &f.maxContextTokens, Usage: "prompt + response limit per turn (0: the engine's context length)"},
		&cli.StringFlag{Name: "stop-token-ids", Destination: &f.stopTokenIDs, Usage: "extra stop token ids, comma separated"},
		&cli.StringFlag{Name: "chat-template-kwargs", Destination: &f.chatTemplateKwargs, Usage: `JSON object passed to the chat template, e.g. '{"reasoning_effort":"medium"}'`},
		&cli.StringFlag{Name: "reasoning-parser", Value: "qwen3", Destination: &f.reasoningParser, Usage: `"qwen3" or "" (none)`},
		&cli.StringFlag{Name: "tool-parser", Value: "qwen3_coder", Destination: &f.toolParser, Usage: `"qwen3_coder", "hermes" or "" (XML fallback only)`},
		stagecmd.ShardFlag(),
		stagecmd.PrintVersionFlag(&f.printVersion),
	}
}

func runAction(c *cli.Context, env *stagecmd.Env, f *runFlagValues) error {
	if c.NArg() != 0 {
		return stagecmd.Usagef("run: takes no arguments")
	}
	o, err := f.options()
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
	_, err = Run(c.Context, env, st, RunOutput{Name: f.out, Part: part, PrintVersion: f.printVersion, Hook: env.Hook}, o)
	return err
}

// options turns the run flags into RunOptions.
func (f *runFlagValues) options() (RunOptions, error) {
	mode, err := engine.ParseMode(f.mode)
	if err != nil {
		return RunOptions{}, stagecmd.UsageError{Err: err}
	}
	protocol, err := enginectl.ParseProtocol(f.engineProtocol)
	if err != nil {
		return RunOptions{}, stagecmd.UsageError{Err: fmt.Errorf("--engine-protocol: %w", err)}
	}
	var engines []string
	for _, u := range strings.Split(f.engine, ",") {
		if u = strings.TrimSpace(u); u != "" {
			engines = append(engines, u)
		}
	}
	var stops []int32
	for _, s := range strings.Split(f.stopTokenIDs, ",") {
		if s = strings.TrimSpace(s); s == "" {
			continue
		}
		n, err := strconv.ParseInt(s, 10, 32)
		if err != nil || n < 0 {
			return RunOptions{}, stagecmd.Usagef("--stop-token-ids %q: want non-negative integers separated by commas", f.stopTokenIDs)
		}
		stops = append(stops, int32(n))
	}
	extra, err := harness.ParseExtra(f.agentArgs, f.agentEnv)
	if err != nil {
		return RunOptions{}, stagecmd.UsageError{Err: err}
	}
	o := RunOptions{
		Tasks: f.tasks, Images: f.images, Bundles: f.bundles,
		Engines: engines, ReplayRenderer: f.replayRenderer, EngineAPIKey: f.engineAPIKey, Mode: mode, TokenizerDir: f.tokenizerDir,
		Samples: f.samples, Agent: f.agent, WeightsVersion: f.weightsVersion, Split: f.split,
		Weights: f.weights, EngineProtocol: protocol,
		Jobs: f.jobs, BootConcurrency: f.bootConcurrency,
		Budget: f.budget, SetupTimeout: f.setupTimeout, Margin: f.margin,
		MaxTurns: f.maxTurns, Temperature: f.temperature, TopP: f.topP, TopK: f.topK,
		MaxTokens: f.maxTokens, MaxContextTokens: f.maxContextTokens, StopTokenIDs: stops,
		ChatTemplateKwargs: f.chatTemplateKwargs, ReasoningParser: f.reasoningParser, ToolParser: f.toolParser,
		Seed:    f.seed,
		Harness: harness.Options{ShellAgent: f.agentBinary, ClaudeCode: f.claudeCode, Codex: f.codex, Extra: extra},
	}
	return o, nil
}
