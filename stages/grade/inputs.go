package grade

import (
	"bufio"
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"os"
	"path/filepath"

	"github.com/kilnrl/kiln/formats/dataset"
	"github.com/kilnrl/kiln/formats/records"
	"github.com/kilnrl/kiln/internal/harbor"
	"github.com/kilnrl/kiln/internal/stagecmd"
)

// job is one grading to do: a patch on a task, with the ids of its row.
type job struct {
	// key names the row in receipts and its log: stable across reruns of
	// the same version.
	key   string
	row   records.Grade // ids, task_id and baseline filled in
	patch string
	abort string // the rollout's abort_reason ("" = graded)
	// abortDetail is the rollout's abort_detail, "" when it has none (a
	// version written before the column).
	abortDetail string
	target      *Target
	// solution grades the task's Harbor oracle instead of a patch.
	solution bool
}

// taskTable is the tasks version, by id.
type taskTable struct {
	v     *dataset.Version
	ref   dataset.Ref
	byID  map[string]*records.Task
	order []*records.Task
}

func loadTasks(ctx context.Context, v *dataset.Version) (*taskTable, error) {
	tt := &taskTable{v: v, ref: v.Ref(), byID: map[string]*records.Task{}}
	if v.Kind().Name != records.TasksKind().Name {
		return nil, stagecmd.Usagef("--tasks %s holds %s records, not tasks", v.Ref(), v.Kind().Name)
	}
	err := v.EachShard(ctx, func(_ int, data []byte) error {
		return records.EachTask(data, func(t records.Task) error {
			if _, dup := tt.byID[t.TaskID]; dup {
				return stagecmd.BadInputError{Err: fmt.Errorf("tasks %s: task id %q appears twice; task ids must be unique", v.Ref(), t.TaskID)}
			}
			tp := &t
			tt.byID[t.TaskID] = tp
			tt.order = append(tt.order, tp)
			return nil
		})
	})
	if err != nil {
		return nil, err
	}
	return tt, nil
}

func loadImages(ctx context.Context, v *dataset.Version) (map[string]records.Image, error) {
	if v.Kind().Name != records.ImagesKind().Name {
		return nil, stagecmd.Usagef("--images %s holds %s records, not images", v.Ref(), v.Kind().Name)
	}
	out := map[string]records.Image{}
	err := v.EachShard(ctx, func(_ int, data []byte) error {
		return records.EachImage(data, func(im records.Image) error {
			out[im.Image] = im
			return nil
		})
	})
	return out, err
}

// targets resolves tasks to what grading them needs: the image's bundle
// under the bundle root, its environment, the decoded grading payload.
type targets struct {
	tasks   *taskTable
	images  map[string]records.Image
	imgRef  dataset.Ref
	bundles string
	cache   map[string]*Target
	// files caches the tasks version's attachments by path: Harbor tasks
	// sharing tests share one copy.
	files map[string][]byte
}

// attachment reads an attachment of the tasks version (once).
func (ts *targets) attachment(ctx context.Context, rel string) ([]byte, error) {
	if b, ok := ts.files[rel]; ok {
		return b, nil
	}
	rc, _, err := ts.tasks.v.OpenAttachment(ctx, rel)
	if err != nil {
		return nil, err
	}
	defer rc.Close()
	b, err := io.ReadAll(io.LimitReader(rc, harbor.MaxDirBytes+1<<20))
	if err != nil {
		return nil, fmt.Errorf("tasks %s: reading attachment %q: %w", ts.tasks.ref, rel, err)
	}
	if ts.files == nil {
		ts.files = map[string][]byte{}
	}
	ts.files[rel] = b
	return b, nil
}

