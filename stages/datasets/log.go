package datasets

import (
	"context"
	"errors"
	"fmt"
	"io"
	"time"

	"github.com/urfave/cli/v2"

	"github.com/kilnrl/kiln/formats/dataset"
	"github.com/kilnrl/kiln/formats/store"
	"github.com/kilnrl/kiln/internal/stagecmd"
)

func logCommand(env *Env) *cli.Command {
	return &cli.Command{
		Name:      "log",
		Usage:     "show the lineage of a version as a tree",
		ArgsUsage: "REF",
		Description: `Prints REF (name = the version its latest pointer names, the one last made;
name@version = exactly that one) and, below it, the versions and external
files it was computed from, recursively: which stage made each version, with
which code, from what. A version reached twice is expanded once. The last
line says which version REF's dataset's latest pointer names and who moved it
when.`,
		Flags: []cli.Flag{stagecmd.StoreFlag()},
		Action: func(c *cli.Context) error {
			if err := stagecmd.RequireArgs(c, 1, "REF"); err != nil {
				return err
			}
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
			if err := lineage(c.Context, st, env.Stdout, v, "", map[string]bool{}); err != nil {
				return err
			}
			l, err := dataset.ReadLatest(c.Context, st, v.Dataset)
			if errors.Is(err, dataset.ErrNotFound) {
				l, err = nil, nil
			}
			_, err = fmt.Fprintf(env.Stdout, "latest of %s: %s\n", v.Dataset, latestLine(v, l, err))
			return err
		},
	}
}

func lineage(ctx context.Context, st store.Store, w io.Writer, v *dataset.Version, indent string, seen map[string]bool) error {
	m := v.Manifest
	fmt.Fprintf(w, "%s (%s, %d rows) by %s %s at %s\n", v.Ref(), m.Kind, m.Rows, m.Producer.Stage, m.Producer.CodeVersion, v.Committed.UTC().Format(time.RFC3339))
	ref := v.Ref().String()
	if seen[ref] {
		return nil
	}
	seen[ref] = true
	n := len(m.Inputs) + len(m.External)
	for i, in := range m.Inputs {
		branch, next := "├── ", "│   "
		if i == n-1 {
			branch, next = "└── ", "    "
		}
		fmt.Fprint(w, indent+branch)
		iv, err := dataset.Open(ctx, st, in)
		if err != nil {
			fmt.Fprintf(w, "%s (unreadable: %v)\n", in, err)
			continue
		}
		if err := lineage(ctx, st, w, iv, indent+next, seen); err != nil {
			return err
		}
	}
	for i, e := range m.External {
		branch := "├── "
		if len(m.Inputs)+i == n-1 {
			branch = "└── "
		}
		fmt.Fprintf(w, "%s%s: %s (%s)\n", indent+branch, e.Role, e.URI, externalID(e))
	}
	return nil
}
