package sync

import (
	"context"
	"fmt"
	"time"

	"github.com/urfave/cli/v2"

	"github.com/kilnrl/kiln/formats/dataset"
	"github.com/kilnrl/kiln/internal/enginectl"
	"github.com/kilnrl/kiln/internal/stagecmd"
)

// Help is kiln-sync's manual: the combined form, and the contract in brief.
const Help = `Puts the weights kiln-train committed in front of the engines that generate the
next rollouts (docs/sync.md). Weights are versioned data: each publish commits a
"weights" version with a number N that only grows; a pull rebuilds a version on
an engine host byte for byte, checked; a reload makes every engine serve it and
proves it does.

Without a command, kiln-sync does all three:
   publish --checkpoint as a version of --out, with --to as the local base for
   xor deltas; pull it into --to; reload every --engine from the pulled
   directory as weights N.
The committed weights reference (name@version) is the last line of stdout;
--print-version prints it without doing anything. --to must be a directory the
engines read at the same path (a shared filesystem). With engines on other
hosts' local disks, run the steps apart: publish once, pull on each engine host
(srun -w HOST kiln-sync pull ...), then one reload for the fleet.

   publish   commit a weights version: full (every file whole), or a delta of
             the tensors whose xxh3-128 changed since the latest version
   pull      make a local directory hold a version, verified, switched atomically
   reload    make every engine load a directory and serve it as weights N

A version is full on --full, for the first version, every --full-every deltas,
after a publish that did not complete, or when anything but tensor bytes
changed; otherwise it is a delta on the version latest names (xor with a
verified local base in --base-dir/--to, --encoding overwrite, else replace).
Engines are reloaded together and stay paused if any fails: nothing generates
with mixed weights, and a rerun completes the reload.

Examples:
   kiln-sync --checkpoint checkpoints/step-3 --out weights/qwen3 --to /shared/weights \
       --engine http://node1:8000 --engine http://node2:8000
   kiln-sync --checkpoint checkpoints/step-3 --out weights/qwen3 --to /shared/weights \
       --engine http://node1:30000 --protocol sglang --flush
   kiln-sync --checkpoint checkpoints/step-3 --out weights/qwen3 --to /shared/weights \
       --engine http://node1:8000 --print-version`

// PublishHelp is kiln-sync publish's manual.
const PublishHelp = `Commits a weights version of --out from --checkpoint: a checkpoints version
(kiln-train's; downloaded and checked) or a Hugging Face model directory (the
base model). It holds what an engine loads and nothing else: the safetensors
shards and their index, config.json, the generation config, the tokenizer and
chat template files (optimizer state, trainer state and metrics are left out).
Each version has a weights number N, claimed before anything is uploaded and
never reused; the latest pointer moves only to a higher N.

The version id names the checkpoint, not its encoding: an identical rerun finds
the version committed and publishes nothing, and --print-version needs no store
state. A version is full when --full is given, when --out has no version yet,
after --full-every K deltas (0: never), when a publish above the base's number
did not complete, when the base cannot be read and checked, or when anything
but tensor bytes changed; the manifest's full_reason says which. Otherwise it is
a delta on the version latest names: only the tensors whose bytes changed, each
one zstd frame in a pack, encoded
   xor        new XOR old (needs a verified copy of the base: --base-dir, a
              pull directory of kiln-sync pull that holds it)
   overwrite  the changed byte positions and their new bytes (--encoding overwrite)
   replace    the new bytes (without the base's bytes)
A checkpoint equal to the base is an empty delta (a new N, nothing stored).

Examples:
   kiln-sync publish --checkpoint checkpoints/step-3 --out weights/qwen3
   kiln-sync publish --checkpoint /models/Qwen3-0.6B --out weights/qwen3 --full
   kiln-sync publish --checkpoint checkpoints/step-4 --out weights/qwen3 --base-dir /local/weights`