// get returns the target of a task. An image missing from the images
// version, or a bundle missing on this node, is a bad input (nothing can
// be graded right until it is imported); a task whose own columns make it
// ungradeable is a Target with Invalid set, graded as infra_error.
func (ts *targets) get(ctx context.Context, t *records.Task) (*Target, error) {
	if tg, ok := ts.cache[t.TaskID]; ok {
		return tg, nil
	}
	tg := &Target{TaskID: t.TaskID}
	ts.cache[t.TaskID] = tg
	g, err := ParseGrading(t.Grading)
	if err != nil {
		tg.Invalid = err.Error()
		return tg, nil
	}
	tg.Grading = g
	if t.EvalUser != nil {
		tg.EvalUser = *t.EvalUser
	}
	if tg.PreCommands, err = preCommandsBody(t.PreCommands); err != nil {
		tg.Invalid = err.Error()
		return tg, nil
	}
	if g == nil {
		return tg, nil // no grading path: no sandbox, so no image needed
	}
	if t.Image == nil || *t.Image == "" {
		tg.Invalid = "the task has no image (missing_image_or_workdir)"
		return tg, nil
	}
	im, ok := ts.images[*t.Image]
	if !ok {
		return nil, stagecmd.BadInputError{Err: fmt.Errorf("image %q of task %q is not in images %s: import it with kiln-images (for the tasks %s) and pass that version",
			*t.Image, t.TaskID, ts.imgRef, ts.tasks.ref)}
	}
	rootfs := filepath.Join(ts.bundles, filepath.FromSlash(im.Bundle), "rootfs")
	if fi, err := os.Stat(rootfs); err != nil || !fi.IsDir() {
		return nil, fmt.Errorf("bundle of image %q (task %q) is not on this node: %q is not a directory; run kiln-images with --bundles %s here: %w",
			*t.Image, t.TaskID, rootfs, ts.bundles, os.ErrNotExist)
	}
	env, err := im.EnvList()
	if err != nil {
		return nil, stagecmd.BadInputError{Err: fmt.Errorf("images %s: image %q: env: %w", ts.imgRef, im.Image, err)}
	}
	tg.Sandbox.Rootfs, tg.Sandbox.Env = rootfs, env
	if h := g.Harbor; h != nil {
		// tests/ and solution/ travel with the tasks version, never in the
		// image (docs/data-and-grading.md §7): a missing one is a version
		// that cannot be graded.
		tg.Files = map[string][]byte{}
		for _, rel := range []string{h.Tests, h.Solution} {
			if rel == "" {
				continue
			}
			b, err := ts.attachment(ctx, rel)
			if err != nil {
				return nil, stagecmd.BadInputError{Err: fmt.Errorf("task %q: %w", t.TaskID, err)}
			}
			tg.Files[rel] = b
		}
		tg.Sandbox.MemoryBytes = h.MemoryMB << 20
	}
	tg.ImageDigest = im.Digest
	switch {
	case t.Workdir != nil && *t.Workdir != "":
		tg.Workdir = *t.Workdir
	case im.Workdir != nil && *im.Workdir != "":
		tg.Workdir = *im.Workdir
	default:
		tg.Workdir = "/testbed" // the reference's default (docs/data-and-grading.md §2.2)
	}
	return tg, nil
}

// patchRow is one line of a patches file: kiln's {task_id, patch,
// sample} or a SWE-bench prediction {instance_id, model_patch}.
type patchRow struct {
	TaskID     *string `json:"task_id"`
	Patch      *string `json:"patch"`
	Sample     *int64  `json:"sample"`
	InstanceID *string `json:"instance_id"`
	ModelPatch *string `json:"model_patch"`
}

// readPatches reads a patches file: JSON lines (blank lines skipped), or
// one JSON array (as SWE-bench writes predictions .json). fn gets each
// row's 1-based line (or element) number for messages and its 0-based
// ordinal among the rows. It is strict: a file with no rows, an array
// without its closing ']' and anything after the array are invalid input
// (BadInputError, exit 5). Such an error can come after fn has seen rows,
// so callers collect the rows and grade nothing until it returns nil.
func readPatches(r io.Reader, name string, fn func(n, ord int, taskID, patch string, sample *int64) error) error {
	br := bufio.NewReaderSize(r, 1<<20)
	first, err := peekNonSpace(br)
	if err != nil {
		return fmt.Errorf("patches %q: %w", name, err)
	}
	rows := 0
	err = readPatchRows(br, first, name, func(n, ord int, taskID, patch string, sample *int64) error {
		rows++
		return fn(n, ord, taskID, patch, sample)
	})
	if err == nil && rows == 0 {
		return stagecmd.BadInputf("patches %q is empty: want JSON lines of {\"task_id\", \"patch\"} or a JSON array of SWE-bench predictions", name)
	}
	return err
}

