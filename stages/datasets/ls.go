package datasets

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"text/tabwriter"
	"time"

	"github.com/urfave/cli/v2"

	"github.com/kilnrl/kiln/formats/dataset"
	"github.com/kilnrl/kiln/formats/store"
	"github.com/kilnrl/kiln/internal/stagecmd"
)

// lsFlags are ls's flags, bound.
type lsFlags struct{ all, shards, json bool }

func lsCommand(env *Env) *cli.Command {
	var o lsFlags
	return &cli.Command{
		Name:      "ls",
		Usage:     "list datasets and their versions, or one version's shard files",
		ArgsUsage: "[PREFIX] | --shards REF",
		Description: `Lists the datasets whose names start with PREFIX: one line per dataset with
the version its bare name means — the one its latest pointer names, the one
last made — its record kind, rows and commit time (the store's clock), and
how many versions it has. The LATEST column says "latest" for a pointer's
version; a dataset without a pointer (written before pointers existed)
shows its newest committed version, marked "newest". --all lists every
version, newest committed first, and marks the one the pointer names.

--shards REF prints the URIs of exactly one version's shard files, one per
line, in manifest order: s3://bucket/prefix/... on S3, absolute paths on a
local store. Read those, not a glob over the dataset directory, which
merges versions and picks up uncommitted and losing writers' files.

--json prints JSON lines: {dataset, version, ref, kind, rows, bytes,
committed, versions, latest} per version; with --shards {uri, key, part,
rows, bytes, sha256} per shard.

Examples:
   kiln ls --store s3://bucket/kiln rollouts/
   duckdb -c "SELECT count(*) FROM read_parquet([$(kiln ls --shards grades/step-3 | sed "s/.*/'&'/" | paste -sd,)])"

Exit status 3: --shards REF does not exist; 4: its manifest is corrupt.`,
		Flags: []cli.Flag{
			stagecmd.StoreFlag(),
			&cli.BoolFlag{Name: "all", Destination: &o.all, Usage: "list every version, not only the latest"},
			&cli.BoolFlag{Name: "shards", Destination: &o.shards, Usage: "print the shard URIs of the version REF names"},
			&cli.BoolFlag{Name: "json", Destination: &o.json, Usage: "print JSON lines"},
		},
		Action: func(c *cli.Context) error {
			if o.shards {
				if o.all {
					return stagecmd.Usagef("ls: --shards lists one version: drop --all")
				}
				if err := stagecmd.RequireArgs(c, 1, "REF (with --shards)"); err != nil {
					return err
				}
				return lsShards(c, env, o)
			}
			if c.NArg() > 1 {
				return stagecmd.Usagef("ls: want at most one PREFIX")
			}
			st, err := stagecmd.OpenExistingStore(c)
			if err != nil {
				return err
			}
			ctx := c.Context
			all, err := dataset.List(ctx, st, c.Args().First())
			if err != nil {
				return err
			}
			tw := tabwriter.NewWriter(env.Stdout, 2, 4, 2, ' ', 0)
			if !o.json {
				fmt.Fprintln(tw, "DATASET\tVERSION\tKIND\tROWS\tCOMMITTED\tVERSIONS\tLATEST")
			}
			// List sorts by name, then newest first: take one dataset at a time.
			for len(all) > 0 {
				n := 1
				for n < len(all) && all[n].Ref.Name == all[0].Ref.Name {
					n++
				}
				versions := all[:n]
				all = all[n:]
				latest, mark := lsLatest(ctx, env, st, versions)
				for _, s := range versions {
					m := ""
					if s.Ref.Version == latest {
						m = mark
					}
					if !o.all && m == "" {
						continue
					}
					if err := lsLine(ctx, o, env, tw, st, s, len(versions), m); err != nil {
						return err
					}
				}
			}
			return tw.Flush()
		},
	}
}

// lsLatest says which of one dataset's versions (newest first) its bare
// name means, and how to mark it: "latest" when its pointer names it,
// "newest" when there is no pointer. A pointer that is unreadable, or names
// a version not listed, is warned about and the newest is shown in its place.
func lsLatest(ctx context.Context, env *Env, st store.Store, versions []dataset.Summary) (string, string) {
	name, newest := versions[0].Ref.Name, versions[0].Ref.Version
	l, err := dataset.ReadLatest(ctx, st, name)
	switch {
	case errors.Is(err, dataset.ErrNotFound):
		return newest, "newest"
	case err != nil:
		env.Log.Warn("unreadable latest pointer; showing the newest committed version", "dataset", name, "err", err)
		return newest, "newest?"
	}
	for _, s := range versions {
		if s.Ref.Version == l.Version {
			return l.Version, "latest"
		}
	}
	env.Log.Warn("the latest pointer names a version that is not committed; showing the newest", "dataset", name, "latest", l.Version)
	return newest, "newest?"
}

func lsLine(ctx context.Context, o lsFlags, env *Env, tw *tabwriter.Writer, st store.Store, s dataset.Summary, n int, mark string) error {
	v, err := dataset.Open(ctx, st, s.Ref)
	kind, rows, size := "?", int64(-1), int64(-1)
	if err == nil {
		kind, rows, size = v.Manifest.Kind, v.Rows, v.Bytes
	} else {
		env.Log.Warn("unreadable version", "ref", s.Ref.String(), "err", err)
	}
	if o.json {
		b, _ := json.Marshal(map[string]any{"dataset": s.Ref.Name, "version": s.Ref.Version, "ref": s.Ref.String(),
			"kind": kind, "rows": rows, "bytes": size, "committed": s.Committed.UTC().Format(time.RFC3339Nano),
			"versions": n, "latest": mark == "latest" || mark == "newest"})
		_, err := fmt.Fprintln(env.Stdout, string(b))
		return err
	}
	_, err = fmt.Fprintf(tw, "%s\t%s\t%s\t%d\t%s\t%d\t%s\n", s.Ref.Name, s.Ref.Version, kind, rows, s.Committed.UTC().Format(time.RFC3339), n, mark)
	return err
}

// lsShards prints the shard URIs of one version.
func lsShards(c *cli.Context, env *Env, o lsFlags) error {
	st, err := stagecmd.OpenExistingStore(c)
	if err != nil {
		return err
	}
	ref, err := dataset.ParseRef(c.Args().First())
	if err != nil {
		return stagecmd.UsageError{Err: err}
	}
	v, err := dataset.Open(c.Context, st, ref)
	if err != nil {
		return err
	}
	for i, s := range v.Shards {
		line := v.ShardURI(i)
		if o.json {
			b, _ := json.Marshal(map[string]any{"uri": v.ShardURI(i), "key": s.Key, "part": s.Part, "rows": s.Rows, "bytes": s.Bytes, "sha256": s.SHA256})
			line = string(b)
		}
		if _, err := fmt.Fprintln(env.Stdout, line); err != nil {
			return err
		}
	}
	return nil
}