// PullHelp is kiln-sync pull's manual.
const PullHelp = `Makes --to hold the weights version --weights names, byte for byte, and prints
the version's directory (the path kiln-sync reload --path takes; its leading
digits are the weights number N) as the last line of stdout.

   DIR/state.json      the version DIR holds: {"format":"kiln.weights-state/v1",
                       "dataset", "version", "number", "dir"}
   DIR/NNNNNN-<id>/    that version's model directory, never modified once in place
   DIR/current         symlink to it, swapped atomically after state.json
   DIR/.lock           pulls into one DIR take turns
   DIR/.staging-*/     a pull in progress (removed by the next pull)

The bases of --weights are walked back to a full version, or to the version DIR
holds when it is one of them. The staging directory starts as a copy of the
held version's files (reflinked where the filesystem can; the held directory is
only read) or as the full version's files, downloaded with parallel ranged
reads and checked (size, sha256). Each delta is applied in order; xor and
overwrite payloads first check the base bytes' xxh3-128. Every changed tensor
and every file is then checked against the version's rows, fsynced, and renamed
into place; state.json is written, current swapped, and versions older than the
one held before are deleted (that one stays: an engine may still serve it).

Any mismatch names the tensors or files (up to 20), exits 4, and leaves DIR's
state and held version as they were. A pull of the version DIR holds does
nothing. A pull killed at any point leaves the previous version in place; a
rerun completes it.

Examples:
   kiln-sync pull --weights weights/qwen3 --to /local/weights
   kiln-sync pull --weights weights/qwen3@v-3f2a --to /local/weights`

// ReloadHelp is kiln-sync reload's manual.
const ReloadHelp = `Asks every --engine to load the model directory --path and serve it as weights
number --version, then checks each one reports it. The fleet moves together:
all engines are paused, then reloaded in parallel, then checked, and resumed
only when every engine reports N. If any fails, none is resumed (nothing
generates with mixed weights): the error names each failing engine and why,
and the ones that did reload, and the exit status is 1; rerun the same reload
to complete it. --path is read by the engines, at that path on their hosts.

   vllm     vLLM with VLLM_SERVER_DEV_MODE=1, or kiln's serve.py: /pause,
            /collective_rpc reload_weights, /update_weight_version, /v1/models, /resume
   sglang   /pause_generation, /flush_cache, /update_weights_from_disk,
            /get_weight_version, /continue_generation

Every call has a deadline; --timeout bounds the whole reload.

Examples:
   kiln-sync reload --engine http://node1:8000 --engine http://node2:8000 \
       --path /local/weights/000007-v-3f2a --version 7
   kiln-sync reload --engine http://node1:30000 --protocol sglang \
       --path /local/weights/000007-v-3f2a --version 7`

// PullFlags are kiln-sync pull's flags, bound to its fields.
type PullFlags struct {
	Weights, To string
	Workers     int
}

// Flags are the flags of kiln-sync pull.
func (f *PullFlags) Flags() []cli.Flag {
	return []cli.Flag{
		stagecmd.StoreFlag(),
		&cli.StringFlag{Name: "weights", Required: true, Destination: &f.Weights, Usage: "the weights version to pull (name: its latest; name@version)"},
		&cli.StringFlag{Name: "to", Required: true, Destination: &f.To, Usage: "the local directory to pull into (created if needed)"},
		workersFlag(&f.Workers),
	}
}

func workersFlag(dst *int) cli.Flag {
	return &cli.IntFlag{Name: "workers", Value: defaultPullWorkers, Destination: dst, Usage: "concurrent ranged reads and tensor patches of a pull (memory: about one tensor each)"}
}