// jsonContentErr classifies a decoding error: malformed JSON (a syntax
// error, a truncated value) is invalid input; a read error is not.
func jsonContentErr(err error, format string, args ...any) error {
	err = fmt.Errorf(format+": %w", append(args, err)...)
	var syn *json.SyntaxError
	var typ *json.UnmarshalTypeError
	if errors.As(err, &syn) || errors.As(err, &typ) || errors.Is(err, io.ErrUnexpectedEOF) || errors.Is(err, io.EOF) {
		return stagecmd.BadInputError{Err: err}
	}
	return err
}

func readPatchRows(br *bufio.Reader, first byte, name string, fn func(n, ord int, taskID, patch string, sample *int64) error) error {
	ord := 0
	handle := func(n int, raw []byte) error {
		defer func() { ord++ }()
		var p patchRow
		if err := json.Unmarshal(raw, &p); err != nil {
			return stagecmd.BadInputError{Err: fmt.Errorf("patches %q row %d: not a JSON object of patch fields: %w", name, n, err)}
		}
		switch {
		case p.TaskID != nil:
			if p.Patch == nil {
				return stagecmd.BadInputError{Err: fmt.Errorf("patches %q row %d (task %q): no \"patch\" key; write \"patch\": \"\" for an empty patch", name, n, *p.TaskID)}
			}
			return fn(n, ord, *p.TaskID, *p.Patch, p.Sample)
		case p.InstanceID != nil:
			patch := ""
			if p.ModelPatch != nil { // SWE-bench: a null model_patch is an empty patch
				patch = *p.ModelPatch
			}
			return fn(n, ord, *p.InstanceID, patch, p.Sample)
		}
		return stagecmd.BadInputError{Err: fmt.Errorf("patches %q row %d: want {\"task_id\", \"patch\"} or a SWE-bench prediction {\"instance_id\", \"model_patch\"}", name, n)}
	}
	if first == '[' {
		dec := json.NewDecoder(br)
		if _, err := dec.Token(); err != nil {
			return jsonContentErr(err, "patches %q", name)
		}
		n := 1
		for ; dec.More(); n++ {
			var raw json.RawMessage
			if err := dec.Decode(&raw); err != nil {
				return jsonContentErr(err, "patches %q element %d", name, n)
			}
			if err := handle(n, raw); err != nil {
				return err
			}
		}
		// More is false at the closing ']' and also at the end of the
		// input or a stray byte: only a ']' ends the array.
		if tok, err := dec.Token(); err != nil {
			return jsonContentErr(err, "patches %q: the array is not closed after element %d (a truncated file?)", name, n-1)
		} else if tok != json.Delim(']') {
			return stagecmd.BadInputf("patches %q element %d: want ',' or ']', got %v", name, n, tok)
		}
		if tok, err := dec.Token(); err != io.EOF {
			if err != nil {
				return jsonContentErr(err, "patches %q: after the closing ']'", name)
			}
			return stagecmd.BadInputf("patches %q: %v after the closing ']': want one JSON array, or JSON lines", name, tok)
		}
		if ord == 0 {
			return stagecmd.BadInputf("patches %q is an empty array: no patches to grade", name)
		}
		return nil
	}
	for n := 1; ; n++ {
		line, err := br.ReadBytes('\n')
		if len(bytes.TrimSpace(line)) > 0 {
			if herr := handle(n, line); herr != nil {
				return herr
			}
		}
		if err == io.EOF {
			return nil
		}
		if err != nil {
			return fmt.Errorf("patches %q: %w", name, err)
		}
	}
}

func peekNonSpace(br *bufio.Reader) (byte, error) {
	for {
		b, err := br.Peek(1)
		if err == io.EOF {
			return 0, nil
		}
		if err != nil {
			return 0, err
		}
		switch b[0] {
		case ' ', '\t', '\r', '\n':
			br.ReadByte()
			continue
		}
		return b[0], nil
	}
}
