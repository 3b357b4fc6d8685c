package convert

import (
	"bytes"
	"context"
	"errors"
	"fmt"
	"hash/maphash"
	"slices"
	"sort"
	"strings"

	"github.com/kilnrl/kiln/formats/dataset"
	"github.com/kilnrl/kiln/formats/records"
	"github.com/kilnrl/kiln/formats/store"
	"github.com/kilnrl/kiln/internal/stagecmd"
)

// codeVersion is the convert stage's code version (dataset.Identity): bump
// it whenever the tasks written for the same inputs and arguments change.
const codeVersion = "1"

// defaultShardBytes bounds the compressed size of one tasks shard, which is
// held in memory until it is written: with a row group and the rows in
// flight, it bounds what the conversion holds at a time, whatever the
// input's size.
const defaultShardBytes = 16 << 20

// maxListedIDs bounds the ungradeable ids listed in the log and metrics.
const maxListedIDs = 1000

// maxShardRows bounds the rows of one shard.
const maxShardRows = 8192

// Options describe one conversion.
type Options struct {
	// Format is the input format: "mimo", "swebench", "swepro" or "f2p".
	Format string
	// Data is the input: a directory or s3:// prefix (mimo), else a file.
	Data string
	// Scripts is the SWE-bench Pro run/parser script directory (swepro).
	Scripts string
	// IDs selects instances; empty converts every row.
	IDs []string
	// Splits assigns whole split units to named splits; empty leaves the
	// split column null.
	Splits []Split
	// Seed drives the split assignment and the --limit sample.
	Seed uint64
	// Limit keeps at most this many tasks per split (0: all).
	Limit int
	// KeepUngradeable keeps swebench rows whose log parser kiln lacks.
	KeepUngradeable bool
	// Dataset is the dataset column; "" uses the format's default.
	Dataset string
	// ShardBytes bounds one shard's buffered row bytes (0: the default).
	ShardBytes int64
	// Dirs are the Harbor task directories, or directories of them (harbor).
	Dirs []string
	// Workdir, if set, is every Harbor task's workdir (harbor).
	Workdir string
	// RewardMetric names the reward.json metric that is a Harbor task's
	// reward unless its [metadata] reward_metric names another ("" =
	// "reward"; harbor).
	RewardMetric string
}

// Split is one named split and its fraction of the tasks.
type Split struct {
	Name string
	Frac float64
}

// ParseSplits parses "train=0.9,eval=0.1": distinct names, positive
// fractions summing to 1.
func ParseSplits(s string) ([]Split, error) {
	if s == "" {
		return nil, nil
	}
	var out []Split
	sum := 0.0
	for _, part := range strings.Split(s, ",") {
		name, frac, ok := strings.Cut(part, "=")
		var f float64
		if _, err := fmt.Sscanf(frac, "%g", &f); !ok || err != nil || name == "" || !(f > 0) {
			return nil, fmt.Errorf("--split %q: want NAME=FRACTION,... with positive fractions, e.g. train=0.9,eval=0.1", s)
		}
		if slices.ContainsFunc(out, func(sp Split) bool { return sp.Name == name }) {
			return nil, fmt.Errorf("--split %q: split %q named twice", s, name)
		}
		out = append(out, Split{name, f})
		sum += f
	}
	if sum < 1-1e-9 || sum > 1+1e-9 {
		return nil, fmt.Errorf("--split %q: fractions sum to %g, want 1", s, sum)
	}
	return out, nil
}

// location names an input row in errors: the file and the 1-based Parquet
// row or JSONL line number.
type location struct {
	File string
	Row  int64
	Line bool // Row counts lines of a JSONL file
}

func (l location) String() string {
	if l.Line {
		return fmt.Sprintf("%q line %d", l.File, l.Row)
	}
	return fmt.Sprintf("%q row %d", l.File, l.Row)
}

// converted is one input row as a task (TaskIndex and Split unset).
type converted struct {
	Task records.Task
	// Unit is the split unit: the repository, else the task id.
	Unit string
	// Ungradeable says why kiln cannot grade the task ("" when it can).
	Ungradeable string
	// Attachments are files stored beside the rows, by their path among the
	// version's attachments (a Harbor task's tests/ and solution/).
	Attachments map[string][]byte
}

