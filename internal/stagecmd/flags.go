package stagecmd

import (
	"context"
	"errors"
	"fmt"
	"io/fs"
	"os"
	"strconv"

	"github.com/urfave/cli/v2"

	"github.com/kilnrl/kiln/formats/dataset"
	"github.com/kilnrl/kiln/formats/store"
)

// StoreFlag is --store (KILN_STORE), on every binary.
func StoreFlag() cli.Flag {
	return &cli.StringFlag{
		Name: "store", EnvVars: []string{"KILN_STORE"}, Value: store.DefaultURI,
		Usage: "where datasets live: a directory, file:///dir or s3://bucket/prefix (S3 settings from KILN_S3_ENDPOINT and the AWS_* variables)",
	}
}

// ShardFlag is --shard i/n for writing commands.
func ShardFlag() cli.Flag {
	return &cli.StringFlag{
		Name:  "shard",
		Usage: "write only part i of n (0-based); defaults to SLURM_ARRAY_TASK_ID/SLURM_ARRAY_TASK_COUNT in a Slurm array; inputs must then be pinned (name@version)",
	}
}

// PrintVersionFlag is --print-version for writing commands, bound to dst
// when given (a command reads the field, not the flag by name).
func PrintVersionFlag(dst ...*bool) cli.Flag {
	var d *bool
	if len(dst) > 0 {
		d = dst[0]
	}
	return &cli.BoolFlag{Name: "print-version", Destination: d, Usage: "print the reference this run would produce (name@version) and exit without doing anything"}
}

// QuietFlag is -q/--quiet (KILN_QUIET), on every command (Env.App adds it):
// print only the result on stdout, for a writing command its committed
// reference, and errors and warnings on stderr; no progress, summaries or
// info logs.
func QuietFlag() cli.Flag {
	return &cli.BoolFlag{Name: "quiet", Aliases: []string{"q"}, EnvVars: []string{"KILN_QUIET"},
		Usage: "print only the result (a writing command: the committed reference) and errors; no progress, summaries or info logs"}
}

// VerboseFlag is -v/--verbose (KILN_VERBOSE), on every command: debug logs.
func VerboseFlag() cli.Flag {
	return &cli.BoolFlag{Name: "verbose", Aliases: []string{"v"}, EnvVars: []string{"KILN_VERBOSE"}, Usage: "log debug messages too"}
}

// LogFormatFlag is --log-format text|json (KILN_LOG_FORMAT), on every
// command: how log lines on stderr are written.
func LogFormatFlag() cli.Flag {
	return &cli.StringFlag{Name: "log-format", EnvVars: []string{"KILN_LOG_FORMAT"}, Value: "text",
		Usage: "log lines on stderr as text (key=value) or json (one object per line)"}
}

// GlobalFlags are the flags Env.App puts on the app and on every command
// (with StoreFlag on the app), so they may be given before or after the
// subcommand: -q/--quiet, -v/--verbose, --log-format.
func GlobalFlags() []cli.Flag { return []cli.Flag{QuietFlag(), VerboseFlag(), LogFormatFlag()} }

// OpenStore opens the store --store names for a writing command: a local
// directory that does not exist yet is created by the first write. A
// local path that is not a directory is a usage error.
func OpenStore(c *cli.Context) (store.Store, error) {
	return openStore(c.String("store"), false)
}

// OpenExistingStore is OpenStore for commands that only read (or only
// remove): a local store that does not exist is not found (exit 3) rather
// than an empty store, so a mistyped --store is not mistaken for one
// without datasets.
func OpenExistingStore(c *cli.Context) (store.Store, error) {
	return openStore(c.String("store"), true)
}

func openStore(uri string, mustExist bool) (store.Store, error) {
	st, err := store.Open(uri)
	if err != nil {
		return nil, UsageError{err}
	}
	local, ok := st.(*store.Local)
	if !ok {
		return st, nil
	}
	fi, err := os.Stat(local.Root())
	switch {
	case err == nil && !fi.IsDir():
		return nil, Usagef("store %q is a file, not a directory: pass --store DIR (or set KILN_STORE)", uri)
	case errors.Is(err, fs.ErrNotExist) && mustExist:
		return nil, fmt.Errorf("store %q does not exist: check --store or KILN_STORE (only writing commands create a store): %w", uri, err)
	case err != nil && !errors.Is(err, fs.ErrNotExist):
		return nil, fmt.Errorf("store %q: %w", uri, err)
	}
	return st, nil
}

