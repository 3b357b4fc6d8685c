package datasets

import (
	"fmt"
	"strings"
	"time"

	"github.com/urfave/cli/v2"

	"github.com/kilnrl/kiln/formats/dataset"
	"github.com/kilnrl/kiln/internal/stagecmd"
)

func forgetCommand(env *Env) *cli.Command {
	var o struct {
		keepLast               int
		keepReferenced, dryRun bool
	}
	return &cli.Command{
		Name:      "forget",
		Usage:     "remove old versions of a dataset (retention), keeping what kept versions were made from",
		ArgsUsage: "NAME",
		Description: `Removes old committed versions of the dataset NAME, whole (shards, receipts,
attachments such as grading logs, manifest), so the store does not only grow:
restic's forget and prune in one. It keeps

   - the version the bare name means: the one its latest pointer names (the
     newest committed, for a dataset without a pointer), always;
   - the --keep-last N versions committed last (by the store's clock);
   - every version of NAME in the lineage of a kept version: its inputs,
     their inputs, and so on, across datasets (a version made from an
     older one of NAME keeps it);
   - with --keep-referenced, also every version of NAME in the lineage of
     any committed version of any other dataset in the store, so kiln log
     of anything in the store still finds its inputs. Without it, a
     forgotten version named as another dataset's input shows as
     unreadable in that dataset's kiln log.

and removes every other version of NAME. It prints one line per version,
newest first: "keep" with the reasons, or "forget" ("would forget" with
-n/--dry-run) with the files and bytes freed, then a total. Nothing is
removed when a manifest it needs to decide, or the latest pointer, cannot
be read. A version is removed receipts first, then its manifest (from then
on it is gone for readers), then the rest; an interrupted forget leaves
files kiln gc collects. Run it when no writer is rerunning a stage whose
version it removes: such a rerun may move latest to the version as it goes
(forget then moves latest back to the version it kept and fails saying so,
and a rerun of that stage commits it again).
kiln gc removes what no committed version needs; forget removes committed
versions.

Examples:
   kiln forget -n --keep-last 3 rollouts/step
   kiln forget --keep-last 10 --keep-referenced grades/step

Exit status 3: NAME has no committed version; 4: a manifest or the latest
pointer is corrupt, or the pointer names a version that is not committed
(nothing was removed). A rerun that moved latest to a version as forget
removed it finds latest moved back, and forget fails saying so (exit 1).`,
		Flags: []cli.Flag{
			stagecmd.StoreFlag(),
			&cli.IntFlag{Name: "keep-last", Destination: &o.keepLast, Usage: "keep the N versions committed last (required; 0 keeps only latest and lineage)"},
			&cli.BoolFlag{Name: "keep-referenced", Destination: &o.keepReferenced, Usage: "also keep versions in the lineage of any other dataset's versions in the store"},
			&cli.BoolFlag{Name: "dry-run", Aliases: []string{"n"}, Destination: &o.dryRun, Usage: "list what would be removed without removing it"},
		},
		Action: func(c *cli.Context) error {
			if err := stagecmd.RequireArgs(c, 1, "NAME"); err != nil {
				return err
			}
			name := c.Args().First()
			if strings.Contains(name, "@") {
				return stagecmd.Usagef("forget: want a dataset NAME, not a version (%q): forget decides which versions go", name)
			}
			if err := dataset.CheckName(name); err != nil {
				return stagecmd.UsageError{Err: err}
			}
			if !c.IsSet("keep-last") {
				return stagecmd.Usagef("forget: --keep-last N is required: how many of the versions committed last to keep")
			}
			n := o.keepLast
			if n < 0 {
				return stagecmd.Usagef("forget: --keep-last %d is negative: give how many versions to keep, 0 or more", n)
			}
			st, err := stagecmd.OpenExistingStore(c)
			if err != nil {
				return err
			}
			verb := "forget     "
			if o.dryRun {
				verb = "would forget"
			}
			var kept, gone, files int
			var bytes int64
			opts := dataset.ForgetOptions{KeepLast: n, KeepReferenced: o.keepReferenced, DryRun: o.dryRun}
			err = dataset.Forget(c.Context, st, name, opts, func(d dataset.ForgetDecision) {
				when := d.Committed.UTC().Format(time.RFC3339)
				if d.Keep {
					kept++
					fmt.Fprintf(env.Stdout, "keep         %s  %s  (%s)\n", d.Ref, when, strings.Join(d.Reasons, "; "))
					return
				}
				gone++
				files += d.Files
				bytes += d.Bytes
				fmt.Fprintf(env.Stdout, "%s %s  %s  (%d files, %d bytes)\n", verb, d.Ref, when, d.Files, d.Bytes)
			})
			if err != nil {
				return err
			}
			total := "forgot"
			if o.dryRun {
				total = "would forget"
			}
			fmt.Fprintf(env.Stdout, "%s %d version(s), %d file(s), %d bytes; kept %d\n", total, gone, files, bytes, kept)
			return nil
		},
	}
}
