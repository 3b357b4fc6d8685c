package train

import (
	"context"
	"crypto/sha256"
	"encoding/hex"
	"fmt"
	"io"
	"io/fs"
	"math"
	"os"
	"path/filepath"
	"slices"
	"sort"
	"strconv"
	"strings"
	"time"

	"github.com/urfave/cli/v2"

	"github.com/kilnrl/kiln/formats/dataset"
	"github.com/kilnrl/kiln/formats/records"
	"github.com/kilnrl/kiln/formats/store"
	"github.com/kilnrl/kiln/internal/stagecmd"
)

// codeVersion is the train stage's code version (dataset.Identity): bump
// it whenever the batches or the checkpoint for the same inputs and
// arguments change.
// 2: PPO's old policy is fixed before the first optimizer step
// (--old-logprobs), so steps 2… of a run have a ratio to clip.
const codeVersion = "2"

// Flags is what kiln-train's flags set.
type Flags struct {
	Trajectories, Advantages, Model, Out, ResumeFrom string
	GlobalBatchSize, MaxTokens, NProc, Epochs        int
	Launcher, Python, GPUDir, CacheDir, WorkDir      string
	TrainerSocket                                    string
	Packing                                          string
	SCPath                                           string
	Objective, Correction, Reduction                 string
	OldLogprobs, Dtype                               string
	EpsClip, EpsClipHigh, EpsClipC                   float64
	CorrectionLow, CorrectionHigh                    float64
	KLCoef, EntropyCoef, LR, WeightDecay, GradClip   float64
	Temperature                                      float64
	Seed                                             int64
	ScoreCentering, PrintVersion, DryRun, KeepWork   bool
}

