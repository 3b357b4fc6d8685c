package datasets

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"

	"github.com/urfave/cli/v2"

	"github.com/kilnrl/kiln/formats/dataset"
	"github.com/kilnrl/kiln/formats/records"
	"github.com/kilnrl/kiln/internal/stagecmd"
)

// importTasksVersion is the import stages' code version (see
// dataset.Identity.CodeVersion): bump it when imported rows change.
const importTasksVersion = "1"

// importShardRows bounds the rows of one Parquet shard an import writes.
const importShardRows = 50_000

// importTurnShardRows bounds the rows of one turns shard: a turn holds a
// whole prompt, so far fewer fit a shard of reasonable size.
const importTurnShardRows = 2_000

// importKind is one record kind kiln import reads from JSON lines.
type importKind struct {
	kind      records.Kind
	format    string // the Identity's format argument
	usage     string
	help      string // what the rows are and how they map
	example   string
	shardRows int
	// newParser returns the parser of one file: parse turns line (at input
	// row index) into a row, or says why it is invalid; it keeps what it
	// needs across lines (task ids seen, turn order).
	newParser func() func(lineNo int, line []byte, index int64) (any, error)
	encode    func(w io.Writer, rows []any) error
}

// turnKey is what names one turn: its session and number in it.
type turnKey struct {
	session string
	turn    int32
}