// rowFunc receives each input row's instance id and a function converting
// it. Selection happens on the id alone, so rows that are not selected are
// never converted (and cannot fail), as in the reference.
type rowFunc func(loc location, id string, convert func() (converted, error)) error

// source is one input format.
type source interface {
	// Externals identifies the inputs by content, for the version id.
	Externals(ctx context.Context) ([]dataset.External, error)
	// Each calls fn for every input row in input order. An error about the
	// input's content is a stagecmd.BadInputError naming the file and row.
	Each(ctx context.Context, fn rowFunc) error
	// Close removes anything the source staged (downloads).
	Close() error
}

func newSource(o *Options) (source, error) {
	switch o.Format {
	case "mimo":
		return newMiMoSource(o)
	case "swebench":
		return newRowSource(o, swebenchTask)
	case "swepro":
		return newRowSource(o, sweproTask)
	case "f2p":
		return newRowSource(o, f2pTask)
	case "harbor":
		return newHarborSource(o)
	}
	return nil, stagecmd.Usagef("unknown format %q (want mimo, swebench, swepro, f2p or harbor)", o.Format)
}

// defaultDataset is the dataset column per format; MiMo's is the value the
// reference writes.
var defaultDataset = map[string]string{
	"mimo":     "XiaomiMiMo/MiMo-V2.6-RL-oss",
	"swebench": "swebench",
	"swepro":   "swepro",
	"f2p":      "f2p",
	"harbor":   "harbor",
}

// Run converts o.Data into the tasks dataset out names, through stagecmd.Write:
// the version id covers the inputs' content and the arguments; nothing is
// committed unless every selected row converted.
func Run(ctx context.Context, env *stagecmd.Env, st store.Store, out stagecmd.Output, o Options) (dataset.Result, error) {
	if o.Dataset == "" {
		o.Dataset = defaultDataset[o.Format]
	}
	if o.ShardBytes <= 0 {
		o.ShardBytes = defaultShardBytes
	}
	if o.Limit < 0 {
		return dataset.Result{}, stagecmd.Usagef("--limit %d: want a positive number of tasks per split", o.Limit)
	}
	if dup := duplicates(o.IDs); len(dup) > 0 {
		return dataset.Result{}, stagecmd.BadInputError{Err: fmt.Errorf("--ids must not contain duplicate instance IDs (%s named more than once); name each instance once", strings.Join(dup, ", "))}
	}
	src, err := newSource(&o)
	if err != nil {
		return dataset.Result{}, err
	}
	defer src.Close()
	ext, err := src.Externals(ctx)
	if err != nil {
		return dataset.Result{}, err
	}
	out.Kind = records.TasksKind()
	out.Identity = dataset.Identity{Stage: "convert-" + o.Format, CodeVersion: codeVersion, Args: identityArgs(o), External: ext}
	return stagecmd.Write(ctx, st, out, env.Stdout, env.Log, func(ctx context.Context, w *dataset.Writer) (map[string]any, error) {
		atts := &attachmentPutter{done: map[string]bool{}, put: func(ctx context.Context, rel string, data []byte) error {
			_, err := st.Put(ctx, dataset.AttachmentKey(w.Ref(), rel), bytes.NewReader(data), int64(len(data)))
			return err
		}}
		return produce(ctx, env, src, o, out.Part, w, atts)
	})
}

// identityArgs are the arguments that shape the output. The seed counts only
// when something is drawn with it; --ids counts as a set (output order is
// input order, whatever the order of --ids).
func identityArgs(o Options) map[string]any {
	args := map[string]any{"format": o.Format, "dataset": o.Dataset}
	if len(o.IDs) > 0 {
		ids := slices.Clone(o.IDs)
		sort.Strings(ids)
		args["ids"] = ids
	}
	if len(o.Splits) > 0 {
		var parts []string
		for _, sp := range o.Splits {
			parts = append(parts, fmt.Sprintf("%s=%g", sp.Name, sp.Frac))
		}
		args["split"] = strings.Join(parts, ",")
	}
	if o.Limit > 0 {
		args["limit"] = o.Limit
	}
	if len(o.Splits) > 0 || o.Limit > 0 {
		args["seed"] = o.Seed
	}
	if o.KeepUngradeable {
		args["keep_ungradeable"] = true
	}
	if o.Workdir != "" {
		args["workdir"] = o.Workdir
	}
	if o.RewardMetric != "" {
		args["reward_metric"] = o.RewardMetric
	}
	return args
}