// Flags are kiln-train's flags, bound to the fields of f. The loss's and
// the optimizer's defaults are the trainer's own (defaults.go).
func (f *Flags) Flags() []cli.Flag {
	d := defaults()
	correction := "none"
	if d.Loss.Correction != nil {
		correction = *d.Loss.Correction
	}
	return []cli.Flag{
		stagecmd.StoreFlag(),
		&cli.StringFlag{Name: "trajectories", Value: "trajectories", Destination: &f.Trajectories, Usage: "trajectories dataset: the segments to train (name or name@version)"},
		&cli.StringFlag{Name: "advantages", Value: "advantages", Destination: &f.Advantages, Usage: "advantages dataset computed from --trajectories (kiln-advantages)"},
		&cli.StringFlag{Name: "model", Required: true, Destination: &f.Model, Usage: "the base model: a Hugging Face checkpoint directory, or a checkpoints version (name or name@version)"},
		&cli.StringFlag{Name: "out", Value: "checkpoints", Destination: &f.Out, Usage: "checkpoints dataset name to write"},
		&cli.StringFlag{Name: "resume-from", Destination: &f.ResumeFrom, Usage: "a checkpoints version (or directory) with optimizer.pt: the trainer loads its weights and optimizer state"},
		&cli.IntFlag{Name: "global-batch-size", Value: 8, Destination: &f.GlobalBatchSize, Usage: "rollouts per optimizer step (G); trailing rollouts that fill no step are dropped and counted"},
		&cli.IntFlag{Name: "epochs", Value: 1, Destination: &f.Epochs, Usage: "passes over the batch: the steps run N times in the same order (PPO epochs, verl's ppo_epochs); the old policy stays the one fixed before the first step"},
		&cli.IntFlag{Name: "max-tokens-per-microbatch", Value: 16384, Destination: &f.MaxTokens, Usage: "token cap of a micro-batch (first-fit packing; a longer segment gets its own); 0: one micro-batch per step"},
		&cli.StringFlag{Name: "packing", Value: string(FirstFit), Destination: &f.Packing, Usage: "first-fit (segments in input order) or first-fit-decreasing (longest first: fewer micro-batches; the order within a step does not change the loss)"},
		&cli.StringFlag{Name: "launcher", Value: string(LaunchPython), Destination: &f.Launcher, Usage: "python (one process), torchrun (--nproc processes, FSDP) or srun (Slurm tasks)"},
		&cli.IntFlag{Name: "nproc", Value: 1, Destination: &f.NProc, Usage: "processes for torchrun, tasks for srun"},
		&cli.StringFlag{Name: "trainer-socket", EnvVars: []string{"KILN_TRAINER_SOCKET"}, Destination: &f.TrainerSocket, Usage: "run the trainer on the warm one listening on this Unix socket (python -m kiln_gpu.forkserver --socket PATH), not a new process: no interpreter start-up or torch imports per run (docs/train-stage.md §8.1); --launcher python only"},
		&cli.StringFlag{Name: "python", Destination: &f.Python, Usage: "the trainer's interpreter (default $KILN_PYTHON, else the venv in ~/.cache/kiln/gpu-venv-current, else python3)"},
		&cli.StringFlag{Name: "gpu-dir", Destination: &f.GPUDir, Usage: "the directory holding kiln_gpu/ (default $KILN_GPU_DIR, else gpu/ beside the binary's directory: BIN/../gpu; never one found from the working directory)"},
		&cli.StringFlag{Name: "cache-dir", EnvVars: []string{"KILN_CHECKPOINT_CACHE"}, Destination: &f.CacheDir, Usage: "where checkpoints versions are materialized (default ~/.cache/kiln/checkpoints)"},
		&cli.StringFlag{Name: "work-dir", Destination: &f.WorkDir, Usage: "parent of the run's work directory (batches and the trainer's output; default $TMPDIR)"},
		&cli.BoolFlag{Name: "keep-work", Destination: &f.KeepWork, Usage: "keep the work directory after the run"},
		&cli.StringFlag{Name: "objective", Value: d.Loss.Objective, Destination: &f.Objective, Usage: "ppo, gspo, cispo or reinforce"},
		&cli.Float64Flag{Name: "eps-clip", Value: d.Loss.EpsClip, Destination: &f.EpsClip, Usage: "PPO clip: lower epsilon"},
		&cli.Float64Flag{Name: "eps-clip-high", Destination: &f.EpsClipHigh, Usage: "PPO clip: upper epsilon (default --eps-clip)"},
		&cli.Float64Flag{Name: "eps-clip-c", Destination: &f.EpsClipC, Usage: "dual-clip constant (> 1; off by default)"},
		&cli.StringFlag{Name: "old-logprobs", Value: d.Loss.OldLogprobs, Destination: &f.OldLogprobs, Usage: "PPO's old policy, fixed before the first optimizer step: recompute (the trainer's logprobs with the starting weights, one forward pass; as slime and verl) or rollout (the sampler's logprobs)"},
		&cli.StringFlag{Name: "correction", Value: correction, Destination: &f.Correction, Usage: "rollout-logprob correction: none, tis or mis"},
		&cli.Float64Flag{Name: "correction-low", Value: d.Loss.CorrectionLow, Destination: &f.CorrectionLow, Usage: "tis/mis lower bound"},
		&cli.Float64Flag{Name: "correction-high", Value: d.Loss.CorrectionHigh, Destination: &f.CorrectionHigh, Usage: "tis/mis upper bound"},
		&cli.StringFlag{Name: "reduction", Value: d.Loss.Reduction, Destination: &f.Reduction, Usage: "rollout (per-rollout token mean, / G), token-mean or sequence-mean"},
		&cli.Float64Flag{Name: "kl-coef", Value: d.Loss.KLCoef, Destination: &f.KLCoef, Usage: "KL loss coefficient"},
		&cli.Float64Flag{Name: "entropy-coef", Value: d.Loss.EntropyCoef, Destination: &f.EntropyCoef, Usage: "entropy bonus coefficient"},
		&cli.BoolFlag{Name: "score-centering", Destination: &f.ScoreCentering, Usage: "SC REINFORCE (needs recorded top-p nuclei or top-k heads)"},
		&cli.StringFlag{Name: "score-centering-path", Value: d.Loss.ScoreCenteringPath, Destination: &f.SCPath, Usage: "the recorded spans score centering reads: top-p (the sampler's nuclei) or top-k (its top-k heads, full-vocabulary probabilities)"},
		&cli.Float64Flag{Name: "lr", Value: d.Optimizer.LR, Destination: &f.LR, Usage: "AdamW learning rate"},
		&cli.Float64Flag{Name: "weight-decay", Value: d.Optimizer.WeightDecay, Destination: &f.WeightDecay, Usage: "AdamW weight decay"},
		&cli.Float64Flag{Name: "grad-clip", Value: d.Optimizer.GradClip, Destination: &f.GradClip, Usage: "gradient norm clip (0: off)"},
		&cli.Float64Flag{Name: "temperature", Value: d.Temperature, Destination: &f.Temperature, Usage: "the sampling temperature: logprobs are of logits / T"},
		&cli.Int64Flag{Name: "seed", Destination: &f.Seed, Usage: "the trainer's seed"},
		&cli.StringFlag{Name: "dtype", Value: "float32", Destination: &f.Dtype, Usage: "the trainer's compute dtype: float32 (bf16 autocast on CUDA) or float64 (the on-policy identity far below 1e-5, beside an engine computing in float64: serve.py --dtype float64; CPU-sized models); the checkpoint is saved in the base's dtype"},
		&cli.BoolFlag{Name: "dry-run", Destination: &f.DryRun, Usage: "print plan.json and the trainer command, and stop (nothing is written)"},
		stagecmd.PrintVersionFlag(&f.PrintVersion),
	}
}

