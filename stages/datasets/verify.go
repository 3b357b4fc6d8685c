package datasets

import (
	"errors"
	"fmt"

	"github.com/urfave/cli/v2"

	"github.com/kilnrl/kiln/formats/dataset"
	"github.com/kilnrl/kiln/internal/stagecmd"
)

func verifyCommand(env *Env) *cli.Command {
	var o struct {
		all    bool
		prefix string
	}
	return &cli.Command{
		Name:      "verify",
		Usage:     "check every shard of versions against their manifests (checksum, schema, rows)",
		ArgsUsage: "REF... | --all [--prefix PREFIX]",
		Description: `Reads every shard of each REF (name = the version its latest pointer names;
name@version = exactly that one) whole and checks it against the version's
manifest and record kind: size and sha256, the kind's schema, every row
decodes, the row count. The manifest itself is checked as it is read
(format, names, totals). --all checks every committed version in the store
(of the datasets --prefix selects) instead of REFs.

Prints one line per shard, "ok" or "CORRUPT" with the reason, and one line
per version. A corrupt shard or manifest does not stop the check: every
version and shard is looked at, and the exit status is 4 when any was
corrupt, the error naming each. Attachments (grading logs, artifacts) carry
no checksum in the manifest and are not checked. kiln never repairs in
place: restore the files, or rerun the stage that wrote the version.

Examples:
   kiln verify grades/step-3
   kiln verify --all --prefix rollouts/

Exit status 4: some stored data is corrupt (named on stderr); 3: a REF does
not exist.`,
		Flags: []cli.Flag{
			stagecmd.StoreFlag(),
			&cli.BoolFlag{Name: "all", Destination: &o.all, Usage: "check every committed version (of --prefix) instead of REFs"},
			&cli.StringFlag{Name: "prefix", Destination: &o.prefix, Usage: "with --all: only datasets whose names start with this"},
		},
		Action: func(c *cli.Context) error {
			all := o.all
			switch {
			case all && c.NArg() > 0:
				return stagecmd.Usagef("verify: give REFs or --all, not both")
			case !all && c.NArg() == 0:
				return stagecmd.Usagef("verify: want REF... or --all; see --help")
			case !all && c.IsSet("prefix"):
				return stagecmd.Usagef("verify: --prefix goes with --all")
			}
			st, err := stagecmd.OpenExistingStore(c)
			if err != nil {
				return err
			}
			var refs []dataset.Ref
			if all {
				list, err := dataset.List(c.Context, st, o.prefix)
				if err != nil {
					return err
				}
				for _, s := range list {
					refs = append(refs, s.Ref)
				}
			} else {
				for _, a := range c.Args().Slice() {
					r, err := dataset.ParseRef(a)
					if err != nil {
						return stagecmd.UsageError{Err: err}
					}
					refs = append(refs, r)
				}
			}
			w := env.Stdout
			var corrupt []error
			for _, r := range refs {
				v, err := dataset.Open(c.Context, st, r)
				if errors.Is(err, dataset.ErrCorrupt) {
					fmt.Fprintf(w, "CORRUPT  %s: %v\n", r, err)
					corrupt = append(corrupt, err)
					continue
				}
				if err != nil {
					return err
				}
				ref := v.Ref()
				bad := 0
				err = dataset.Verify(c.Context, v, func(sc dataset.ShardCheck) {
					if sc.Err != nil {
						bad++
						fmt.Fprintf(w, "CORRUPT  %s %s: %v\n", ref, sc.Shard.Key, sc.Err)
						return
					}
					fmt.Fprintf(w, "ok       %s %s (%d rows, %d bytes)\n", ref, sc.Shard.Key, sc.Shard.Rows, sc.Shard.Bytes)
				})
				switch {
				case errors.Is(err, dataset.ErrCorrupt):
					fmt.Fprintf(w, "%s: CORRUPT (%d of %d shard(s))\n", ref, bad, len(v.Shards))
					corrupt = append(corrupt, err)
				case err != nil:
					return err
				default:
					fmt.Fprintf(w, "%s: ok (%d shard(s), %d rows, %d bytes)\n", ref, len(v.Shards), v.Rows, v.Bytes)
				}
			}
			if len(corrupt) > 0 {
				return fmt.Errorf("verify: %d of %d version(s) corrupt: %w", len(corrupt), len(refs), errors.Join(corrupt...))
			}
			if len(refs) == 0 {
				fmt.Fprintf(w, "no committed versions in %s\n", st.URI())
			}
			return nil
		},
	}
}