// duplicates lists the values named more than once, sorted.
func duplicates(ids []string) []string {
	count := map[string]int{}
	var dup []string
	for _, id := range ids {
		count[id]++
		if count[id] == 2 {
			dup = append(dup, id)
		}
	}
	sort.Strings(dup)
	return dup
}

// walkResult is what one pass over the input saw.
type walkResult struct {
	rows        int64    // input rows read
	ungradeable []string // ids left out (or kept, with --keep-ungradeable) as ungradeable
	why         []string // "id: reason" of each, for the formats that say why
}

// walk runs the reference's checks in its order (docs/data-and-grading.md §1.3) and
// calls fn for every selected, converted row in input order: skip rows not
// selected (before the duplicate check, so duplicates outside the selection
// go unnoticed); fail on a duplicate id; convert (mapping, grading command,
// required fields); after the input, fail on selected ids never found and
// on an empty result.
func walk(ctx context.Context, src source, o Options, fn func(loc location, c converted) error) (walkResult, error) {
	var sel map[string]bool
	if len(o.IDs) > 0 {
		sel = map[string]bool{}
		for _, id := range o.IDs {
			sel[id] = true
		}
	}
	var res walkResult
	seen := map[string]location{}
	kept := 0
	err := src.Each(ctx, func(loc location, id string, convert func() (converted, error)) error {
		res.rows++
		if err := ctx.Err(); err != nil {
			return err
		}
		if sel != nil && !sel[id] {
			return nil
		}
		if first, dup := seen[id]; dup {
			// "Duplicate dataset instance ID", "Missing instance IDs" and "No code
			// tasks found" are the reference's messages, capitalised as there.
			return stagecmd.BadInputError{Err: fmt.Errorf("%s, instance %q: Duplicate dataset instance ID: %s (first at %s %d); remove one of the rows or select the other instances with --ids", loc, id, id, map[bool]string{false: "row", true: "line"}[first.Line], first.Row)}
		}
		seen[id] = loc
		c, err := convert()
		if err != nil {
			var bad stagecmd.BadInputError
			if errors.As(err, &bad) || errors.Is(err, context.Canceled) {
				return err
			}
			return stagecmd.BadInputError{Err: fmt.Errorf("%s, instance %q: %w", loc, id, err)}
		}
		if c.Ungradeable != "" {
			res.ungradeable = append(res.ungradeable, id)
			if o.Format == "harbor" {
				res.why = append(res.why, id+": "+c.Ungradeable)
			}
			if !o.KeepUngradeable {
				return nil
			}
		}
		kept++
		return fn(loc, c)
	})
	if err != nil {
		return res, err
	}
	if sel != nil {
		var missing []string
		for id := range sel {
			if _, ok := seen[id]; !ok {
				missing = append(missing, id)
			}
		}
		if len(missing) > 0 {
			sort.Strings(missing)
			return res, stagecmd.BadInputError{Err: fmt.Errorf("%s: Missing instance IDs: %s; check the ids against the input", o.Data, strings.Join(missing, ", "))}
		}
	}
	if kept == 0 {
		hint := "the input has no rows"
		switch {
		case len(res.why) > 0:
			hint = fmt.Sprintf("all %d selected tasks are ungradeable (%s); --keep-ungradeable keeps them", len(res.ungradeable), strings.Join(res.why, "; "))
		case len(res.ungradeable) > 0:
			hint = fmt.Sprintf("all %d selected rows name a log parser kiln does not implement; --keep-ungradeable keeps them", len(res.ungradeable))
		case sel != nil:
			hint = "no selected row was converted"
		}
		in := o.Data
		if o.Format == "harbor" {
			in = strings.Join(o.Dirs, " ")
		}
		return res, stagecmd.BadInputError{Err: fmt.Errorf("%s: No code tasks found (%s)", in, hint)}
	}
	return res, nil
}