// Help is kiln-train's manual.
const Help = `Trains a Hugging Face causal LM on trajectories and their advantages and commits
what the trainer saved as a checkpoints version (docs/train-stage.md).

The segments of --trajectories are joined to the rows of --advantages, which
must have been computed from that trajectories version (its lineage is
checked; segments the advantages left out, such as infrastructure failures,
are not trained and are counted). Segments are grouped by rollout id in order
of first appearance; each optimizer step takes exactly --global-batch-size
rollouts with ALL their segments, so a rollout never spans steps; the
rollouts left over are dropped and counted. Each step's segments are packed
first fit into micro-batches of at most --max-tokens-per-microbatch tokens
(a longer segment gets one of its own; one longer than the model's
max_position_embeddings is an error naming it).

The batches are written as safetensors files with a plan.json into a work
directory, and the trainer runs on them:
   python    PYTHON -m kiln_gpu.train --plan DIR/plan.json
   torchrun  PYTHON -m torch.distributed.run --nproc-per-node N -m kiln_gpu.train ...
   srun      srun --ntasks N ... sh -c 'RANK=$SLURM_PROCID ...' PYTHON -m kiln_gpu.train ...
with --gpu-dir on PYTHONPATH; or, with --trainer-socket PATH, as a fork of
the warm trainer listening there (python -m kiln_gpu.forkserver --socket
PATH: torch imported once, not per run). Its progress is a bar on a terminal, log lines
otherwise; its stderr is passed through prefixed "trainer:". When it exits 0
having saved a complete checkpoint (weights in model-0000i-of-0000n.safetensors
with their index, config.json, the base's tokenizer and chat template,
metrics.jsonl, optimizer.pt, trainer_state.json), every file becomes an
attachment of the new checkpoints version, listed in its rows (name, size,
sha256), with the per-step metrics in the manifest. A trainer that fails or is
killed commits nothing; rerunning the same command starts it again.

PPO's old policy (the ratio's denominator, for ppo, gspo and cispo) is fixed
before the first optimizer step: with --old-logprobs recompute (the default)
the trainer computes it with the starting weights in one forward pass over the
batches, so step 1's ratio is 1 and later steps clip against it; with rollout
it is the sampler's logprobs. --correction weighs that old policy against the
sampler's (decoupled PPO).

--model and --resume-from take a directory or a checkpoints version, which is
downloaded (and checked) into --cache-dir. With --resume-from the trainer
loads its weights and optimizer state.

Examples:
   kiln-train --trajectories trajectories/step-3 --advantages advantages/step-3 \
       --model /models/Qwen3-0.6B --out checkpoints/step-3 --global-batch-size 64
   kiln-train --trajectories trajectories/step-4 --advantages advantages/step-4 \
       --model checkpoints/step-3 --resume-from checkpoints/step-3 --out checkpoints/step-4
   kiln-train --trajectories trajectories/step-3 --advantages advantages/step-3 \
       --model /models/Qwen3-0.6B --out checkpoints/step-3 --dry-run   # print plan.json and the command`

// App is the kiln-train binary on env.
func App(env *stagecmd.Env) *cli.App {
	f := &Flags{}
	return env.App(&cli.App{
		Name:        "kiln-train",
		Usage:       "train a Hugging Face model on rollout-atomic batches and commit a checkpoint",
		Description: Help,
		Flags:       f.Flags(),
		Action:      func(c *cli.Context) error { return Action(c, env, f) },
	})
}

