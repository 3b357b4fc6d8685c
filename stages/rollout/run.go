package rollout

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"log/slog"
	"net"
	"net/http"
	"os"
	"path/filepath"
	"sort"
	"strings"
	"sync/atomic"
	"time"

	"github.com/kilnrl/kiln/formats/dataset"
	"github.com/kilnrl/kiln/formats/records"
	"github.com/kilnrl/kiln/formats/store"
	"github.com/kilnrl/kiln/internal/agent/adapter"
	"github.com/kilnrl/kiln/internal/agent/engine"
	"github.com/kilnrl/kiln/internal/agent/harness"
	"github.com/kilnrl/kiln/internal/enginectl"
	"github.com/kilnrl/kiln/internal/sandbox"
	"github.com/kilnrl/kiln/internal/stagecmd"
	"github.com/kilnrl/kiln/internal/workspace"
)

// runVersion is the run stage's code version (dataset.Identity): bump it
// whenever the same inputs and arguments would be run differently.
const runVersion = "1"

// Defaults of the run stage (docs/rollout.md §2).
const (
	DefaultBudget       = 1200 * time.Second // the agent's time budget
	DefaultSetupTimeout = 600 * time.Second  // boot, workspace preparation, patch capture
	DefaultMargin       = 180 * time.Second  // on top of both, for the whole-run deadline
	// agentGrace is how long past its budget the agent may take to exit
	// on its own before it is killed (its own timeout is the budget).
	agentGrace = 5 * time.Second
	// The model name agents send; the adapter ignores it.
	agentModel = "kiln-policy"
)

// Abort reasons a run stage writes (docs/records.md §4, docs/rollout.md
// §2.4): records' list, which every rollouts row, written or imported, is
// held to (records.CheckAbortReason).
const (
	AbortMissingImage  = records.AbortMissingImage
	AbortSessionEmpty  = records.AbortSessionEmpty
	AbortDeadline      = records.AbortDeadline
	AbortEngineError   = records.AbortEngineError
	AbortAgentCrash    = records.AbortAgentCrash
	abortExceptionPref = records.AbortExceptionPrefix
	// AbortPreempted ends a run the stage's own end interrupted: it is
	// never written (a rerun runs it again), so it is no row's reason.
	AbortPreempted = "preempted"
)

// AbortWeightsChanged is the abort reason of a run a model call of which
// an engine reports generated with other weights than --weights names
// (docs/rollout.md §2.4).
const AbortWeightsChanged = records.AbortWeightsChanged

// RunOptions describe one run stage.
type RunOptions struct {
	Tasks, Images string // dataset references
	Bundles       string // bundle root on this node
	// Engines are the engines' base URLs; each session goes to one. One
	// replay://NAME/turns@VERSION instead replays that recording
	// (docs/rollout.md §7), rendering through ReplayRenderer.
	Engines        []string
	ReplayRenderer string
	EngineAPIKey   string
	Mode           engine.Mode
	// TokenizerDir holds the served checkpoint's tokenizer files (special
	// ids for prefix reuse); "" reads none.
	TokenizerDir string
	Samples      int
	// Agent is the default harness; a task's agent column overrides it.
	Agent          string
	WeightsVersion string
	Split          string
	Jobs           int
	// Weights is a weights dataset reference (kiln-sync's): every engine
	// must serve its weights number before any run starts, every token
	// must be generated with it, and the pinned reference is each row's
	// weights_version and an input of the version id (docs/sync.md §5).
	// WeightsVersion, recorded as it is for engines kiln-sync does not
	// manage, excludes it.
	Weights string
	// EngineProtocol is how the engines are asked which weights they
	// serve ("" is vLLM; docs/sync.md §5).
	EngineProtocol enginectl.Protocol
	// Budget is the agent's time budget; SetupTimeout and Margin make the
	// whole-run deadline Budget + SetupTimeout + Margin.
	Budget, SetupTimeout, Margin time.Duration
	// Sampling: the session defaults, recorded in the version id.
	Temperature, TopP  float64
	TopK               int
	MaxTokens          int
	MaxContextTokens   int
	StopTokenIDs       []int32
	ChatTemplateKwargs string // a JSON object, or ""
	ReasoningParser    string
	ToolParser         string
	// MaxTurns bounds each agent's model calls (0: the agent's default).
	MaxTurns int
	// Seed, when set, seeds every model call: the session of rollout r
	// gets adapter.TurnSeed(*Seed, r) and its turns derive theirs from it
	// (docs/rollout.md §2.1).
	Seed *int64
	// Harness settings (the shell agent's binary, ...).
	Harness harness.Options
	// BootConcurrency bounds concurrent sandbox boots (default Jobs).
	BootConcurrency int
	// Sandbox are the base options of every agent sandbox (tests set the
	// helper); the stage fills in rootfs, env, endpoint, mounts, artifacts.
	Sandbox sandbox.Options
	// FlushRuns is the number of finished runs written per batch
	// (flushRuns if 0); tests lower it.
	FlushRuns int
	// HealthInterval is the time between health checks of every engine
	// (DefaultHealthInterval if 0; negative: none).
	HealthInterval time.Duration

	// weights is Weights as Run opened it (nil without): set by Run
	// after the version id is made, read by the runs.
	weights *pinnedWeights
}