// produce converts the input into w's part. With --split or --limit it
// reads the input twice: first to learn every task's split unit (and check
// every row), then to write; the assignment needs all units before the
// first row is written.
func produce(ctx context.Context, env *stagecmd.Env, src source, o Options, part dataset.Part, w *dataset.Writer, atts *attachmentPutter) (map[string]any, error) {
	var assign map[string]string // task id -> split; nil keeps every task
	if len(o.Splits) > 0 || o.Limit > 0 {
		var ids, unitOf []string
		if _, err := walk(ctx, src, o, func(_ location, c converted) error {
			ids = append(ids, c.Task.TaskID)
			unitOf = append(unitOf, c.Unit)
			return nil
		}); err != nil {
			return nil, err
		}
		assign = assignSplits(ids, unitOf, o.Splits, o.Limit, o.Seed)
	}

	prog := stagecmd.NewProgress(env.Stderr, env.Log, "convert "+o.Format, "rows", -1)
	buf := newShardWriter(ctx, w, o.ShardBytes)
	closed := false
	defer func() {
		if !closed {
			buf.abort()
		}
	}()
	// Distinct images by 64-bit hash: the count is a metric, and a set of
	// hashes stays small when every task has its own image.
	seed := maphash.MakeSeed()
	images := map[uint64]struct{}{}
	perSplit := map[string]int64{}
	var instances []string
	var index, written int64
	res, err := walk(ctx, src, o, func(_ location, c converted) error {
		prog.Add(1)
		t := c.Task
		if assign != nil {
			split, ok := assign[t.TaskID]
			if !ok {
				return nil // left out by --limit
			}
			if len(o.Splits) > 0 {
				t.Split = &split
			}
		}
		t.TaskIndex = index
		index++
		if !part.Owns(int(t.TaskIndex)) {
			return nil
		}
		written++
		if t.Image != nil {
			images[maphash.String(seed, *t.Image)] = struct{}{}
		}
		if t.Split != nil {
			perSplit[*t.Split]++
		}
		if len(o.IDs) > 0 {
			instances = append(instances, t.TaskID)
		}
		// Attachments go first: a row never names a file that is not there.
		if err := atts.add(ctx, c.Attachments); err != nil {
			return err
		}
		return buf.add(t)
	})
	if err != nil {
		return nil, err
	}
	closed = true
	if err := buf.close(); err != nil {
		return nil, err
	}
	prog.Done()
	// Metrics are per part (dataset.Writer sums numbers across parts):
	// tasks and splits count this part's rows; the distinct images and the
	// instance list are whole-version facts, so only an unsharded run has
	// them.
	metrics := map[string]any{"tasks": written}
	if part.Count <= 1 {
		metrics["rows_read"] = res.rows
		metrics["images"] = len(images)
		if instances != nil {
			metrics["instances"] = instances
		}
	}
	if len(perSplit) > 0 {
		metrics["splits"] = perSplit
	}
	if n := len(res.ungradeable); n > 0 {
		verb := "left out"
		if o.KeepUngradeable {
			verb = "kept (--keep-ungradeable)"
		}
		// The ids are listed in full up to maxListedIDs (the log line and
		// the manifest stay readable); the count is always exact.
		ids := res.ungradeable
		if len(ids) > maxListedIDs {
			ids = ids[:maxListedIDs]
			metrics["ungradeable_ids_truncated"] = true
		}
		if len(res.why) > 0 {
			for _, w := range res.why[:min(len(res.why), 20)] {
				fmt.Fprintf(env.Stderr, "convert harbor: task %s (%s)\n", w, verb)
			}
			env.Log.Warn("tasks kiln cannot grade", "count", n, "action", verb, "ids", strings.Join(ids, ","))
		} else {
			env.Log.Warn("rows kiln cannot grade (no test command, or a log parser kiln does not implement)", "count", n, "action", verb,
				"implemented", strings.Join(gradeableParsers, ","), "ids", strings.Join(ids, ","))
		}
		metrics["ungradeable"] = n
		metrics["ungradeable_ids"] = ids
	}
	env.Log.Info("converted", "format", o.Format, "tasks", index, "images", len(images), "rows_read", res.rows)
	return metrics, nil
}

func taskBytes(t *records.Task) int64 {
	n := len(t.TaskID) + len(t.Prompt) + len(t.Metadata)
	for _, p := range []*string{t.Dataset, t.Split, t.Repo, t.ProblemStatement, t.Image, t.Workdir, t.EvalUser, t.PreCommands, t.Grading, t.Agent, t.Label, t.Extra} {
		if p != nil {
			n += len(*p)
		}
	}
	return int64(n)
}
