package datasets

import (
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"time"

	"github.com/urfave/cli/v2"

	"github.com/kilnrl/kiln/formats/dataset"
	"github.com/kilnrl/kiln/internal/stagecmd"
)

func showCommand(env *Env) *cli.Command {
	var o struct {
		rows int
		json bool
	}
	return &cli.Command{
		Name:      "show",
		Usage:     "describe a version and print its first rows",
		ArgsUsage: "REF",
		Description: `Prints the manifest summary of REF (name = the version its latest pointer
names, the one last made; name@version = exactly that one): kind, schema, rows,
shards, producer, which version latest is and who moved it when, inputs,
metrics, then its first --rows rows as JSON lines. Shards are checksummed as
they are read.

--json prints one JSON object {"manifest": ..., "committed": ..., "latest": ...,
"rows": [...]}; latest is null for a dataset without a pointer (one written
before pointers existed: its bare name means its newest committed version).`,
		Flags: []cli.Flag{
			stagecmd.StoreFlag(),
			&cli.IntFlag{Name: "rows", Value: 5, Destination: &o.rows, Usage: "how many rows to print"},
			&cli.BoolFlag{Name: "json", Destination: &o.json, Usage: "print one JSON object"},
		},
		Action: func(c *cli.Context) error {
			if err := stagecmd.RequireArgs(c, 1, "REF"); err != nil {
				return err
			}
			st, err := stagecmd.OpenExistingStore(c)
			if err != nil {
				return err
			}
			v, err := dataset.OpenString(c.Context, st, c.Args().First())
			if err != nil {
				return err
			}
			latest, latestErr := dataset.ReadLatest(c.Context, st, v.Dataset)
			if errors.Is(latestErr, dataset.ErrNotFound) {
				latestErr = nil
			}
			rows := []json.RawMessage{}
			if n := o.rows; n > 0 {
				err := v.EachJSON(c.Context, func(row json.RawMessage) error {
					rows = append(rows, row)
					if len(rows) >= n {
						return io.EOF
					}
					return nil
				})
				if err != nil && !errors.Is(err, io.EOF) {
					return err
				}
			}
			if o.json {
				if latestErr != nil {
					return latestErr
				}
				b, err := json.MarshalIndent(map[string]any{"manifest": v.Manifest, "committed": v.Committed.UTC(),
					"latest": latestJSON(latest), "rows": rows}, "", "  ")
				if err != nil {
					return err
				}
				_, err = fmt.Fprintln(env.Stdout, string(b))
				return err
			}
			m := v.Manifest
			w := env.Stdout
			fmt.Fprintf(w, "dataset    %s\n", v.Ref())
			fmt.Fprintf(w, "kind       %s (%s, schema %s)\n", m.Kind, m.Encoding, m.Schema)
			fmt.Fprintf(w, "rows       %d in %d shard(s), %d bytes, %d part(s)\n", m.Rows, len(m.Shards), m.Bytes, m.Parts)
			fmt.Fprintf(w, "committed  %s\n", v.Committed.UTC().Format(time.RFC3339))
			fmt.Fprintf(w, "producer   %s (code %s, build %s, host %s)\n", m.Producer.Stage, m.Producer.CodeVersion, m.Producer.Build, m.Producer.Host)
			fmt.Fprintf(w, "latest     %s\n", latestLine(v, latest, latestErr))
			if len(m.Producer.Args) > 0 {
				b, _ := json.Marshal(m.Producer.Args)
				fmt.Fprintf(w, "args       %s\n", b)
			}
			for _, in := range m.Inputs {
				fmt.Fprintf(w, "input      %s\n", in)
			}
			for _, e := range m.External {
				fmt.Fprintf(w, "external   %s %s (%s)\n", e.Role, e.URI, externalID(e))
			}
			if len(m.Metrics) > 0 {
				b, _ := json.Marshal(m.Metrics)
				fmt.Fprintf(w, "metrics    %s\n", b)
			}
			if len(rows) > 0 {
				fmt.Fprintf(w, "first %d row(s):\n", len(rows))
				for _, r := range rows {
					fmt.Fprintln(w, string(r))
				}
			}
			return nil
		},
	}
}

// latestLine says which version v's dataset's latest pointer names and who
// moved it when (l nil: the dataset has no pointer).
func latestLine(v *dataset.Version, l *dataset.Latest, err error) string {
	switch {
	case err != nil:
		return fmt.Sprintf("unreadable: %v", err)
	case l == nil:
		return "no pointer: the bare name means the newest committed version"
	}
	which := "this version"
	if l.Version != v.Version {
		which = "not this version"
	}
	s := fmt.Sprintf("%s (%s), moved by %s at %s", l.Ref(), which, l.By, l.Moved.UTC().Format(time.RFC3339))
	if l.Previous != "" {
		s += " from " + l.Previous
	}
	return s
}

// latestJSON is the pointer as show --json prints it, nil without one.
func latestJSON(l *dataset.Latest) any {
	if l == nil {
		return nil
	}
	return map[string]any{"version": l.Version, "ref": l.Ref().String(), "previous": l.Previous, "by": l.By,
		"moved": l.Moved.UTC(), "moved_at": l.MovedAt.UTC()}
}

func externalID(e dataset.External) string {
	if e.SHA256 != "" {
		return "sha256:" + e.SHA256[:16]
	}
	return fmt.Sprintf("etag %s, %d bytes", e.ETag, e.Size)
}