// Options describe one kiln-train run.
type Options struct {
	Trajectories, Advantages, Model, ResumeFrom string
	Batching
	Loss      LossConfig
	Optimizer OptimizerConfig
	Seed      int64
	Temp      float64
	// Dtype is the trainer's compute dtype (plan "dtype"); "" is float32.
	Dtype    string
	Launcher Launcher
	NProc    int
	Python   string
	GPUDir   string
	CacheDir string
	WorkDir  string
	// TrainerSocket is a warm trainer's socket (forkserver.go); "" starts
	// a trainer process.
	TrainerSocket string
	KeepWork      bool
	DryRun        bool
}

// Action runs kiln-train from parsed flags.
func Action(c *cli.Context, env *stagecmd.Env, f *Flags) error {
	if c.NArg() != 0 {
		return stagecmd.Usagef("kiln-train takes no arguments, got %q; see --help", c.Args().First())
	}
	o, err := f.options(c)
	if err != nil {
		return err
	}
	st, err := stagecmd.OpenStore(c)
	if err != nil {
		return err
	}
	out := stagecmd.Output{Name: f.Out, PrintVersion: f.PrintVersion, Hook: env.Hook}
	_, err = Run(c.Context, env, st, out, o)
	return err
}

func (f *Flags) options(c *cli.Context) (Options, error) {
	d := defaults()
	red, err := ParseReduction(f.Reduction)
	if err != nil {
		return Options{}, stagecmd.UsageError{Err: err}
	}
	l, err := ParseLauncher(f.Launcher)
	if err != nil {
		return Options{}, stagecmd.UsageError{Err: err}
	}
	switch f.Objective {
	case "ppo", "gspo", "cispo", "reinforce":
	default:
		return Options{}, stagecmd.Usagef("--objective %q: want ppo, gspo, cispo or reinforce", f.Objective)
	}
	var corr *string
	switch f.Correction {
	case "none", "":
	case "tis", "mis":
		s := f.Correction
		corr = &s
	default:
		return Options{}, stagecmd.Usagef("--correction %q: want none, tis or mis", f.Correction)
	}
	switch f.OldLogprobs {
	case "recompute":
	case "rollout":
		if corr != nil && f.Objective != "reinforce" {
			// old = rollout makes the correction's ratio exp(old − roll) 1
			return Options{}, stagecmd.Usagef("--correction %s with --old-logprobs rollout does nothing for --objective %s: the rollout logprobs are already the old policy; use --old-logprobs recompute or --correction none",
				*corr, f.Objective)
		}
	default:
		return Options{}, stagecmd.Usagef("--old-logprobs %q: want recompute or rollout", f.OldLogprobs)
	}
	switch f.Dtype {
	case "float32", "float64":
	default:
		return Options{}, stagecmd.Usagef("--dtype %q: want float32 or float64", f.Dtype)
	}
	scPath := ""
	switch f.SCPath {
	case "top-p":
	case "top-k":
		scPath = "top-k"
	default:
		return Options{}, stagecmd.Usagef("--score-centering-path %q: want top-p or top-k", f.SCPath)
	}
	packing := Packing(f.Packing)
	if packing != FirstFit && packing != FirstFitDecreasing {
		return Options{}, stagecmd.Usagef("--packing %q: want first-fit or first-fit-decreasing", f.Packing)
	}
	opt := func(name string, v float64) *float64 {
		if c.IsSet(name) {
			return &v
		}
		return nil
	}
	if c.IsSet("eps-clip-c") && !(f.EpsClipC > 1) {
		return Options{}, stagecmd.Usagef("--eps-clip-c %v: the dual-clip constant must be > 1", f.EpsClipC)
	}
	switch {
	case f.GlobalBatchSize < 1:
		return Options{}, stagecmd.Usagef("--global-batch-size %d: want at least 1 rollout per step", f.GlobalBatchSize)
	case f.Epochs < 1:
		return Options{}, stagecmd.Usagef("--epochs %d: want at least 1 pass over the batch", f.Epochs)
	case f.MaxTokens < 0:
		return Options{}, stagecmd.Usagef("--max-tokens-per-microbatch %d: want a positive cap (or 0 for one micro-batch per step)", f.MaxTokens)
	case f.NProc < 1:
		return Options{}, stagecmd.Usagef("--nproc %d: want at least 1", f.NProc)
	case !(f.Temperature > 0):
		return Options{}, stagecmd.Usagef("--temperature %v: want > 0 (the sampler's temperature)", f.Temperature)
	case !(f.LR > 0):
		return Options{}, stagecmd.Usagef("--lr %v: want > 0", f.LR)
	case f.Model == "":
		return Options{}, stagecmd.Usagef("--model: want a checkpoint directory or a checkpoints version")
	}
	if f.TrainerSocket != "" && l != LaunchPython {
		return Options{}, stagecmd.Usagef("--trainer-socket runs the trainer in one process, --launcher %s starts several: drop one of them", l)
	}
	python := f.Python
	if python == "" {
		python = DefaultPython(os.Getenv)
	}
	gpu := f.GPUDir
	if gpu == "" {
		gpu = DefaultGPUDir(os.Getenv)
	}
	cache := f.CacheDir
	if cache == "" {
		if home, err := os.UserHomeDir(); err == nil {
			cache = filepath.Join(home, ".cache", "kiln", "checkpoints")
		}
	}
	return Options{
		Trajectories: f.Trajectories, Advantages: f.Advantages, Model: f.Model, ResumeFrom: f.ResumeFrom,
		Batching: Batching{GlobalBatchSize: f.GlobalBatchSize, MaxTokens: f.MaxTokens, Packing: packing, Reduction: red, Epochs: f.Epochs},
		Loss: LossConfig{Objective: f.Objective, EpsClip: f.EpsClip, EpsClipHigh: opt("eps-clip-high", f.EpsClipHigh), EpsClipC: opt("eps-clip-c", f.EpsClipC),
			Correction: corr, CorrectionLow: f.CorrectionLow, CorrectionHigh: f.CorrectionHigh, Reduction: string(red),
			KLCoef: f.KLCoef, EntropyCoef: f.EntropyCoef, ScoreCentering: f.ScoreCentering, ScoreCenteringPath: scPath,
			OldLogprobs: f.OldLogprobs},
		Optimizer: OptimizerConfig{LR: f.LR, WeightDecay: f.WeightDecay, Betas: d.Optimizer.Betas, Eps: d.Optimizer.Eps, GradClip: f.GradClip},
		Seed:      f.Seed, Temp: f.Temperature, Dtype: f.Dtype, Launcher: l, NProc: f.NProc,
		Python: python, GPUDir: gpu, CacheDir: cache, WorkDir: f.WorkDir, TrainerSocket: f.TrainerSocket, KeepWork: f.KeepWork, DryRun: f.DryRun,
	}, nil
}