// rowWeightsVersion is what every row records as weights_version: the
// pinned --weights reference, else --weights-version.
func (o *RunOptions) rowWeightsVersion() string {
	if o.weights != nil {
		return o.weights.ref.String()
	}
	return o.WeightsVersion
}

// DefaultHealthInterval is the time between engine health checks.
const DefaultHealthInterval = 15 * time.Second

// identityArgs are the arguments that make the version id: everything that
// changes what the runs produce, and nothing that only says where they run
// (engine URLs, -j, --shard).
func (o *RunOptions) identityArgs() map[string]any {
	args := map[string]any{
		"samples": o.Samples, "agent": harness.Normalize(o.Agent), "weights_version": o.WeightsVersion, "split": o.Split,
		"budget_s": o.Budget.Seconds(), "temperature": o.Temperature, "top_p": o.TopP, "top_k": o.TopK,
		"max_tokens": o.MaxTokens, "max_context_tokens": o.MaxContextTokens, "stop_token_ids": o.StopTokenIDs,
		"chat_template_kwargs": o.ChatTemplateKwargs, "reasoning_parser": o.ReasoningParser, "tool_parser": o.ToolParser,
		"max_turns": o.MaxTurns,
	}
	if o.Seed != nil { // absent unset, so runs without --seed keep their ids
		args["seed"] = *o.Seed
	}
	// A replay's runs are the recording's, not the engines' (docs/rollout.md
	// §7): the replayed version is an input of what they produce.
	if ref, ok := replayEngineRef(o.Engines); ok {
		args["replay"] = ref
	}
	// Extra agent arguments change what runs; absent, the id is as before.
	if e := o.Harness.Extra; len(e.Args) > 0 || len(e.Env) > 0 {
		args["agent_args"], args["agent_env"] = e.Args, e.Env
	}
	return args
}

func (o *RunOptions) check() error {
	switch {
	case o.Bundles == "":
		return stagecmd.Usagef("--bundles DIR is required: the bundle root kiln-images unpacked the images into on this node")
	case len(o.Engines) == 0:
		return stagecmd.Usagef("--engine URL is required (several: --engine URL1,URL2)")
	case stagecmd.CheckCount("samples", o.Samples, stagecmd.MaxSamples) != nil:
		return stagecmd.CheckCount("samples", o.Samples, stagecmd.MaxSamples)
	case stagecmd.CheckCount("jobs", o.Jobs, stagecmd.MaxJobs) != nil:
		return stagecmd.CheckCount("jobs", o.Jobs, stagecmd.MaxJobs)
	case o.BootConcurrency != 0 && stagecmd.CheckCount("boot-concurrency", o.BootConcurrency, stagecmd.MaxJobs) != nil:
		return stagecmd.CheckCount("boot-concurrency", o.BootConcurrency, stagecmd.MaxJobs)
	case o.Budget <= 0:
		return stagecmd.Usagef("--budget %s: want a positive duration such as 20m", o.Budget)
	case o.SetupTimeout <= 0 || o.Margin < 0:
		return stagecmd.Usagef("--setup-timeout %s, --deadline-margin %s: want a positive setup timeout and a margin of 0 or more", o.SetupTimeout, o.Margin)
	case o.MaxContextTokens < 0 || o.MaxTokens < 0 || o.MaxTurns < 0:
		return stagecmd.Usagef("--max-context-tokens, --max-tokens and --max-turns must be 0 or more")
	case o.Weights != "" && o.WeightsVersion != "":
		return stagecmd.Usagef("--weights %q and --weights-version %q: give one: --weights for a weights version kiln-sync published (checked against the engines), --weights-version to only record what engines kiln-sync does not manage serve",
			o.Weights, o.WeightsVersion)
	}
	if o.EngineProtocol != "" {
		if _, err := enginectl.ParseProtocol(string(o.EngineProtocol)); err != nil {
			return stagecmd.UsageError{Err: fmt.Errorf("--engine-protocol: %w", err)}
		}
	}
	if _, err := adapterOptions(adapterFlags{maxTokens: o.MaxTokens, temperature: &o.Temperature, topP: &o.TopP, topK: &o.TopK,
		chatTemplateKwargs: o.ChatTemplateKwargs, reasoningParser: o.ReasoningParser, toolParser: o.ToolParser}); err != nil {
		return stagecmd.UsageError{Err: err}
	}
	if err := checkReplayOptions(o.Engines, o.ReplayRenderer); err != nil {
		return stagecmd.UsageError{Err: err}
	}
	return nil
}