// PartFrom reads --shard, else the Slurm array variables. Slurm array task
// ids need not start at 0 (--array=1-4), so SLURM_ARRAY_TASK_MIN is
// subtracted when set.
func PartFrom(c *cli.Context) (dataset.Part, error) {
	if s := c.String("shard"); s != "" {
		p, err := dataset.ParsePart(s)
		if err != nil {
			return dataset.Part{}, UsageError{err}
		}
		return p, nil
	}
	return PartFromEnv(os.Getenv)
}

// PartFromEnv derives the part from Slurm array variables (none: whole).
func PartFromEnv(getenv func(string) string) (dataset.Part, error) {
	id, count := getenv("SLURM_ARRAY_TASK_ID"), getenv("SLURM_ARRAY_TASK_COUNT")
	if id == "" || count == "" {
		return dataset.Part{}, nil
	}
	i, err1 := strconv.Atoi(id)
	n, err2 := strconv.Atoi(count)
	lo := 0
	if m := getenv("SLURM_ARRAY_TASK_MIN"); m != "" {
		lo, _ = strconv.Atoi(m)
	}
	if err1 != nil || err2 != nil || n < 1 || i-lo < 0 || i-lo >= n {
		return dataset.Part{}, Usagef("Slurm array task %s of %s (min %d) is not a part of 0..%s: pass --shard i/n", id, count, lo, count)
	}
	return dataset.Part{Index: i - lo, Count: n}, nil
}

// ResolveInputs parses input references and pins each to a version: an
// unpinned name becomes the version it means now (its latest pointer, see
// dataset.Resolve), so the whole run (and its version id) sees one
// consistent input. A sharded run refuses unpinned
// inputs, since its parts start at different times.
func ResolveInputs(ctx context.Context, st store.Store, refs []string, part dataset.Part) ([]dataset.Ref, error) {
	var out []dataset.Ref
	for _, s := range refs {
		r, err := dataset.ParseRef(s)
		if err != nil {
			return nil, UsageError{err}
		}
		if !r.Pinned() {
			if part.Count > 1 {
				return nil, Usagef("input %q is not pinned: a sharded run (--shard %s) needs name@version inputs so every part reads the same data; `kiln ls %s` shows its versions", s, part, r.Name)
			}
			if r.Version, err = dataset.Resolve(ctx, st, r.Name); err != nil {
				return nil, err
			}
		}
		out = append(out, r)
	}
	return out, nil
}

// RequireArgs checks the number of positional arguments.
func RequireArgs(c *cli.Context, n int, names string) error {
	if c.NArg() != n {
		return Usagef("%s: want %s, got %d argument(s); see --help", c.Command.FullName(), names, c.NArg())
	}
	return nil
}

// Fprintln writes to the command's stdout.
func Fprintln(c *cli.Context, args ...any) { fmt.Fprintln(c.App.Writer, args...) }

// Bounds on the counts a stage's flags ask for (docs/design.md §2.9):
// far above any real run (a GRPO group is tens of samples, a node runs
// tens to hundreds of sandboxes at once), and low enough that a mistyped
// or hostile value is refused before a stage plans or allocates for it
// (--samples 100000000000 grew memory until the kernel killed the stage).
const (
	MaxSamples = 1 << 16 // --samples: runs per task
	MaxJobs    = 4096    // --jobs, --boot-concurrency: at once, on one node
)

// CheckCount refuses a count flag's value n outside [1, max] (a usage
// error, exit 2), naming the flag and the bound.
func CheckCount(flag string, n, max int) error {
	if n < 1 || n > max {
		return Usagef("--%s %d: want 1 to %d (kiln's bound on --%s)", flag, n, max, flag)
	}
	return nil
}
