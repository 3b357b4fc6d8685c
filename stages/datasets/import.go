package datasets

import (
	"bufio"
	"bytes"
	"context"
	"errors"
	"fmt"
	"io"

	"github.com/urfave/cli/v2"

	"github.com/kilnrl/kiln/formats/dataset"
	"github.com/kilnrl/kiln/formats/records"
	"github.com/kilnrl/kiln/internal/stagecmd"
)

// importTasksVersion is the import stage's code version (see
// dataset.Identity.CodeVersion): bump it when imported rows change.
const importTasksVersion = "1"

// importShardRows bounds the rows of one tasks shard.
const importShardRows = 50_000

func importCommand(env *Env) *cli.Command {
	return &cli.Command{
		Name:  "import",
		Usage: "import records from files into a new version",
		Subcommands: []*cli.Command{{
			Name:      "tasks",
			Usage:     "import reference JSONL rows {prompt, label, metadata} as tasks",
			ArgsUsage: "FILE.jsonl[.zst] | s3://bucket/key.jsonl[.zst]",
			Description: `Reads rows of the reference Python stack, one JSON object per line, and
writes them as a tasks version. Nothing is lost: metadata keys with a column of
their own (image, workdir, problem_statement, eval_user, dataset, repo, split,
agent, pre_commands, and the grading payload: swepro, eval_cmd or
remote_env_info.f2p_script) move into it, every other key stays in metadata
as written, and kiln export gives the rows back (as equal JSON; the one
addition: metadata.instance_id is always present). task_id is
metadata.instance_id, else metadata.remote_env_info.instance_id, else the label.

Every line is checked before the version commits: a malformed line, a row
without a task id or a duplicate task id fails the import (exit 5) and no
version appears. The version id covers the input's content, not its name: a
file's sha256, an S3 object's ETag and size.

Example:
   kiln import tasks --out tasks/mimo train.jsonl`,
			Flags: []cli.Flag{
				stagecmd.StoreFlag(),
				&cli.StringFlag{Name: "out", Value: "tasks", Usage: "dataset name to write"},
				stagecmd.ShardFlag(),
				stagecmd.PrintVersionFlag(),
			},
			Action: func(c *cli.Context) error { return importTasks(c, env) },
		}},
	}
}

func importTasks(c *cli.Context, env *Env) error {
	if err := stagecmd.RequireArgs(c, 1, "FILE.jsonl"); err != nil {
		return err
	}
	path := c.Args().First()
	st, err := stagecmd.OpenStore(c)
	if err != nil {
		return err
	}
	part, err := stagecmd.PartFrom(c)
	if err != nil {
		return err
	}
	src, err := stagecmd.ParseInput(path)
	if err != nil {
		return stagecmd.UsageError{Err: err}
	}
	file, err := src.Identify(c.Context, "rows")
	if err != nil {
		return fmt.Errorf("import tasks: %w", err)
	}
	out := stagecmd.Output{
		Name: c.String("out"), Kind: records.TasksKind, Part: part, PrintVersion: c.Bool("print-version"), Hook: env.Hook,
		Identity: dataset.Identity{Stage: "import-tasks", CodeVersion: importTasksVersion,
			Args: map[string]any{"format": "reference-jsonl"}, External: []dataset.External{file}},
	}
	_, err = stagecmd.Write(c.Context, st, out, env.Stdout, env.Log, func(ctx context.Context, w *dataset.Writer) (map[string]any, error) {
		return importRows(ctx, env, src, part, w)
	})
	return err
}

func importRows(ctx context.Context, env *Env, src stagecmd.Input, part dataset.Part, w *dataset.Writer) (map[string]any, error) {
	path := src.Name
	in, err := src.Open(ctx)
	if err != nil {
		return nil, fmt.Errorf("import tasks: %w", err)
	}
	defer in.Close()
	r := bufio.NewReaderSize(in, 1<<20)
	prog := stagecmd.NewProgress(env.Stderr, env.Log, "import tasks", "rows", -1)
	firstLine := map[string]int{}
	var batch []records.Task
	var index int64
	var written int64
	flush := func() error {
		if len(batch) == 0 {
			return nil
		}
		rows := batch
		_, err := w.WriteShard(ctx, int64(len(rows)), nil, func(out io.Writer) error {
			enc := records.NewTaskEncoder(out)
			if err := enc.Write(rows...); err != nil {
				return err
			}
			return enc.Close()
		})
		written += int64(len(rows))
		batch = nil
		return err
	}
	for lineNo := 1; ; lineNo++ {
		line, err := r.ReadBytes('\n')
		if errors.Is(err, io.EOF) && len(line) == 0 {
			break
		}
		if err != nil && !errors.Is(err, io.EOF) {
			return nil, fmt.Errorf("import tasks: reading %q: %w", path, err)
		}
		line = bytes.TrimRight(line, "\r\n")
		if len(bytes.TrimSpace(line)) == 0 {
			if _, peekErr := r.Peek(1); peekErr == io.EOF {
				break // trailing blank line
			}
			return nil, stagecmd.BadInputError{Err: fmt.Errorf("import tasks: %s:%d: empty line", path, lineNo)}
		}
		t, terr := records.TaskFromReferenceRow(line, index)
		if terr != nil {
			return nil, stagecmd.BadInputError{Err: fmt.Errorf("import tasks: %s:%d: %w", path, lineNo, terr)}
		}
		if first, dup := firstLine[t.TaskID]; dup {
			return nil, stagecmd.BadInputError{Err: fmt.Errorf("import tasks: %s:%d: duplicate task id %q (first on line %d)", path, lineNo, t.TaskID, first)}
		}
		firstLine[t.TaskID] = lineNo
		if part.Owns(int(index)) {
			batch = append(batch, t)
			if len(batch) >= importShardRows {
				if err := flush(); err != nil {
					return nil, err
				}
			}
		}
		index++
		prog.Add(1)
		if errors.Is(err, io.EOF) {
			break
		}
	}
	if index == 0 {
		return nil, stagecmd.BadInputError{Err: fmt.Errorf("import tasks: %q has no rows", path)}
	}
	if err := flush(); err != nil {
		return nil, err
	}
	prog.Done()
	return map[string]any{"rows_read": index, "rows_written": written}, nil
}