// Run trains per o and commits the checkpoints version out names.
func Run(ctx context.Context, env *stagecmd.Env, st store.Store, out stagecmd.Output, o Options) (dataset.Result, error) {
	if o.Loss.OldLogprobs == "" {
		o.Loss.OldLogprobs = defaults().Loss.OldLogprobs // the zero Options trains as kiln-train's default
	}
	inputs, err := stagecmd.ResolveInputs(ctx, st, []string{o.Trajectories, o.Advantages}, out.Part)
	if err != nil {
		return dataset.Result{}, err
	}
	tv, err := dataset.OpenKind(ctx, st, inputs[0], records.TrajectoriesKind(), "--trajectories")
	if err != nil {
		return dataset.Result{}, err
	}
	av, err := dataset.OpenKind(ctx, st, inputs[1], records.AdvantagesKind(), "--advantages")
	if err != nil {
		return dataset.Result{}, err
	}
	if !slices.Contains(av.Inputs, tv.Ref()) {
		names := make([]string, len(av.Inputs))
		for i, in := range av.Inputs {
			names[i] = in.String()
		}
		return dataset.Result{}, stagecmd.BadInputf("advantages %s were not computed from trajectories %s (their inputs: %s): pass the advantages of these trajectories (kiln-advantages --trajectories %s ...)",
			av.Ref(), tv.Ref(), strings.Join(names, ", "), tv.Ref())
	}
	model, err := ResolveModel(ctx, st, o.Model, o.CacheDir, "--model")
	if err != nil {
		return dataset.Result{}, err
	}
	var resume *Model
	if o.ResumeFrom != "" {
		if resume, err = ResolveModel(ctx, st, o.ResumeFrom, o.CacheDir, "--resume-from"); err != nil {
			return dataset.Result{}, err
		}
		if _, err := os.Stat(filepath.Join(resume.Dir, "optimizer.pt")); err != nil {
			return dataset.Result{}, stagecmd.BadInputf("--resume-from %q has no optimizer.pt: resume from a checkpoint kiln-train committed, or train without --resume-from", o.ResumeFrom)
		}
	}
	id := dataset.Identity{Stage: "train", CodeVersion: codeVersion, Inputs: inputs, Args: map[string]any{
		"global_batch_size": o.GlobalBatchSize, "max_tokens_per_microbatch": o.MaxTokens, "packing": string(o.Packing),
		"loss": o.Loss, "optimizer": o.Optimizer, "seed": o.Seed, "temperature": o.Temp,
	}}
	if o.Epochs > 1 { // absent at 1, so one-epoch runs keep the ids they had before --epochs
		id.Args["epochs"] = o.Epochs
	}
	if o.Dtype != "" && o.Dtype != "float32" { // absent at float32, for the same reason
		id.Args["dtype"] = o.Dtype
	}
	for _, m := range []struct {
		m    *Model
		role string
	}{{model, "model"}, {resume, "resume_from"}} {
		switch {
		case m.m == nil:
		case m.m.Ref.Version != "":
			id.Inputs = append(id.Inputs, m.m.Ref)
			id.Args[m.role] = m.m.Ref.String()
		default:
			ext, err := dirIdentity(m.role, m.m.Dir)
			if err != nil {
				return dataset.Result{}, err
			}
			id.External = append(id.External, ext)
		}
	}
	out.Kind = records.CheckpointsKind()
	out.Identity = id

	t0 := time.Now()
	segs, stats, err := ReadJoined(ctx, tv, av, o.Loss.ScoreCenteringPath == "top-k")
	if err != nil {
		return dataset.Result{}, err
	}
	b := o.Batching
	b.MaxContext = model.MaxContext
	layout, err := BuildLayout(segs, b)
	if err != nil {
		return dataset.Result{}, stagecmd.BadInputError{Err: fmt.Errorf("trajectories %s: %w", tv.Ref(), err)}
	}
	if len(layout.Steps) == 0 {
		return dataset.Result{}, stagecmd.BadInputf("trajectories %s: %d rollouts fill no step of --global-batch-size %d: lower it or train on more rollouts",
			tv.Ref(), layout.Dropped, o.GlobalBatchSize)
	}
	plan := &Plan{Format: PlanFormat, Model: model.Dir, Seed: o.Seed, Temperature: o.Temp,
		GlobalBatchSize: o.GlobalBatchSize, Loss: o.Loss, Optimizer: o.Optimizer}
	if o.Dtype != "float32" {
		plan.Dtype = o.Dtype
	}
	if resume != nil {
		plan.ResumeFrom = &resume.Dir
	}
	plan.FillSteps(segs, layout, o.Reduction)
	plan.RepeatEpochs(o.Epochs)
	env.Log.Info("plan", "segments", len(segs), "segments_without_advantages", stats.WithoutAdvantages,
		"steps", len(layout.Steps), "dropped_rollouts", layout.Dropped, "read_s", time.Since(t0).Seconds())
	zeroAdv := allAdvantagesZero(segs)
	if zeroAdv {
		env.Log.Warn("every advantage of the input is 0: training on it teaches nothing (every group's rollouts got the same reward?); see kiln-advantages' summary",
			"advantages", av.Ref().String(), "segments", len(segs))
	}

	if o.DryRun {
		ref, err := out.Identity.Version()
		if err != nil {
			return dataset.Result{}, err
		}
		plan.Out = filepath.Join("WORK", "out")
		b, err := MarshalPlan(plan)
		if err != nil {
			return dataset.Result{}, err
		}
		env.Stdout.Write(b)
		fmt.Fprintln(env.Stdout, strings.Join(Command(o.Launcher, o.Python, o.NProc, filepath.Join("WORK", "plan.json")), " "))
		fmt.Fprintf(env.Stdout, "# would commit %s@%s\n", out.Name, ref)
		return dataset.Result{}, nil
	}
	return stagecmd.Write(ctx, st, out, env.Stdout, env.Log, func(ctx context.Context, w *dataset.Writer) (map[string]any, error) {
		if o.GPUDir == "" || !isDir(filepath.Join(o.GPUDir, "kiln_gpu")) {
			if o.GPUDir == "" {
				return nil, stagecmd.Usagef("no --gpu-dir, no $KILN_GPU_DIR, and no gpu/kiln_gpu beside the binary's directory (BIN/../gpu): pass --gpu-dir REPO/gpu (or set KILN_GPU_DIR)")
			}
			return nil, stagecmd.Usagef("no kiln_gpu package at --gpu-dir %q: pass --gpu-dir REPO/gpu (or set KILN_GPU_DIR)", o.GPUDir)
		}
		gpuDir, _ := filepath.Abs(o.GPUDir)
		work, err := os.MkdirTemp(o.WorkDir, "kiln-train-"+w.Ref().Version+"-")
		if err != nil {
			return nil, fmt.Errorf("work directory under %q: %w (set --work-dir)", o.WorkDir, err)
		}
		if work, err = filepath.Abs(work); err != nil {
			return nil, err
		}
		if !o.KeepWork {
			defer os.RemoveAll(work)
		}
		plan.Out = filepath.Join(work, "out")
		if err := WriteBatches(work, plan, segs, layout, o.Reduction); err != nil {
			return nil, fmt.Errorf("writing the batches: %w", err)
		}
		argv := Command(o.Launcher, o.Python, o.NProc, filepath.Join(work, "plan.json"))
		if o.TrainerSocket != "" {
			env.Log.Info("trainer", "socket", o.TrainerSocket, "plan", filepath.Join(work, "plan.json"), "work", work)
		} else {
			env.Log.Info("trainer", "command", strings.Join(argv, " "), "work", work)
		}
		progress := stagecmd.NewProgress(env.Stderr, env.Log, "train", "steps", int64(len(plan.Steps)))
		tr, err := RunTrainer(ctx, Launch{Argv: argv, Env: launchEnv(o.Launcher, os.Getenv), Dir: work, GPUDir: gpuDir,
			Plan: filepath.Join(work, "plan.json"), Socket: o.TrainerSocket}, env.Stderr, env.Log, progress)
		progress.Done()
		if err != nil {
			return nil, err
		}
		if filepath.Clean(tr.Saved) != filepath.Clean(plan.Out) {
			return nil, fmt.Errorf("the trainer saved to %q, not the plan's out %q: nothing was committed", tr.Saved, plan.Out)
		}
		if err := CheckOut(plan.Out, model); err != nil {
			return nil, err
		}
		unchanged, err := WeightsUnchanged(plan.Out, model.Dir)
		if err != nil { // best effort (a base without safetensors is not compared), never a reason to fail the run
			env.Log.Info("the trained weights were not compared with the base's", "err", err)
		}
		if unchanged {
			env.Log.Warn("the trained weights equal the base's (max tensor difference 0): no step changed a weight; check the advantages, --lr and the base's dtype (an update below its precision rounds away)",
				"base", modelName(model), "steps", len(tr.Steps))
		}
		for _, l := range (Summary{Steps: tr.Steps, ZeroAdvantages: zeroAdv, Unchanged: unchanged}).Lines() {
			fmt.Fprintln(env.Stderr, l)
		}
		files, err := upload(ctx, st, w.Ref(), plan.Out, env.Log)
		if err != nil {
			return nil, err
		}
		if _, err := w.WriteShard(ctx, int64(len(files)), nil, func(wr io.Writer) error {
			enc, err := records.NewCheckpointEncoder(wr, records.ArrowOptions{})
			if err != nil {
				return err
			}
			if err := enc.Write(files...); err != nil {
				return err
			}
			return enc.Close()
		}); err != nil {
			return nil, err
		}
		m := map[string]any{
			"steps": len(plan.Steps), "dropped_rollouts": layout.Dropped, "segments": len(segs),
			"segments_without_advantages": stats.WithoutAdvantages,
			"rollouts_trained":            len(layout.Steps) * o.GlobalBatchSize,
			"base_model":                  modelName(model), "step_metrics": stepColumns(tr.Steps),
		}
		var tokens, trained, mbs int64
		for _, s := range plan.Steps[:len(layout.Steps)] { // one epoch: the batch's own counts
			tokens += s.Tokens
			trained += s.TrainedTokens
			mbs += int64(len(s.MicroBatches))
		}
		m["tokens"], m["trained_tokens"], m["micro_batches"] = tokens, trained, mbs
		if o.Epochs > 1 {
			m["epochs"] = o.Epochs
		}
		if resume != nil {
			m["resume_from"] = modelName(resume)
		}
		m["generated_with_weights"] = generatedWith(tv.Metrics)
		return m, nil
	})
}