// RunOutput names what a run stage writes: NAME/rollouts, NAME/turns and
// NAME/trajectories, one part of each.
type RunOutput struct {
	Name         string
	Part         dataset.Part
	PrintVersion bool
	Hook         func(point string)
}

// RunResults are the three committed (or pending) versions.
type RunResults struct {
	Rollouts, Turns, Trajectories dataset.Result
}

// Run runs every task × sample of o's tasks in agent sandboxes and commits
// the rollouts, turns and trajectories (docs/rollout.md §2).
func Run(ctx context.Context, env *stagecmd.Env, st store.Store, out RunOutput, o RunOptions) (RunResults, error) {
	var res RunResults
	if err := o.check(); err != nil {
		return res, err
	}
	// The names are checked before anything is resolved.
	for _, suffix := range []string{"/rollouts", "/turns", "/trajectories"} {
		if err := dataset.CheckName(out.Name + suffix); err != nil {
			return res, stagecmd.UsageError{Err: err}
		}
	}
	bundles, err := filepath.Abs(o.Bundles)
	if err != nil {
		return res, stagecmd.UsageError{Err: err}
	}
	refs := []string{o.Tasks, o.Images}
	if o.Weights != "" {
		refs = append(refs, o.Weights)
	}
	inputs, err := stagecmd.ResolveInputs(ctx, st, refs, out.Part)
	if err != nil {
		return res, err
	}
	// The weights are an input like the tasks (a third one, so that a
	// run without --weights keeps its version id), and are opened now:
	// a wrong kind or a missing number stops the stage before anything.
	if o.Weights != "" {
		if o.weights, err = openWeights(ctx, st, inputs[2]); err != nil {
			return res, err
		}
	}
	id := dataset.Identity{Stage: "rollout-run", CodeVersion: runVersion, Inputs: inputs, Args: o.identityArgs()}
	outs := []stagecmd.Output{
		{Name: out.Name + "/rollouts", Kind: records.RolloutsKind()},
		{Name: out.Name + "/turns", Kind: records.TurnsKind()},
		{Name: out.Name + "/trajectories", Kind: records.TrajectoriesKind()},
	}
	// The turns and trajectories of a batch of runs are written before its
	// rollouts rows, each receipt naming the batch: a resuming writer keeps
	// only the batches whose rollouts rows were receipted too, so the three
	// versions always hold the same runs (docs/rollout.md §2.5). When the
	// rollouts part is already finished (a stage stopped between the
	// commits), its batches are read from its receipts.
	var batchDone func(key string) bool
	adopt := func(keys []string) bool {
		for _, k := range keys {
			if strings.HasPrefix(k, batchKeyPrefix) {
				return batchDone(k)
			}
		}
		return false
	}
	for i := range outs {
		outs[i].Identity, outs[i].Part, outs[i].PrintVersion, outs[i].Hook = id, out.Part, out.PrintVersion, out.Hook
	}
	outs[1].Adopt, outs[2].Adopt = adopt, adopt
	tg := stagecmd.Together{
		Opened: func(i int, w *dataset.Writer) error {
			if i != 0 {
				return nil
			}
			batchDone = w.Done
			if w.Existing() != nil || w.PartDone() {
				kept, err := dataset.ReceiptedRows(ctx, st, w.Ref(), out.Part)
				if err != nil {
					return err
				}
				batchDone = func(k string) bool { return kept[k] }
			}
			return nil
		},
		// Turns, then rollouts, then trajectories: the trajectories
		// version appearing means the other two are committed.
		CommitOrder: []int{1, 0, 2},
		// Every part of all three versions names the weights (kiln-train
		// reads them from the trajectories', docs/train-stage.md §6.2).
		Metrics: o.weights.addMetrics(nil),
	}
	results, err := stagecmd.WriteAll(ctx, st, outs, tg, env.Stdout, env.Log, func(ctx context.Context, ws []*dataset.Writer) (map[string]any, error) {
		return produceRuns(ctx, env, st, [3]*dataset.Writer(ws), inputs, bundles, o, out.Part)
	})
	if err != nil {
		return res, err
	}
	res.Rollouts, res.Turns, res.Trajectories = results[0], results[1], results[2]
	return res, nil
}

// batchKeyPrefix marks the row key that names a batch of runs in the
// receipts of all three versions.
const batchKeyPrefix = "batch:"

// runJob is one agent run to do.
type runJob struct {
	key     string          // row key: stable across reruns of the version
	row     records.Rollout // ids, task, agent, weights version filled in
	abort   string          // decided before running ("" = run it)
	detail  string          // why, for the log
	harness harness.Harness
	rootfs  string
	env     []string
	workdir string
	setup   workspace.Setup
}