// importKinds are the kinds kiln export writes as JSON lines and kiln
// import reads back (trajectories and images are produced, not imported).
func importKinds() []importKind {
	return []importKind{
		{
			kind: records.TasksKind(), format: "reference-jsonl", shardRows: importShardRows,
			usage: "import reference JSONL rows {prompt, label, metadata} as tasks",
			help: `Reads rows of the reference Python stack, one JSON object per line, and
writes them as a tasks version. Nothing is lost: metadata keys with a column of
their own (image, workdir, problem_statement, eval_user, dataset, repo, split,
agent, pre_commands, and the grading payload: swepro, eval_cmd or
remote_env_info.f2p_script) move into it, every other key stays in metadata
as written, and kiln export gives the rows back (as equal JSON; the one
addition: metadata.instance_id is always present). task_id is
metadata.instance_id, else metadata.remote_env_info.instance_id, else the label.
A duplicate task id is invalid input.`,
			example: "kiln import tasks --out tasks/mimo train.jsonl",
			newParser: func() func(int, []byte, int64) (any, error) {
				firstLine := map[string]int{}
				return func(lineNo int, line []byte, index int64) (any, error) {
					t, err := records.TaskFromReferenceRow(line, index)
					if err != nil {
						return nil, err
					}
					if first, dup := firstLine[t.TaskID]; dup {
						return nil, fmt.Errorf("duplicate task id %q (first on line %d)", t.TaskID, first)
					}
					firstLine[t.TaskID] = lineNo
					return t, nil
				}
			},
			encode: func(w io.Writer, rows []any) error {
				enc := records.NewTaskEncoder(w)
				for _, r := range rows {
					if err := enc.Write(r.(records.Task)); err != nil {
						return err
					}
				}
				return enc.Close()
			},
		},
		{
			kind: records.TurnsKind(), format: "turns-jsonl", shardRows: importTurnShardRows,
			usage: "import turn records (another system's model calls) as turns",
			help: `Reads turns as kiln export writes them, one JSON object per line with the
turns columns as keys (docs/records.md): session, turn, prompt_ids,
output_ids, output_log_probs, finish_reason, prompt_messages (a JSON array),
response_message, the optional replay columns, and so on. A row without
"turn" is numbered by its position in its session; rollout_id defaults to
index.`,
			example: "kiln import turns --out turns/external calls.jsonl.zst",
			newParser: func() func(int, []byte, int64) (any, error) {
				order := map[string]int32{}
				firstLine := map[turnKey]int{}
				return func(lineNo int, line []byte, _ int64) (any, error) {
					var probe struct {
						Session string `json:"session"`
					}
					_ = json.Unmarshal(line, &probe) // the strict read below reports errors
					t, err := records.TurnFromJSON(line, order[probe.Session])
					if err != nil {
						return nil, err
					}
					k := turnKey{t.Session, t.Turn}
					if first, dup := firstLine[k]; dup {
						return nil, fmt.Errorf("duplicate turn %d of session %q (first on line %d)", t.Turn, t.Session, first)
					}
					firstLine[k] = lineNo
					order[t.Session]++
					return t, nil
				}
			},
			encode: func(w io.Writer, rows []any) error {
				enc, err := records.NewTurnEncoder(w, records.ArrowOptions{})
				if err != nil {
					return err
				}
				for _, r := range rows {
					if err := enc.Write(r.(records.Turn)); err != nil {
						return err
					}
				}
				return enc.Close()
			},
		},
		{
			kind: records.RolloutsKind(), format: "rollouts-jsonl", shardRows: importShardRows,
			usage: "import agent runs (rollouts rows) from JSON lines",
			help: `Reads rollouts as kiln export writes them, one JSON object per line with the
rollouts columns as keys (docs/records.md): rollout_id, index, group_index,
sample, task_id, agent, weights_version, patch, agent_exit_code,
abort_reason, abort_detail, turns, token counts, started_at and ended_at
(RFC 3339), artifacts.`,
			example: "kiln import rollouts --out rollouts/external runs.jsonl",
			newParser: func() func(int, []byte, int64) (any, error) {
				firstLine := map[int64]int{}
				return func(lineNo int, line []byte, _ int64) (any, error) {
					r, err := records.RolloutFromJSON(line)
					if err != nil {
						return nil, err
					}
					if first, dup := firstLine[r.RolloutID]; dup {
						return nil, fmt.Errorf("duplicate rollout_id %d (first on line %d)", r.RolloutID, first)
					}
					firstLine[r.RolloutID] = lineNo
					return r, nil
				}
			},
			encode: func(w io.Writer, rows []any) error {
				enc := records.NewRolloutEncoder(w)
				for _, r := range rows {
					if err := enc.Write(r.(records.Rollout)); err != nil {
						return err
					}
				}
				return enc.Close()
			},
		},
		{
			kind: records.GradesKind(), format: "grades-jsonl", shardRows: importShardRows,
			usage: "import verdicts (an external grader's grades rows) from JSON lines",
			help: `Reads grades as kiln export writes them, one JSON object per line with the
grades columns as keys (docs/records.md): rollout_id, index, group_index,
sample, task_id, reward (0 or 1), applied, apply_method, exit_code, failure
(none, patch_failed, tests_failed, timeout, infra_error, no_grading,
aborted; reward 1 exactly when none), error, duration_ms, image_digest, log,
grading_kind, tests (embedded JSON), baseline.`,
			example: "kiln import grades --out grades/external verdicts.jsonl",
			newParser: func() func(int, []byte, int64) (any, error) {
				firstLine := map[int64]int{}
				return func(lineNo int, line []byte, _ int64) (any, error) {
					g, err := records.GradeFromJSON(line)
					if err != nil {
						return nil, err
					}
					if first, dup := firstLine[g.RolloutID]; dup {
						return nil, fmt.Errorf("duplicate grade of rollout_id %d (first on line %d)", g.RolloutID, first)
					}
					firstLine[g.RolloutID] = lineNo
					return g, nil
				}
			},
			encode: func(w io.Writer, rows []any) error {
				enc := records.NewGradeEncoder(w)
				for _, r := range rows {
					if err := enc.Write(r.(records.Grade)); err != nil {
						return err
					}
				}
				return enc.Close()
			},
		},
	}
}

func importCommand(env *Env) *cli.Command {
	var subs []*cli.Command
	for _, k := range importKinds() {
		subs = append(subs, importKindCommand(env, k))
	}
	return &cli.Command{
		Name:      "import",
		Usage:     "import records from JSON lines into a new version (tasks, turns, rollouts, grades)",
		UsageText: "kiln import KIND [options] FILE.jsonl[.zst] | s3://bucket/key.jsonl[.zst]   (KIND: tasks, turns, rollouts, grades)",
		Description: `Each subcommand reads one record kind from a JSONL file (local or
s3://bucket/key, .zst decompressed) and commits it as a new version; every
kind kiln export writes as JSON lines comes back equal through it.`,
		Subcommands: subs,
	}
}