// GeneratedWeights is one weights version trajectories were generated
// with, as kiln-train's manifest names it (generated_with_weights,
// docs/train-stage.md §6.2).
type GeneratedWeights struct {
	// Weights is the weights reference (kiln-rollout run --weights).
	Weights string `json:"weights"`
	// Number is its weights number N, the version engines report;
	// -1 when the trajectories' manifest did not say.
	Number int64 `json:"weights_number"`
}

// generatedWith reads the weights the trajectories were generated with
// from their manifest's metrics (kiln-rollout run records "weights" and
// "weights_number", docs/rollout.md §2.5), not from their rows: the
// distinct weights references, in order, with their numbers. Empty when
// the trajectories name none (a run without --weights, or an import). A
// value is a reference or a list of them, and its number a number, its
// decimal string, or a list of them alongside.
func generatedWith(metrics map[string]any) []GeneratedWeights {
	out := []GeneratedWeights{}
	refs, nums := listOf(metrics["weights"]), listOf(metrics["weights_number"])
	for i, r := range refs {
		ref, ok := r.(string)
		if !ok || ref == "" {
			continue
		}
		n := int64(-1)
		if i < len(nums) {
			if v, ok := weightsNumber(nums[i]); ok {
				n = v
			}
		}
		if !slices.ContainsFunc(out, func(g GeneratedWeights) bool { return g.Weights == ref }) {
			out = append(out, GeneratedWeights{Weights: ref, Number: n})
		}
	}
	return out
}