// planRuns lists the runs of the tasks this part owns (tasks are dealt to
// parts round-robin, all samples of a task in one part), in task order.
// Problems of one task (no image, a bundle missing on this node) become
// aborts of its runs; an unknown harness stops the stage before any run.
func planRuns(ctx context.Context, st store.Store, inputs []dataset.Ref, bundles string, o RunOptions, part dataset.Part) ([]*runJob, error) {
	tv, err := dataset.OpenKind(ctx, st, inputs[0], records.TasksKind(), "--tasks")
	if err != nil {
		return nil, err
	}
	var tasks []records.Task
	if err := tv.EachShard(ctx, func(_ int, data []byte) error {
		return records.EachTask(data, func(t records.Task) error { tasks = append(tasks, t); return nil })
	}); err != nil {
		return nil, err
	}
	iv, err := dataset.OpenKind(ctx, st, inputs[1], records.ImagesKind(), "--images")
	if err != nil {
		return nil, err
	}
	images := map[string]records.Image{}
	if err := iv.EachShard(ctx, func(_ int, data []byte) error {
		return records.EachImage(data, func(im records.Image) error { images[im.Image] = im; return nil })
	}); err != nil {
		return nil, err
	}
	harnesses := map[string]harness.Harness{}
	getHarness := func(name string) (harness.Harness, error) {
		name = harness.Normalize(name)
		if h, ok := harnesses[name]; ok {
			return h, nil
		}
		ho := o.Harness
		ho.MaxTurns = o.MaxTurns
		ho.MaxOutputTokens, ho.MaxContextTokens = o.MaxTokens, o.MaxContextTokens
		h, err := harness.New(name, ho)
		if err != nil {
			return nil, stagecmd.UsageError{Err: err}
		}
		harnesses[name] = h
		return h, nil
	}
	var jobs []*runJob
	owned := 0
	for _, t := range tasks {
		if o.Split != "" && (t.Split == nil || *t.Split != o.Split) {
			continue
		}
		owned++
		if !part.Owns(owned - 1) {
			continue
		}
		agent := o.Agent
		if t.Agent != nil && strings.TrimSpace(*t.Agent) != "" {
			agent = *t.Agent
		}
		h, err := getHarness(agent)
		if err != nil {
			return nil, fmt.Errorf("task %q: %w", t.TaskID, err)
		}
		base := runJob{harness: h}
		base.abort, base.detail = resolveTask(&t, images, bundles, &base)
		for s := range o.Samples {
			j := base
			idx := t.TaskIndex*int64(o.Samples) + int64(s)
			j.key = fmt.Sprintf("run-%d", idx)
			j.row = records.Rollout{RolloutID: idx, Index: idx, GroupIndex: t.TaskIndex, Sample: int64(s), TaskID: t.TaskID,
				Agent: h.Name(), WeightsVersion: o.rowWeightsVersion(), AgentExitCode: -1}
			jobs = append(jobs, &j)
		}
	}
	if o.Split != "" && owned == 0 {
		return nil, stagecmd.BadInputf("tasks %s has no task of split %q", tv.Ref(), o.Split)
	}
	return jobs, nil
}

// resolveTask fills in the sandbox and workspace of a task's runs, or says
// why they abort.
func resolveTask(t *records.Task, images map[string]records.Image, bundles string, j *runJob) (abort, detail string) {
	if t.Image == nil || *t.Image == "" {
		return AbortMissingImage, "the task has no image"
	}
	im, ok := images[*t.Image]
	if !ok {
		return AbortMissingImage, fmt.Sprintf("image %q is not in the images dataset", *t.Image)
	}
	switch {
	case t.Workdir != nil && *t.Workdir != "":
		j.workdir = *t.Workdir
	case im.Workdir != nil && *im.Workdir != "":
		j.workdir = *im.Workdir
	default:
		return AbortMissingImage, "the task has no workdir"
	}
	j.rootfs = filepath.Join(bundles, filepath.FromSlash(im.Bundle), "rootfs")
	if fi, err := os.Stat(j.rootfs); err != nil || !fi.IsDir() {
		return AbortMissingImage, fmt.Sprintf("the bundle of image %q is not on this node (%s)", *t.Image, j.rootfs)
	}
	var err error
	if j.env, err = im.EnvList(); err != nil {
		return abortExceptionPref + "bad_image_env", fmt.Sprintf("image %q: env: %v", im.Image, err)
	}
	if t.ProblemStatement != nil {
		j.setup.ProblemStatement = *t.ProblemStatement
	}
	if t.PreCommands != nil {
		var v any
		if err := json.Unmarshal([]byte(*t.PreCommands), &v); err != nil {
			return abortExceptionPref + "bad_pre_commands", fmt.Sprintf("pre_commands: %v", err)
		}
		j.setup.PreCommands = workspace.PreCommandsBody(v)
	}
	return "", ""
}