// PullCommand is kiln-sync pull.
func PullCommand(env *stagecmd.Env) *cli.Command {
	f := &PullFlags{}
	return &cli.Command{
		Name:        "pull",
		Usage:       "make a local directory hold a weights version, verified, switched atomically",
		Description: PullHelp,
		Flags:       f.Flags(),
		Action: func(c *cli.Context) error {
			if c.NArg() != 0 {
				return stagecmd.Usagef("kiln-sync pull takes no arguments, got %q; see `kiln-sync pull --help`", c.Args().First())
			}
			ref, err := dataset.ParseRef(f.Weights)
			if err != nil {
				return stagecmd.UsageError{Err: fmt.Errorf("--weights: %w", err)}
			}
			if f.Workers < 1 {
				return stagecmd.Usagef("--workers %d: want at least 1", f.Workers)
			}
			st, err := stagecmd.OpenExistingStore(c)
			if err != nil {
				return err
			}
			res, err := Pull(c.Context, env, st, ref, f.To, PullOptions{Workers: f.Workers})
			if err != nil {
				return err
			}
			fmt.Fprintln(env.Stdout, res.ModelDir)
			return nil
		},
	}
}

// ReloadFlags are the engine flags of kiln-sync reload and of the
// combined form.
type ReloadFlags struct {
	Protocol, APIKey string
	Timeout          time.Duration
	Flush            bool
}

// Flags are the flags every reload takes; --engine is read by name
// (a slice flag bound to a field keeps values across runs in tests).
func (f *ReloadFlags) Flags(required bool) []cli.Flag {
	return []cli.Flag{
		&cli.StringSliceFlag{Name: "engine", Required: required, Usage: "an engine's base URL (http://HOST:PORT); repeat for each engine of the fleet"},
		&cli.StringFlag{Name: "protocol", Value: string(enginectl.VLLM), Destination: &f.Protocol, Usage: "the engines' control protocol: vllm (also kiln's serve.py) or sglang"},
		&cli.DurationFlag{Name: "timeout", Value: 10 * time.Minute, Destination: &f.Timeout, Usage: "bound on the whole reload; every call also has its own deadline"},
		&cli.BoolFlag{Name: "flush", Destination: &f.Flush, Usage: "vLLM: reset the prefix cache after pausing (SGLang always flushes)"},
		&cli.StringFlag{Name: "api-key", EnvVars: []string{"KILN_ENGINE_API_KEY"}, Destination: &f.APIKey, Usage: "sent to the engines as Authorization: Bearer KEY"},
	}
}

// options turns the flags into enginectl's options (a bad protocol or
// timeout is a usage error).
func (f *ReloadFlags) options(env *stagecmd.Env) (enginectl.Options, error) {
	p, err := enginectl.ParseProtocol(f.Protocol)
	if err != nil {
		return enginectl.Options{}, stagecmd.UsageError{Err: fmt.Errorf("--protocol: %w", err)}
	}
	if f.Timeout <= 0 {
		return enginectl.Options{}, stagecmd.Usagef("--timeout %s: want a positive duration such as 10m", f.Timeout)
	}
	return enginectl.Options{Protocol: p, APIKey: f.APIKey, Flush: f.Flush, Log: env.Log}, nil
}

// reload runs enginectl.Reload bounded by timeout; a failure is exit 1
// (the fleet stays paused, docs/sync.md §3).
func reload(ctx context.Context, env *stagecmd.Env, engines []string, path string, version int64, timeout time.Duration, o enginectl.Options) error {
	ctx, cancel := context.WithTimeout(ctx, timeout)
	defer cancel()
	if err := enginectl.Reload(ctx, engines, path, version, o); err != nil {
		return err
	}
	env.Log.Info("engines serve the weights", "engines", len(engines), "path", path, "version", version)
	return nil
}

