package datasets

import (
	"bufio"
	"encoding/json"
	"fmt"
	"io"
	"os"
	"path/filepath"
	"strings"

	"github.com/klauspost/compress/zstd"
	"github.com/urfave/cli/v2"

	"github.com/kilnrl/kiln/formats/dataset"
	"github.com/kilnrl/kiln/formats/records"
	"github.com/kilnrl/kiln/internal/stagecmd"
)

// exportFlags are export's flags, bound.
type exportFlags struct{ format, out, bundles, solutions string }

func exportCommand(env *Env) *cli.Command {
	var o exportFlags
	return &cli.Command{
		Name:      "export",
		Usage:     "write a version's rows as JSON lines (or tasks as Harbor task directories)",
		ArgsUsage: "REF",
		Description: `Writes every row of REF as one JSON object per line, to stdout or --out.
An --out name ending in .zst is zstd-compressed. The file appears only once it
is complete (written beside it, then renamed).

tasks are written as reference rows {"prompt", "label", "metadata"}, which the
reference Python stack reads with --input-key prompt --label-key label
--metadata-key metadata; kiln import tasks reads them back losslessly. Other
kinds are written with their column names as keys.

tasks from kiln-convert harbor carry their grading payload in
metadata.kiln_grading; kiln import tasks moves it back (their tests/ and
solution/ are attachments of the version, not in the JSON lines: export them
with --format harbor).

--format images-json (images datasets) writes the SUNABAKO_IMAGES map of the
reference stack instead: {IMAGE: {"rootfs", "workdir", "env"}}, with rootfs
under --bundles, and prints {"output": PATH, "images": N} when --out is given.

` + harborFormatHelp + `

Example:
   kiln export tasks --format jsonl --out tasks.jsonl.zst
   kiln export tasks --format harbor --solutions gold.jsonl --out harbor-tasks
   kiln export images --format images-json --bundles /var/lib/kiln/images --out images.json`,
		Flags: []cli.Flag{
			stagecmd.StoreFlag(),
			&cli.StringFlag{Name: "format", Value: "jsonl", Destination: &o.format, Usage: "output format: jsonl; harbor for a tasks dataset; images-json for an images dataset"},
			&cli.StringFlag{Name: "out", Destination: &o.out, Usage: "output file (default stdout); .zst compresses; the directory to create for --format harbor"},
			&cli.StringFlag{Name: "solutions", Destination: &o.solutions, Usage: "gold patches for --format harbor's solution/: {task_id, patch} or {instance_id, model_patch} JSON lines"},
			imagesRootFlag(&o.bundles),
		},
		Action: func(c *cli.Context) error {
			if err := stagecmd.RequireArgs(c, 1, "REF"); err != nil {
				return err
			}
			if f := o.format; f != "jsonl" && f != formatImagesJSON && f != formatHarbor {
				return stagecmd.Usagef("export: unknown --format %q (want jsonl, %s or %s)", f, formatHarbor, formatImagesJSON)
			}
			if o.solutions != "" && o.format != formatHarbor {
				return stagecmd.Usagef("export: --solutions is for --format %s", formatHarbor)
			}
			st, err := stagecmd.OpenExistingStore(c)
			if err != nil {
				return err
			}
			v, err := dataset.OpenString(c.Context, st, c.Args().First())
			if err != nil {
				return err
			}
			switch o.format {
			case formatImagesJSON:
				return exportImages(c, env, v, o)
			case formatHarbor:
				return exportHarbor(c, env, v, o)
			}
			return writeOutput(o.out, env.Stdout, func(w io.Writer) error {
				bw := bufio.NewWriterSize(w, 1<<20)
				if err := exportRows(c, v, bw); err != nil {
					return err
				}
				return bw.Flush()
			})
		},
	}
}

func exportRows(c *cli.Context, v *dataset.Version, w io.Writer) error {
	if v.Kind().Name == records.TasksKind().Name {
		for i := range v.Shards {
			data, err := v.ReadShard(c.Context, i)
			if err != nil {
				return err
			}
			err = records.EachTask(data, func(t records.Task) error {
				row, err := t.ReferenceRow()
				if err != nil {
					return err
				}
				_, err = fmt.Fprintf(w, "%s\n", row)
				return err
			})
			if err != nil {
				return err
			}
		}
		return nil
	}
	return v.EachJSON(c.Context, func(row json.RawMessage) error {
		_, err := fmt.Fprintf(w, "%s\n", row)
		return err
	})
}

// writeOutput runs write against path (or stdout for ""), compressing for a
// .zst suffix, and publishes the file by rename only when write succeeded.
func writeOutput(path string, stdout io.Writer, write func(io.Writer) error) error {
	if path == "" || path == "-" {
		return write(stdout)
	}
	tmp, err := os.CreateTemp(filepath.Dir(path), "."+filepath.Base(path)+".tmp-*")
	if err != nil {
		return fmt.Errorf("export: %w", err)
	}
	defer os.Remove(tmp.Name())
	var w io.Writer = tmp
	var zw *zstd.Encoder
	if strings.HasSuffix(path, ".zst") {
		zw, _ = zstd.NewWriter(tmp)
		w = zw
	}
	err = write(w)
	if zw != nil {
		if cerr := zw.Close(); err == nil {
			err = cerr
		}
	}
	if err == nil {
		err = tmp.Sync()
	}
	if cerr := tmp.Close(); err == nil {
		err = cerr
	}
	if err != nil {
		return fmt.Errorf("export to %q: %w", path, err)
	}
	return os.Rename(tmp.Name(), path)
}