// Shards are flushed (with their receipts) every flushRuns runs or
// flushRunsEvery, whichever comes first.
const (
	flushRuns      = 64
	flushRunsEvery = 30 * time.Second
)

// produceRuns starts the adapter, runs the jobs with a pool of workers and
// writes their rows in receipted batches from this goroutine (the writers
// are not safe for concurrent use).
func produceRuns(ctx context.Context, env *stagecmd.Env, st store.Store, ws [3]*dataset.Writer, inputs []dataset.Ref,
	bundles string, o RunOptions, part dataset.Part) (map[string]any, error) {
	if fi, err := os.Stat(bundles); err != nil || !fi.IsDir() {
		return nil, stagecmd.Usagef("--bundles %q is not a directory: pass the bundle root kiln-images unpacked the images into", o.Bundles)
	}
	jobs, err := planRuns(ctx, st, inputs, bundles, o, part)
	if err != nil {
		return nil, err
	}
	var todo []*runJob
	resumed := 0
	for _, j := range jobs {
		if ws[0].Done(j.key) {
			resumed++
			continue
		}
		todo = append(todo, j)
	}
	if len(todo) == 0 {
		// Every run is receipted (a stage stopped after its last batch):
		// only the commits are left, and no engine is needed.
		return map[string]any{"runs": 0, "resumed": resumed}, nil
	}
	// Sandboxes of an earlier stage on this node that was killed (SIGKILL,
	// an OOM kill) still hold overlay mounts and cgroups: release them
	// before booting more, as kiln-grade does (docs/data-and-grading.md §3.4).
	if o.Sandbox.Provider != "local" {
		if _, err := sandbox.Sweep(ctx, o.Sandbox.StateDir, env.Log); err != nil {
			env.Log.Warn("could not release every dead sandbox's leftovers", "err", err)
		}
	}
	rt, err := startRuntime(ctx, env, st, o)
	if err != nil {
		return nil, err
	}
	defer rt.close()
	p := &runProducer{env: env, st: st, ws: ws, rt: rt, o: o,
		metrics: map[string]any{"runs": 0, "aborted": 0, "resumed": resumed, "turns": 0, "segments": 0}}
	return p.run(ctx, todo)
}

// runRuntime is what the runs share: the adapters (one per engine) behind one
// front, served on every sandbox's endpoint socket.
type runRuntime struct {
	front *front
	// serve serves the front on a sandbox's endpoint socket
	// (sandbox.Options.ServeEndpoint): the front listens on no port. At
	// most the sandbox's share of connections are held at once; flood is
	// called when its agent opens more (endpointListener).
	serve   func(ln net.Listener, flood func(max int))
	hs      interface{ Close() error }
	boots   *sandbox.Limiter
	engines []string // the base URLs health checks reach
	replay  *replayEngine
}