// ReloadCommand is kiln-sync reload.
func ReloadCommand(env *stagecmd.Env) *cli.Command {
	f := &ReloadFlags{}
	var path string
	var version int64
	return &cli.Command{
		Name:        "reload",
		Usage:       "make every engine load a model directory and serve it as weights N",
		Description: ReloadHelp,
		Flags: append(f.Flags(true),
			&cli.StringFlag{Name: "path", Required: true, Destination: &path, Usage: "the model directory the engines load (a pulled DIR/NNNNNN-<id>), at that path on their hosts"},
			// Not marked Required: the app's own --version (print the
			// build) shares the name; the action checks it.
			&cli.Int64Flag{Name: "version", Destination: &version, Usage: "the weights number N the engines must report (the pulled directory's leading digits)"},
		),
		Action: func(c *cli.Context) error {
			if c.NArg() != 0 {
				return stagecmd.Usagef("kiln-sync reload takes no arguments, got %q; see `kiln-sync reload --help`", c.Args().First())
			}
			if !c.IsSet("version") {
				return stagecmd.Usagef("missing required flag --version; see `kiln-sync reload --help`")
			}
			if version < 1 {
				return stagecmd.Usagef("--version %d: want the weights number N ≥ 1 of the pulled version", version)
			}
			o, err := f.options(env)
			if err != nil {
				return err
			}
			return reload(c.Context, env, c.StringSlice("engine"), path, version, f.Timeout, o)
		},
	}
}

// PublishFlags are the publish flags of kiln-sync publish and of the
// combined form, bound to its fields.
type PublishFlags struct {
	Checkpoint, Out, BaseDir, Encoding, CacheDir string
	Full, PrintVersion                           bool
	FullEvery                                    int
}

// Flags are the publish flags; required marks --checkpoint and --out so
// (the combined form checks them itself: its subcommands do not need
// them).
func (f *PublishFlags) Flags(required bool) []cli.Flag {
	return []cli.Flag{
		&cli.StringFlag{Name: "checkpoint", Required: required, Destination: &f.Checkpoint, Usage: "what to publish: a checkpoints version (name or name@version) or a Hugging Face model directory"},
		&cli.StringFlag{Name: "out", Required: required, Destination: &f.Out, Usage: "the weights dataset to write (e.g. weights/qwen3)"},
		&cli.BoolFlag{Name: "full", Destination: &f.Full, Usage: "store every file whole, whatever the base"},
		&cli.IntFlag{Name: "full-every", Value: DefaultFullEvery, Destination: &f.FullEvery, Usage: "a full version after K-1 deltas (0: only when needed)"},
		&cli.StringFlag{Name: "encoding", Destination: &f.Encoding, Usage: "delta payloads when the base's bytes are at hand: xor (default) or overwrite; without them, replace"},
		&cli.StringFlag{Name: "cache-dir", Destination: &f.CacheDir, Usage: "where a checkpoints version is downloaded and checked (default ~/.cache/kiln/checkpoints)"},
		stagecmd.PrintVersionFlag(&f.PrintVersion),
	}
}

func (f *PublishFlags) options(baseDir string) PublishOptions {
	return PublishOptions{Checkpoint: f.Checkpoint, CacheDir: f.CacheDir, Full: f.Full, FullEvery: f.FullEvery, BaseDir: baseDir, Encoding: f.Encoding}
}

func (f *PublishFlags) output(env *stagecmd.Env) stagecmd.Output {
	return stagecmd.Output{Name: f.Out, PrintVersion: f.PrintVersion, Hook: env.Hook}
}

// PublishCommand is kiln-sync publish.
func PublishCommand(env *stagecmd.Env) *cli.Command {
	f := &PublishFlags{}
	return &cli.Command{
		Name:        "publish",
		Usage:       "commit a weights version (full, or a delta of the changed tensors) from a checkpoint",
		Description: PublishHelp,
		Flags: append([]cli.Flag{stagecmd.StoreFlag()}, append(f.Flags(true),
			&cli.StringFlag{Name: "base-dir", Destination: &f.BaseDir, Usage: "a pull directory (kiln-sync pull --to) holding a verified copy of the base, for xor or overwrite deltas"},
		)...),
		Action: func(c *cli.Context) error {
			if c.NArg() != 0 {
				return stagecmd.Usagef("kiln-sync publish takes no arguments, got %q; see `kiln-sync publish --help`", c.Args().First())
			}
			st, err := stagecmd.OpenStore(c)
			if err != nil {
				return err
			}
			_, err = Publish(c.Context, env, st, f.output(env), f.options(f.BaseDir))
			return err
		},
	}
}
