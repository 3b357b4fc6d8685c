package datasets

import (
	"fmt"
	"time"

	"github.com/urfave/cli/v2"

	"github.com/kilnrl/kiln/formats/dataset"
	"github.com/kilnrl/kiln/internal/stagecmd"
)

func gcCommand(env *Env) *cli.Command {
	var o dataset.GCOptions
	return &cli.Command{
		Name:  "gc",
		Usage: "remove what interrupted or losing writers left behind",
		Description: `Removes files that no committed version needs: everything in a version that
never committed (a killed or failed writer, its attachments such as grading
logs included), files of a committed version its manifest does not name (a
losing attempt's shards, receipts; a committed version's attachments stay),
and the store's own debris (temporary files, incomplete S3 multipart uploads). Committed
versions are never touched. Anything younger than --grace is kept, because a
writer may still be working on it: keep it above the longest a stage's part
can run, including the time its row receipts wait to be resumed.

Prints one line per orphan ("would remove" with --dry-run) and a total.
A version whose manifest cannot be read is kept whole and the rest of the
store collected; the run then ends with exit status 4 (1 if the manifest
could not be fetched) naming each such version: kiln verify says what is
wrong with it. --grace must not be negative (exit 2). GC removes only what
no committed version needs; kiln forget removes old committed versions.

Example:
   kiln gc --dry-run --grace 72h`,
		Flags: []cli.Flag{
			stagecmd.StoreFlag(),
			&cli.BoolFlag{Name: "dry-run", Aliases: []string{"n"}, Destination: &o.DryRun, Usage: "list orphans without removing them"},
			&cli.DurationFlag{Name: "grace", Value: 24 * time.Hour, Destination: &o.Grace, Usage: "keep files younger than this"},
			&cli.StringFlag{Name: "prefix", Destination: &o.Prefix, Usage: "only datasets whose names start with this"},
		},
		Action: func(c *cli.Context) error {
			if c.NArg() != 0 {
				return stagecmd.Usagef("gc: takes no arguments (did you mean --prefix?)")
			}
			if g := o.Grace; g < 0 {
				return stagecmd.Usagef("gc: --grace %s is negative: it would remove files a live writer is still writing; give 0 or more (default 24h)", g)
			}
			st, err := stagecmd.OpenExistingStore(c)
			if err != nil {
				return err
			}
			verb := "removed"
			if o.DryRun {
				verb = "would remove"
			}
			var n, bytes int64
			err = dataset.GC(c.Context, st, o,
				func(o dataset.Orphan) {
					n++
					bytes += o.Size
					fmt.Fprintf(env.Stdout, "%s %s (%s, %d bytes)\n", verb, o.Key, o.Reason, o.Size)
				})
			fmt.Fprintf(env.Stdout, "%s %d file(s), %d bytes\n", verb, n, bytes)
			return err
		},
	}
}