func startRuntime(ctx context.Context, env *stagecmd.Env, st store.Store, o RunOptions) (*runRuntime, error) {
	aopts, err := adapterOptions(adapterFlags{maxTokens: o.MaxTokens, temperature: &o.Temperature, topP: &o.TopP, topK: &o.TopK,
		chatTemplateKwargs: o.ChatTemplateKwargs, reasoningParser: o.ReasoningParser, toolParser: o.ToolParser})
	if err != nil {
		return nil, stagecmd.UsageError{Err: err}
	}
	aopts.Sampling.StopTokenIDs = o.StopTokenIDs
	f := false
	aopts.AutoOpen = &f // only sessions the stage opened are served
	if o.TokenizerDir != "" {
		if aopts.Special, err = engine.LoadSpecialTokens(o.TokenizerDir); err != nil {
			return nil, err
		}
	} else {
		env.Log.Warn("no --tokenizer-dir: prefix reuse cannot check special tokens; histories may be re-rendered")
	}
	var adapters []*adapter.Server
	var failed []string
	var replay *replayEngine
	// The front exists before the engine clients, which report every
	// generation to it when the run has --weights; its adapters are set
	// below, before it serves.
	fr := newFront(nil)
	fr.weights = o.weights
	var observe func(*engine.GenerateRequest, *engine.Generation)
	if o.weights != nil {
		observe = fr.observeWeights
	}
	var served []string // the engines asked for their weights: not a replay's
	engines := append([]string(nil), o.Engines...)
	for i, url := range o.Engines {
		if ref, ok := replayRef(url); ok {
			// A replay (docs/rollout.md §7): the engine is the recording,
			// served on a loopback port; check makes it the only one.
			book, err := loadReplayBook(ctx, st, ref)
			if err != nil {
				return nil, err
			}
			if replay, err = newReplayEngine(book, ref, o.ReplayRenderer, env.Log); err != nil {
				return nil, stagecmd.UsageError{Err: err}
			}
			if engines[i], err = replay.start(); err != nil {
				return nil, err
			}
			env.Log.Info("replaying", "turns", ref, "runs", len(book.runs), "renderer", o.ReplayRenderer)
			url = engines[i]
		} else {
			served = append(served, url)
		}
		cl, err := engine.New(engine.Options{BaseURL: url, Mode: o.Mode, APIKey: o.EngineAPIKey, Observe: observe})
		if err != nil {
			return nil, stagecmd.UsageError{Err: fmt.Errorf("--engine %q: %w", url, err)}
		}
		caps, err := cl.Probe(ctx)
		if err != nil {
			failed = append(failed, fmt.Sprintf("%s: %v", o.Engines[i], err))
			continue
		}
		env.Log.Info("engine ready", "engine", url, "route", string(caps.Route), "context", caps.ContextLength)
		ao := aopts
		ao.Engine = cl
		adapters = append(adapters, adapter.New(ao))
	}
	if len(failed) > 0 {
		replay.close()
		if err := ctx.Err(); err != nil {
			return nil, err
		}
		return nil, fmt.Errorf("engine probe failed, so no run was started: %s", strings.Join(failed, "; "))
	}
	// Before any sandbox boots, every engine must serve the --weights
	// number (docs/sync.md §5). A replay's engine is exempt: it answers
	// from its recording.
	if o.weights != nil && len(served) > 0 {
		if err := checkServedWeights(ctx, served, o.weights, o); err != nil {
			replay.close()
			return nil, err
		}
		env.Log.Info("engines serve the weights", "weights", o.weights.ref.String(), "number", o.weights.number, "engines", len(served))
	}
	fr.adapters = adapters
	hs := adapter.NewHTTPServer(fr, adapter.HTTPLimits{ReadHeaderTimeout: endpointHeaderTimeout}, slog.NewLogLogger(env.Log.Handler(), slog.LevelWarn))
	boots := o.BootConcurrency
	if boots <= 0 {
		boots = o.Jobs
	}
	// Each sandbox's endpoint gets a share of the descriptors, the stage
	// keeping its own (endpoint.go): one agent cannot starve the rest.
	nofile, err := raiseNoFile()
	if err != nil {
		replay.close()
		return nil, err
	}
	share, enough := endpointShare(nofile, o.Jobs)
	if !enough {
		env.Log.Warn("the open-files limit is low for this many runs at once: an agent flooding its endpoint may starve the stage; raise it (ulimit -n) or lower --jobs",
			"limit", nofile, "jobs", o.Jobs, "per_sandbox", share)
	}
	env.Log.Debug("endpoint connections per sandbox", "limit", nofile, "jobs", o.Jobs, "per_sandbox", share)
	return &runRuntime{front: fr, hs: hs, boots: sandbox.NewLimiter(boots),
		serve: func(ln net.Listener, flood func(int)) {
			_ = hs.Serve(&endpointListener{Listener: ln, max: share, flood: flood})
		},
		engines: engines, replay: replay}, nil
}

func (rt *runRuntime) close() { _ = rt.hs.Close(); rt.replay.close() }

// watchHealth checks every engine's GET /health each o.HealthInterval
// until ctx ends or the returned stop is called. An engine that fails is
// left out of new sessions and its running runs abort engine_error
// (docs/rollout.md §2.3); when none is left, stopStage ends the stage with
// errNoEngine.
func (rt *runRuntime) watchHealth(ctx context.Context, env *stagecmd.Env, o RunOptions, stopStage context.CancelCauseFunc) (stop func()) {
	every := o.HealthInterval
	if every == 0 {
		every = DefaultHealthInterval
	}
	if every < 0 {
		return func() {}
	}
	ctx, cancel := context.WithCancel(ctx)
	done := make(chan struct{})
	go func() {
		defer close(done)
		hc := &http.Client{Timeout: min(every, 10*time.Second)}
		t := time.NewTicker(every)
		defer t.Stop()
		for {
			select {
			case <-ctx.Done():
				return
			case <-t.C:
			}
			for i, url := range rt.engines {
				err := checkHealth(ctx, hc, url, o.EngineAPIKey)
				if err == nil || ctx.Err() != nil {
					continue
				}
				if localResourceError(err) {
					// kiln-rollout itself is out of descriptors: the engine
					// may be fine, and taking it out would end every run.
					env.Log.Error("kiln-rollout is out of file descriptors, so an engine's health could not be checked (the engine stays in service); raise the open-files limit (ulimit -n) or lower --jobs",
						"engine", url, "err", err)
					continue
				}
				why := err.Error()
				env.Log.Error("engine failed its health check; its running runs abort (engine_error)", "engine", url, "why", why)
				if !rt.front.engineDown(i, why) {
					stopStage(fmt.Errorf("%w (last: %s: %s); rerun to resume", errNoEngine, url, why))
					return
				}
			}
		}
	}()
	return func() { cancel(); <-done }
}