// listOf is v as a list: itself when a list, else a list of it (none for
// nil).
func listOf(v any) []any {
	switch x := v.(type) {
	case nil:
		return nil
	case []any:
		return x
	}
	return []any{v}
}

// weightsNumber reads a weights number: a whole JSON number ≥ 0, or its
// decimal string.
func weightsNumber(v any) (int64, bool) {
	switch x := v.(type) {
	case float64:
		if x >= 0 && x == math.Trunc(x) && x < 1<<53 {
			return int64(x), true
		}
	case string:
		n, err := strconv.ParseInt(x, 10, 64)
		return n, err == nil && n >= 0
	}
	return 0, false
}

func modelName(m *Model) string {
	if m.Ref.Version != "" {
		return m.Ref.String()
	}
	return m.Dir
}

// stepColumns is the per-step metrics as columns: each key of the step
// events (but "event") an array with one value per step (null where a
// step lacked it).
func stepColumns(steps []map[string]any) map[string]any {
	cols := map[string]any{}
	keys := map[string]bool{}
	for _, s := range steps {
		for k := range s {
			if k != "event" {
				keys[k] = true
			}
		}
	}
	for k := range keys {
		col := make([]any, len(steps))
		for i, s := range steps {
			col[i] = s[k]
		}
		cols[k] = col
	}
	return cols
}