func importKindCommand(env *Env, k importKind) *cli.Command {
	name := k.kind.Name
	o := &importFlags{}
	return &cli.Command{
		Name:      name,
		Usage:     k.usage,
		ArgsUsage: "FILE.jsonl[.zst] | s3://bucket/key.jsonl[.zst]",
		Description: k.help + `

Every line is checked before the version commits, exactly as a stage's rows
are on write (the kind's own checks, docs/records.md: ids and counts 0 or
more, token ids 0 or more, logprobs finite and at most 0, known abort
reasons and failure classes, stored-file keys without ".." segments): a
line that is not exactly one JSON object (truncated, or with anything
after the object), a blank line between rows, an empty file, a key that is
no column, a required column missing or null, a duplicate id, or a row that
fails the kind's checks fails the import (exit 5, naming the file, line and
field) and no version appears. The
version id covers the input's content, not its name: a file's sha256, an S3
object's ETag and size (kiln log shows it as the version's input). The last
line of stdout is the committed reference.

Example:
   ` + k.example,
		Flags: []cli.Flag{
			stagecmd.StoreFlag(),
			&cli.StringFlag{Name: "out", Value: name, Destination: &o.out, Usage: "dataset name to write"},
			stagecmd.ShardFlag(),
			stagecmd.PrintVersionFlag(&o.printVersion),
		},
		Action: func(c *cli.Context) error { return importFile(c, env, k, o) },
	}
}

// importFlags are an import command's flags, bound.
type importFlags struct {
	out          string
	printVersion bool
}

func importFile(c *cli.Context, env *Env, k importKind, o *importFlags) error {
	if err := stagecmd.RequireArgs(c, 1, "FILE.jsonl"); err != nil {
		return err
	}
	what := "import " + k.kind.Name
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
		return fmt.Errorf("%s: %w", what, err)
	}
	out := stagecmd.Output{
		Name: o.out, Kind: k.kind, Part: part, PrintVersion: o.printVersion, Hook: env.Hook,
		Identity: dataset.Identity{Stage: "import-" + k.kind.Name, CodeVersion: importTasksVersion,
			Args: map[string]any{"format": k.format}, External: []dataset.External{file}},
	}
	_, err = stagecmd.Write(c.Context, st, out, env.Stdout, env.Log, func(ctx context.Context, w *dataset.Writer) (map[string]any, error) {
		return importRows(ctx, env, k, src, part, w)
	})
	return err
}

// importRows reads every line of src (all parts check the whole file, so
// every part refuses the same bad input) and writes the rows part owns.
func importRows(ctx context.Context, env *Env, k importKind, src stagecmd.Input, part dataset.Part, w *dataset.Writer) (map[string]any, error) {
	what, path := "import "+k.kind.Name, src.Name
	in, err := src.Open(ctx)
	if err != nil {
		return nil, fmt.Errorf("%s: %w", what, err)
	}
	defer in.Close()
	prog := stagecmd.NewProgress(env.Stderr, env.Log, what, "rows", -1)
	parse := k.newParser()
	var batch []any
	var index, written int64
	flush := func() error {
		if len(batch) == 0 {
			return nil
		}
		rows := batch
		_, err := w.WriteShard(ctx, int64(len(rows)), nil, func(out io.Writer) error { return k.encode(out, rows) })
		written += int64(len(rows))
		batch = nil
		return err
	}
	var writeErr error // a store error, not the input's fault
	err = records.EachJSONLine(in, func(lineNo int, line []byte) error {
		if err := ctx.Err(); err != nil {
			writeErr = err
			return err
		}
		row, err := parse(lineNo, line, index)
		if err != nil {
			return err
		}
		if part.Owns(int(index)) {
			batch = append(batch, row)
			if len(batch) >= k.shardRows {
				if writeErr = flush(); writeErr != nil {
					return writeErr
				}
			}
		}
		index++
		prog.Add(1)
		return nil
	})
	var le *records.LineError
	switch {
	case writeErr != nil:
		return nil, writeErr
	case errors.Is(err, records.ErrNoRows):
		return nil, stagecmd.BadInputError{Err: fmt.Errorf("%s: %q has no rows (the file is empty): export or write at least one row", what, path)}
	case errors.As(err, &le):
		return nil, stagecmd.BadInputError{Err: fmt.Errorf("%s: %s:%d: %w (fix the line and rerun)", what, path, le.Line, le.Err)}
	case err != nil:
		return nil, fmt.Errorf("%s: reading %q: %w", what, path, err)
	}
	if err := flush(); err != nil {
		return nil, err
	}
	prog.Done()
	return map[string]any{"rows_read": index, "rows_written": written}, nil
}