// checkHealth is nil when the engine answers GET /health with 2xx, else
// why not (localResourceError tells a failure of this process's own).
func checkHealth(ctx context.Context, hc *http.Client, base, apiKey string) error {
	req, err := http.NewRequestWithContext(ctx, http.MethodGet, strings.TrimRight(base, "/")+"/health", nil)
	if err != nil {
		return err
	}
	if apiKey != "" {
		req.Header.Set("Authorization", "Bearer "+apiKey)
	}
	resp, err := hc.Do(req)
	if err != nil {
		return err
	}
	resp.Body.Close()
	if resp.StatusCode/100 != 2 {
		return fmt.Errorf("GET /health: HTTP %d", resp.StatusCode)
	}
	return nil
}

// runProducer runs jobs and writes their results.
type runProducer struct {
	env *stagecmd.Env
	st  store.Store
	ws  [3]*dataset.Writer // rollouts, turns, trajectories
	rt  *runRuntime
	o   RunOptions

	pending []*runResult
	metrics map[string]any
	batch   int
	// Live counts for the status line (workers and the writer update them).
	running, done, aborted, turns, tokens atomic.Int64
}

// statusEvery is how often a run stage logs its status off a terminal;
// barEvery how often it redraws the bar's live fields on one.
const (
	statusEvery = 30 * time.Second
	barEvery    = time.Second
)

// liveStatus is a run stage's live counts at one moment (docs/rollout.md
// §2.7): runs running and aborted so far, and the model calls and sampled
// tokens of the finished runs, over the time since the start.
type liveStatus struct {
	running, aborted, turns, tokens int64
	elapsed                         time.Duration
}

func (p *runProducer) live(elapsed time.Duration) liveStatus {
	return liveStatus{running: p.running.Load(), aborted: p.aborted.Load(), turns: p.turns.Load(), tokens: p.tokens.Load(),
		elapsed: elapsed}
}

func (s liveStatus) perSec(n int64) float64 { return float64(n) / max(s.elapsed.Seconds(), 1e-9) }

// bar is the fields the terminal bar ends with (after runs done of the
// total, runs/s and the ETA): "running 8, aborted 1, 3.20 turns/s, 1204
// tokens/s".
func (s liveStatus) bar() string {
	return fmt.Sprintf("running %d, aborted %d, %.2f turns/s, %.0f tokens/s", s.running, s.aborted, s.perSec(s.turns), s.perSec(s.tokens))
}

// showStatus shows the live counts until stop is called: on a terminal in
// the progress bar, redrawn every barEvery; otherwise as a `rollout status`
// log line every statusEvery with runs done of total.
func (p *runProducer) showStatus(prog *stagecmd.Progress, total int) (stop func()) {
	start := time.Now()
	every := statusEvery
	if prog.Terminal() {
		prog.SetStatus(func(elapsed time.Duration) string { return p.live(elapsed).bar() })
		every = barEvery
	}
	quit := make(chan struct{})
	done := make(chan struct{})
	go func() {
		defer close(done)
		t := time.NewTicker(every)
		defer t.Stop()
		for {
			select {
			case <-quit:
				return
			case <-t.C:
			}
			if prog.Terminal() {
				prog.Redraw()
				continue
			}
			s := p.live(time.Since(start))
			p.env.Log.Info("rollout status", "done", p.done.Load(), "total", total, "running", s.running,
				"aborted", s.aborted, "turns_per_s", fmt.Sprintf("%.2f", s.perSec(s.turns)),
				"tokens_per_s", fmt.Sprintf("%.0f", s.perSec(s.tokens)))
		}
	}()
	return func() { close(quit); <-done }
}

// runResult is one finished run: its row, turns and segments (none when
// aborted).
type runResult struct {
	job      *runJob
	row      records.Rollout
	turns    []records.Turn
	segments []records.Trajectory
	err      error // the stage must stop (ctx cancelled, store failure)
}

func (p *runProducer) count(key string, n int) {
	v, _ := p.metrics[key].(int)
	p.metrics[key] = v + n
}