// upload stores every regular file under dir as an attachment of ref and
// returns their rows, sorted by name.
func upload(ctx context.Context, st store.Store, ref dataset.Ref, dir string, log interface{ Info(string, ...any) }) ([]records.CheckpointFile, error) {
	var files []records.CheckpointFile
	t0 := time.Now()
	var total int64
	err := filepath.WalkDir(dir, func(p string, d fs.DirEntry, err error) error {
		if err != nil || !d.Type().IsRegular() {
			return err
		}
		rel, _ := filepath.Rel(dir, p)
		rel = filepath.ToSlash(rel)
		f, err := os.Open(p)
		if err != nil {
			return err
		}
		defer f.Close()
		fi, err := f.Stat()
		if err != nil {
			return err
		}
		h := sha256.New()
		if _, err := st.Put(ctx, dataset.AttachmentKey(ref, rel), io.TeeReader(f, h), fi.Size()); err != nil {
			return fmt.Errorf("storing %q of the checkpoint in %s: %w", rel, st.URI(), err)
		}
		total += fi.Size()
		files = append(files, records.CheckpointFile{Name: rel, Size: fi.Size(), SHA256: hex.EncodeToString(h.Sum(nil))})
		return nil
	})
	if err != nil {
		return nil, err
	}
	sort.Slice(files, func(i, j int) bool { return files[i].Name < files[j].Name })
	log.Info("checkpoint stored", "files", len(files), "bytes", total, "seconds", time.Since(t0).Seconds())
	return files, nil
}
