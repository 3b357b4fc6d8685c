package sync

import (
	"context"
	"fmt"
	"io"
	"strings"
	"time"

	"github.com/urfave/cli/v2"

	"github.com/kilnrl/kiln/formats/dataset"
	"github.com/kilnrl/kiln/formats/store"
	"github.com/kilnrl/kiln/internal/enginectl"
	"github.com/kilnrl/kiln/internal/stagecmd"
)

// SyncFlags are the flags of the combined form (kiln-sync without a
// command), bound to its fields; --engine is read by name.
type SyncFlags struct {
	PublishFlags
	ReloadFlags
	To      string
	Workers int
}

// Flags are the combined form's flags: publish's, --to, and reload's.
// None is marked required: the subcommands, which the app's flags also
// reach, do not need them; SyncAction checks them.
func (f *SyncFlags) Flags() []cli.Flag {
	flags := []cli.Flag{stagecmd.StoreFlag()}
	flags = append(flags, f.PublishFlags.Flags(false)...)
	flags = append(flags,
		&cli.StringFlag{Name: "to", Destination: &f.To, Usage: "the pull directory: the base for xor deltas, and where the engines load the new version from (a path every engine reads)"},
		workersFlag(&f.Workers),
	)
	return append(flags, f.ReloadFlags.Flags(false)...)
}

// SyncAction runs the combined form from parsed flags. Without any flag
// or argument it shows the manual.
func SyncAction(c *cli.Context, env *stagecmd.Env, f *SyncFlags) error {
	if c.Args().Present() {
		return stagecmd.Usagef("%q is not a command of kiln-sync (publish, pull, reload); see `kiln-sync --help`", c.Args().First())
	}
	if c.NumFlags() == 0 {
		return cli.ShowAppHelp(c)
	}
	var missing []string
	for _, n := range []string{"checkpoint", "out", "to", "engine"} {
		if !c.IsSet(n) {
			missing = append(missing, "--"+n)
		}
	}
	if f.PrintVersion {
		missing = nil // it needs only what names the version
		for _, n := range []string{"checkpoint", "out"} {
			if !c.IsSet(n) {
				missing = append(missing, "--"+n)
			}
		}
	}
	if len(missing) > 0 {
		return stagecmd.Usagef("missing required flag %s; see `kiln-sync --help`", strings.Join(missing, ", "))
	}
	if f.Workers < 1 {
		return stagecmd.Usagef("--workers %d: want at least 1", f.Workers)
	}
	ro, err := f.ReloadFlags.options(env)
	if err != nil {
		return err
	}
	st, err := stagecmd.OpenStore(c)
	if err != nil {
		return err
	}
	_, err = Sync(c.Context, env, st, f.PublishFlags.output(env), SyncOptions{
		Publish: f.PublishFlags.options(f.To), To: f.To, Pull: PullOptions{Workers: f.Workers},
		Engines: c.StringSlice("engine"), Reload: ro, Timeout: f.Timeout,
	})
	return err
}

// SyncOptions describe one combined run (docs/sync.md §4).
type SyncOptions struct {
	// Publish are the publish options; its BaseDir is To.
	Publish PublishOptions
	// To is the pull directory every engine reads.
	To   string
	Pull PullOptions
	// Engines are reloaded from the pulled version's directory, bounded
	// by Timeout as a whole.
	Engines []string
	Reload  enginectl.Options
	Timeout time.Duration
}

// SyncResult is what a combined run did.
type SyncResult struct {
	Published dataset.Result
	Pulled    PullResult
}

// Sync publishes o.Publish.Checkpoint as out.Name with To as the base for
// xor deltas, pulls the committed version into To, and reloads the
// engines from its directory as its weights number (docs/sync.md §4).
// The committed reference is the last line it writes to env.Stdout; with
// out.PrintVersion it is the only thing done, on stagecmd.Write's code
// path. A failure after the commit keeps the version: a rerun of the
// same command finds it, pulls (or finds it held) and reloads.
func Sync(ctx context.Context, env *stagecmd.Env, st store.Store, out stagecmd.Output, o SyncOptions) (SyncResult, error) {
	if out.PrintVersion {
		res, err := Publish(ctx, env, st, out, o.Publish)
		return SyncResult{Published: res}, err
	}
	if o.To == "" || len(o.Engines) == 0 {
		return SyncResult{}, stagecmd.Usagef("the combined form needs --to and at least one --engine; publish alone is `kiln-sync publish`")
	}
	if o.Timeout <= 0 {
		o.Timeout = 10 * time.Minute
	}
	o.Publish.BaseDir = o.To
	// Publish writes its reference on stdout; the combined form prints it
	// last, after the reload, so it is held back here.
	quiet := *env
	quiet.Stdout = io.Discard
	pub, err := Publish(ctx, &quiet, st, out, o.Publish)
	if err != nil {
		return SyncResult{}, err
	}
	res := SyncResult{Published: pub}
	env.Log.Info("published", "weights", pub.Ref.String())
	res.Pulled, err = Pull(ctx, env, st, pub.Ref, o.To, o.Pull)
	if err != nil {
		return res, fmt.Errorf("weights %s are committed, but the pull into %q failed: %w; rerun the same command to pull and reload", pub.Ref, o.To, err)
	}
	if err := reload(ctx, env, o.Engines, res.Pulled.ModelDir, res.Pulled.Number, o.Timeout, o.Reload); err != nil {
		return res, fmt.Errorf("weights %s are committed and pulled into %q, but the reload failed: %w", pub.Ref, res.Pulled.ModelDir, err)
	}
	fmt.Fprintln(env.Stdout, pub.Ref)
	return res, nil
}