func (p *runProducer) run(ctx context.Context, todo []*runJob) (map[string]any, error) {
	prog := stagecmd.NewProgress(p.env.Stderr, p.env.Log, "rollout", "runs", int64(len(todo)))
	ctx, stop := context.WithCancelCause(ctx)
	defer stop(nil)
	cancel := func() { stop(context.Canceled) }
	stopHealth := p.rt.watchHealth(ctx, p.env, p.o, stop)
	defer stopHealth()
	results := stagecmd.Each(ctx, p.o.Jobs, todo, func(j *runJob) *runResult {
		p.running.Add(1)
		defer p.running.Add(-1)
		return p.runOne(ctx, j)
	})

	defer p.showStatus(prog, len(todo))()
	var firstErr error
	last := time.Now()
	for res := range results {
		if res.err != nil {
			if firstErr == nil && !errors.Is(res.err, context.Canceled) && !errors.Is(res.err, errNoEngine) {
				firstErr = res.err
				cancel()
			}
			if res.row.AbortReason != nil && *res.row.AbortReason == AbortPreempted {
				p.count("preempted", 1)
			}
			continue
		}
		prog.Add(1)
		p.add(res)
		if len(p.pending) >= p.flushAt() || time.Since(last) >= flushRunsEvery {
			if err := p.flush(ctx); err != nil && firstErr == nil {
				firstErr = err
				cancel()
			}
			last = time.Now()
		}
	}
	// Runs finished before an interruption are kept: a rerun does only the
	// others (the preempted ones among them).
	if err := p.flush(context.WithoutCancel(ctx)); err != nil && firstErr == nil {
		firstErr = err
	}
	if firstErr != nil {
		return nil, firstErr
	}
	if err := context.Cause(ctx); err != nil {
		return nil, err
	}
	prog.Done()
	fmt.Fprintln(p.env.Stderr, runTally(p.metrics))
	if line := p.rt.replay.summary(); line != "" {
		fmt.Fprintln(p.env.Stderr, line)
	}
	return p.metrics, nil
}

func (p *runProducer) flushAt() int {
	if p.o.FlushRuns > 0 {
		return p.o.FlushRuns
	}
	return flushRuns
}

func (p *runProducer) add(res *runResult) {
	p.pending = append(p.pending, res)
	p.count("runs", 1)
	if r := res.row.AbortReason; r != nil {
		p.count("aborted", 1)
		p.count("abort_"+*r, 1)
	}
	p.count("turns", len(res.turns))
	p.count("segments", len(res.segments))
	p.done.Add(1)
	if res.row.AbortReason != nil {
		p.aborted.Add(1)
	}
	p.turns.Add(res.row.Turns)
	p.tokens.Add(res.row.OutputTokens)
	if res.row.AbortReason == nil && res.row.Patch != "" {
		p.count("patches", 1)
	}
}

// flush writes the pending runs as one batch: their turns, then their
// segments, then their rollouts rows, each shard receipted with the runs'
// keys and the batch's key (docs/rollout.md §2.5).
func (p *runProducer) flush(ctx context.Context) error {
	if len(p.pending) == 0 {
		return nil
	}
	runs := p.pending
	p.pending = nil
	sort.SliceStable(runs, func(i, j int) bool { return runs[i].row.Index < runs[j].row.Index })
	keys := []string{fmt.Sprintf("%s%s-%05d", batchKeyPrefix, newSessionID()[5:], p.batch)}
	p.batch++
	var rows []records.Rollout
	var turns []records.Turn
	var segs []records.Trajectory
	for _, r := range runs {
		keys = append(keys, r.job.key)
		rows = append(rows, r.row)
		turns = append(turns, r.turns...)
		segs = append(segs, r.segments...)
	}
	if _, err := p.ws[1].WriteShard(ctx, int64(len(turns)), keys, func(out io.Writer) error {
		enc, err := records.NewTurnEncoder(out, records.ArrowOptions{})
		if err != nil {
			return err
		}
		if err := enc.Write(turns...); err != nil {
			return err
		}
		return enc.Close()
	}); err != nil {
		return err
	}
	if _, err := p.ws[2].WriteShard(ctx, int64(len(segs)), keys, func(out io.Writer) error {
		enc, err := records.NewTrajectoryEncoder(out, records.ArrowOptions{})
		if err != nil {
			return err
		}
		if err := enc.Write(segs...); err != nil {
			return err
		}
		return enc.Close()
	}); err != nil {
		return err
	}
	_, err := p.ws[0].WriteShard(ctx, int64(len(rows)), keys, func(out io.Writer) error {
		enc := records.NewRolloutEncoder(out)
		if err := enc.Write(rows...); err != nil {
			return err
		}
		return enc.Close()
	})
	return err
}

// runTally is the end-of-run summary line.
func runTally(m map[string]any) string {
	n := func(k string) int { v, _ := m[k].(int); return v }
	var b strings.Builder
	fmt.Fprintf(&b, "rollout: %d runs: %d with a patch, %d aborted", n("runs"), n("patches"), n("aborted"))
	var reasons []string
	for k := range m {
		if r, ok := strings.CutPrefix(k, "abort_"); ok {
			reasons = append(reasons, fmt.Sprintf("%s %d", r, n(k)))
		}
	}
	sort.Strings(reasons)
	if len(reasons) > 0 {
		fmt.Fprintf(&b, " (%s)", strings.Join(reasons, ", "))
	}
	fmt.Fprintf(&b, "; %d turns, %d segments", n("turns"), n("segments"))
	if r := n("resumed"); r > 0 {
		fmt.Fprintf(&b, "; %d resumed from an earlier attempt", r)
	}
	return b.String()
}
