package datasets

import (
	"context"
	"encoding/json"
	"fmt"
	"text/tabwriter"
	"time"

	"github.com/urfave/cli/v2"

	"github.com/kilnrl/kiln/formats/dataset"
	"github.com/kilnrl/kiln/formats/store"
	"github.com/kilnrl/kiln/internal/stagecmd"
)

func lsCommand(env *Env) *cli.Command {
	return &cli.Command{
		Name:      "ls",
		Usage:     "list datasets and their versions",
		ArgsUsage: "[PREFIX]",
		Description: `Lists the datasets whose names start with PREFIX: one line per dataset with
its newest committed version, record kind, rows and commit time (the store's
clock), and how many versions it has. --all lists every version, newest first.

Example:
   kiln ls --store s3://bucket/kiln rollouts/`,
		Flags: []cli.Flag{
			stagecmd.StoreFlag(),
			&cli.BoolFlag{Name: "all", Usage: "list every version, not only the newest"},
			&cli.BoolFlag{Name: "json", Usage: "print JSON lines {dataset, version, ref, kind, rows, bytes, committed}"},
		},
		Action: func(c *cli.Context) error {
			if c.NArg() > 1 {
				return stagecmd.Usagef("ls: want at most one PREFIX")
			}
			st, err := stagecmd.OpenStore(c)
			if err != nil {
				return err
			}
			ctx := c.Context
			all, err := dataset.List(ctx, st, c.Args().First())
			if err != nil {
				return err
			}
			counts := map[string]int{}
			for _, s := range all {
				counts[s.Ref.Name]++
			}
			tw := tabwriter.NewWriter(env.Stdout, 2, 4, 2, ' ', 0)
			if !c.Bool("json") {
				fmt.Fprintln(tw, "DATASET\tVERSION\tKIND\tROWS\tCOMMITTED\tVERSIONS")
			}
			seen := map[string]bool{}
			for _, s := range all {
				if seen[s.Ref.Name] && !c.Bool("all") {
					continue
				}
				seen[s.Ref.Name] = true
				if err := lsLine(ctx, c, env, tw, st, s, counts[s.Ref.Name]); err != nil {
					return err
				}
			}
			return tw.Flush()
		},
	}
}

func lsLine(ctx context.Context, c *cli.Context, env *Env, tw *tabwriter.Writer, st store.Store, s dataset.Summary, n int) error {
	v, err := dataset.Open(ctx, st, s.Ref)
	kind, rows, size := "?", int64(-1), int64(-1)
	if err == nil {
		kind, rows, size = v.Manifest.Kind, v.Rows, v.Bytes
	} else {
		env.Log.Warn("unreadable version", "ref", s.Ref.String(), "err", err)
	}
	if c.Bool("json") {
		b, _ := json.Marshal(map[string]any{"dataset": s.Ref.Name, "version": s.Ref.Version, "ref": s.Ref.String(),
			"kind": kind, "rows": rows, "bytes": size, "committed": s.Committed.UTC().Format(time.RFC3339Nano)})
		_, err := fmt.Fprintln(env.Stdout, string(b))
		return err
	}
	_, err = fmt.Fprintf(tw, "%s\t%s\t%s\t%d\t%s\t%d\n", s.Ref.Name, s.Ref.Version, kind, rows, s.Committed.UTC().Format(time.RFC3339), n)
	return err
}
