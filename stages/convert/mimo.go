package convert

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
	"runtime"
	"slices"
	"strings"
	"sync"

	"github.com/parquet-go/parquet-go"

	"github.com/kilnrl/kiln/formats/dataset"
	"github.com/kilnrl/kiln/formats/records"
	"github.com/kilnrl/kiln/internal/stagecmd"
)

// mimoSource reads the MiMo code subset (docs/data-and-grading.md §1.1): the
// extra_info.instance_json column of DIR/code.parquet and the image mapping
// DIR/image-mapping.jsonl. DIR may be an s3:// prefix; the Parquet file is
// then downloaded once to a temporary file (Parquet needs random access).
type mimoSource struct {
	dataset   string
	parquet   stagecmd.Input
	mapping   stagecmd.Input
	localPath string // the Parquet file on local disk
	tmpDir    string // holds a download, removed by Close
}

func newMiMoSource(o *Options) (*mimoSource, error) {
	join := func(name string) string {
		if strings.HasPrefix(o.Data, "s3://") {
			return strings.TrimSuffix(o.Data, "/") + "/" + name
		}
		return filepath.Join(o.Data, name)
	}
	s := &mimoSource{dataset: o.Dataset}
	var err error
	if s.parquet, err = stagecmd.ParseInput(join("code.parquet")); err != nil {
		return nil, stagecmd.UsageError{Err: err}
	}
	if s.mapping, err = stagecmd.ParseInput(join("image-mapping.jsonl")); err != nil {
		return nil, stagecmd.UsageError{Err: err}
	}
	return s, nil
}

func (s *mimoSource) Externals(ctx context.Context) ([]dataset.External, error) {
	var ext []dataset.External
	for _, in := range []struct {
		role string
		in   stagecmd.Input
	}{{"code.parquet", s.parquet}, {"image-mapping.jsonl", s.mapping}} {
		e, err := in.in.Identify(ctx, in.role)
		if err != nil {
			return nil, fmt.Errorf("convert mimo: %w; --data must be a directory (or s3:// prefix) holding code.parquet and image-mapping.jsonl", err)
		}
		ext = append(ext, e)
	}
	return ext, nil
}

func (s *mimoSource) Close() error {
	if s.tmpDir != "" {
		return os.RemoveAll(s.tmpDir)
	}
	return nil
}

// local returns a local path of the Parquet file, downloading it once.
func (s *mimoSource) local(ctx context.Context) (string, error) {
	if s.localPath != "" {
		return s.localPath, nil
	}
	if !strings.HasPrefix(s.parquet.Name, "s3://") {
		s.localPath = s.parquet.Name
		return s.localPath, nil
	}
	dir, err := os.MkdirTemp("", "kiln-convert-")
	if err != nil {
		return "", err
	}
	s.tmpDir = dir
	r, err := s.parquet.Open(ctx)
	if err != nil {
		return "", err
	}
	defer r.Close()
	path := filepath.Join(dir, "code.parquet")
	f, err := os.Create(path)
	if err != nil {
		return "", err
	}
	if _, err := io.Copy(f, r); err != nil {
		f.Close()
		return "", fmt.Errorf("downloading %q: %w", s.parquet.Name, err)
	}
	if err := f.Close(); err != nil {
		return "", err
	}
	s.localPath = path
	return path, nil
}

func (s *mimoSource) Each(ctx context.Context, fn rowFunc) error {
	mapping, err := readMapping(ctx, s.mapping)
	if err != nil {
		return err
	}
	path, err := s.local(ctx)
	if err != nil {
		return err
	}
	file, err := os.Open(path)
	if err != nil {
		return fmt.Errorf("convert mimo: %w", err)
	}
	defer file.Close()
	fi, err := file.Stat()
	if err != nil {
		return err
	}
	name := s.parquet.Name
	pf, err := parquet.OpenFile(file, fi.Size(), parquet.SkipPageIndex(true), parquet.SkipBloomFilters(true), parquet.ReadBufferSize(1<<20))
	if err != nil {
		return stagecmd.BadInputError{Err: fmt.Errorf("%q is not a readable Parquet file: %w", name, err)}
	}
	col, err := findStringColumn(pf, "extra_info", "instance_json")
	if err != nil {
		return stagecmd.BadInputError{Err: fmt.Errorf("%q: wrong schema: %w; MiMo's code.parquet has a struct column extra_info with a string field instance_json", name, err)}
	}
	// Rows are decoded and converted in parallel, a batch at a time, and
	// handed to fn in row order: fn sees exactly the sequence a one-by-one
	// conversion would give (a row that is not selected is converted in
	// vain, and its conversion error is dropped by fn's caller).
	batch := make([]mimoRow, 0, mimoBatchRows)
	flush := func() error {
		convertBatch(batch, s.dataset, mapping)
		for i := range batch {
			r := &batch[i]
			if r.null != "" {
				return stagecmd.BadInputError{Err: fmt.Errorf("%s: %s is null; every row needs an instance_json object", r.loc, r.null)}
			}
			if r.decodeErr != nil {
				return stagecmd.BadInputError{Err: fmt.Errorf("%s: extra_info.instance_json: %w", r.loc, r.decodeErr)}
			}
			if err := fn(r.loc, r.id, func() (converted, error) { return r.conv, r.convErr }); err != nil {
				return err
			}
		}
		clear(batch)
		batch = batch[:0]
		return nil
	}
	err = col.each(ctx, pf, func(row int64, v []byte, null string) error {
		batch = append(batch, mimoRow{loc: location{File: name, Row: row + 1}, raw: append([]byte(nil), v...), null: null})
		if len(batch) == cap(batch) {
			return flush()
		}
		return nil
	})
	if err == nil {
		err = flush()
	}
	var bad stagecmd.BadInputError
	if err != nil && !errors.As(err, &bad) && !errors.Is(err, context.Canceled) {
		return fmt.Errorf("convert mimo: reading %q: %w", name, err)
	}
	return err
}

// mimoBatchRows is the number of rows converted in parallel at a time.
const mimoBatchRows = 64

// mimoRow is one code.parquet row on its way through a batch.
type mimoRow struct {
	loc       location
	raw       []byte
	null      string
	id        string
	decodeErr error
	conv      converted
	convErr   error
}

// convertBatch decodes and converts rows on every CPU.
func convertBatch(rows []mimoRow, datasetName string, mapping map[string]string) {
	workers := min(runtime.GOMAXPROCS(0), len(rows))
	var wg sync.WaitGroup
	for w := range workers {
		wg.Go(func() {
			for i := w; i < len(rows); i += workers {
				r := &rows[i]
				if r.null != "" {
					continue
				}
				inst, err := decodeInstance(r.raw)
				if err != nil {
					r.decodeErr = err
					continue
				}
				r.id = inst.id
				r.conv, r.convErr = inst.task(datasetName, mapping)
				r.raw = nil
			}
		})
	}
	wg.Wait()
}

// mimoRequired are the instance keys the conversion uses, in the order
// their absence is reported.
var mimoRequired = []string{"instance_id", "problem_statement", "docker_image", "cwd", "test_patch", "test_command"}

// mimoInstance is one decoded instance_json object.
type mimoInstance struct {
	id     string
	fields map[string]string // the mimoRequired keys
	rest   map[string]json.RawMessage
}

// decodeInstance decodes one instance_json object. Every key in
// mimoRequired must be a string (null or absent is an error naming it:
// stricter than the reference, which passes some nulls through and crashes
// on others); instance_id, docker_image and cwd must not be empty.
//
// The object is read token by token with json.Decoder (a later duplicate
// key wins, as in encoding/json): the required keys' strings are decoded
// by Token, every other value is kept as its exact text, so a row's large
// strings (test patches of tens of KB) are scanned once rather than
// validated whole and then decoded again.
func decodeInstance(v []byte) (*mimoInstance, error) {
	obj, kinds, err := readInstance(v)
	if err != nil {
		return nil, fmt.Errorf("not a JSON object: %w", err)
	}
	id := obj.fields["instance_id"]
	for _, k := range mimoRequired {
		kind, ok := kinds[k]
		switch {
		case !ok:
			return nil, fmt.Errorf("instance %q: required key %q is missing", id, k)
		case kind == "null":
			return nil, fmt.Errorf("instance %q: required key %q is null", id, k)
		case kind != "":
			return nil, fmt.Errorf("instance %q: key %q is %s, want a string", id, k, kind)
		}
		if obj.fields[k] == "" && (k == "instance_id" || k == "docker_image" || k == "cwd") {
			return nil, fmt.Errorf("instance %q: key %q is empty", id, k)
		}
	}
	obj.id = obj.fields["instance_id"]
	return obj, nil
}

// readInstance reads the JSON object v: the strings of the mimoRequired
// keys into fields, every other value raw into rest, and for each required
// key met what its last value was ("" a string, else "null", "a list", ...).
func readInstance(v []byte) (*mimoInstance, map[string]string, error) {
	inst := &mimoInstance{fields: make(map[string]string, len(mimoRequired)), rest: map[string]json.RawMessage{}}
	kinds := make(map[string]string, len(mimoRequired))
	dec := json.NewDecoder(bytes.NewReader(v))
	if tok, err := dec.Token(); err != nil {
		return nil, nil, err
	} else if tok != json.Delim('{') {
		return nil, nil, fmt.Errorf("want an object, got %.40q", v)
	}
	for dec.More() {
		tok, err := dec.Token()
		if err != nil {
			return nil, nil, err
		}
		key := tok.(string)
		if !slices.Contains(mimoRequired, key) {
			var raw json.RawMessage
			if err := dec.Decode(&raw); err != nil {
				return nil, nil, err
			}
			inst.rest[key] = raw
			continue
		}
		delete(inst.fields, key)
		if tok, err = dec.Token(); err != nil {
			return nil, nil, err
		}
		switch t := tok.(type) {
		case string:
			inst.fields[key], kinds[key] = t, ""
		case nil:
			kinds[key] = "null"
		case bool:
			kinds[key] = "a boolean"
		case float64:
			kinds[key] = "a number"
		case json.Delim:
			kinds[key] = "a list"
			if t == '{' {
				kinds[key] = "an object"
			}
			if err := skipContainer(dec); err != nil {
				return nil, nil, err
			}
		}
	}
	if _, err := dec.Token(); err != nil { // '}'
		return nil, nil, err
	}
	// dec.More is false before a stray '}' or ']': look at the bytes.
	if rest := bytes.TrimSpace(v[dec.InputOffset():]); len(rest) > 0 {
		return nil, nil, fmt.Errorf("text after the object: %.40q", rest)
	}
	return inst, kinds, nil
}

// skipContainer reads the tokens of a container whose opening delimiter
// dec has just returned, up to its closing one.
func skipContainer(dec *json.Decoder) error {
	for depth := 1; depth > 0; {
		tok, err := dec.Token()
		if err != nil {
			return err
		}
		switch tok {
		case json.Delim('{'), json.Delim('['):
			depth++
		case json.Delim('}'), json.Delim(']'):
			depth--
		}
	}
	return nil
}

func jsonType(raw json.RawMessage) string {
	switch raw[0] {
	case '{':
		return "an object"
	case '[':
		return "a list"
	case '"':
		return "a string"
	case 't', 'f':
		return "a boolean"
	case 'n':
		return "null"
	}
	return "a number"
}

// mimoGrading is the eval_cmd grading payload of a MiMo task: the generated
// command, and the pieces it was made from.
type mimoGrading struct {
	Kind        string `json:"kind"`
	EvalCmd     string `json:"eval_cmd"`
	TestPatch   string `json:"test_patch"`
	TestCommand string `json:"test_command"`
	DockerImage string `json:"docker_image"`
	// OtherKeys are the instance_json keys the conversion does not use
	// (dataset_type, verifier_timeout_sec, ...), kept losslessly. They live
	// here, not in the metadata column, so that kiln export writes exactly
	// the reference's row (docs/data-and-grading.md §1.5).
	OtherKeys map[string]json.RawMessage `json:"other_keys,omitempty"`
}

func otherKeysLen(m map[string]json.RawMessage) int {
	n := 0
	for k, v := range m {
		n += len(k) + len(v) + 4
	}
	return n
}

// message is one chat message of a prompt.
type message struct {
	Role    string `json:"role"`
	Content string `json:"content"`
}

// marshal encodes v as compact JSON without HTML escaping.
func marshal(v any) (string, error) {
	return marshalSized(v, 0)
}

// marshalSized is marshal with the output's expected size, to allocate the
// buffer once.
func marshalSized(v any, size int) (string, error) {
	var b bytes.Buffer
	b.Grow(size + 64)
	enc := json.NewEncoder(&b)
	enc.SetEscapeHTML(false)
	if err := enc.Encode(v); err != nil {
		return "", err
	}
	return strings.TrimSuffix(b.String(), "\n"), nil
}

func promptOf(statement string) (string, error) {
	return marshal([]message{{Role: "user", Content: statement}})
}

// task builds the task of docs/data-and-grading.md §1.5: the prompt is exactly the
// public problem statement; the test patch and command reach only the
// grading payload; eval_user is root (MiMo images set up their toolchains in
// root's login profile; only the fresh grader runs as root).
func (inst *mimoInstance) task(datasetName string, mapping map[string]string) (converted, error) {
	f := inst.fields
	image, ok := mapping[f["docker_image"]]
	if !ok {
		return converted{}, fmt.Errorf("image %q is not in image-mapping.jsonl; add a line {\"dataset_image\": %q, \"dockerhub_image\": ...}", f["docker_image"], f["docker_image"])
	}
	cmd, err := evalCmd(f["test_patch"], f["test_command"])
	if err != nil {
		return converted{}, err
	}
	grading, err := marshalSized(mimoGrading{Kind: "eval_cmd", EvalCmd: cmd, TestPatch: f["test_patch"], TestCommand: f["test_command"],
		DockerImage: f["docker_image"], OtherKeys: inst.rest},
		len(cmd)+len(f["test_patch"])+len(f["test_command"])+len(f["docker_image"])+otherKeysLen(inst.rest)+len(cmd)/8+len(f["test_patch"])/8)
	if err != nil {
		return converted{}, err
	}
	prompt, err := promptOf(f["problem_statement"])
	if err != nil {
		return converted{}, err
	}
	ps, workdir, root := f["problem_statement"], f["cwd"], "root"
	t := records.Task{
		TaskID: inst.id, Dataset: &datasetName, Prompt: prompt, ProblemStatement: &ps,
		Image: &image, Workdir: &workdir, EvalUser: &root, Grading: &grading, Metadata: "{}",
	}
	// Not t.Validate(): its checks hold by construction here (the id is
	// non-empty, checked by decodeInstance; prompt and grading are
	// encoding/json output, valid JSON by its contract; metadata is "{}"),
	// and re-validating ~60 KB of JSON per row was a sixth of the
	// conversion's CPU. TestConvertedTasksValidate keeps it honest.
	return converted{Task: t, Unit: inst.id}, nil
}

// readMapping reads image-mapping.jsonl into dataset_image ->
// dockerhub_image; a later line for the same dataset_image wins, as in the
// reference. A trailing newline is fine; any other blank line, a line that
// is not a JSON object, or one without both keys as strings fails, naming
// the line.
func readMapping(ctx context.Context, in stagecmd.Input) (map[string]string, error) {
	r, err := in.Open(ctx)
	if err != nil {
		return nil, fmt.Errorf("convert mimo: image mapping: %w", err)
	}
	defer r.Close()
	br := bufio.NewReaderSize(r, 1<<16)
	mapping := map[string]string{}
	for lineNo := 1; ; lineNo++ {
		line, err := br.ReadBytes('\n')
		if errors.Is(err, io.EOF) && len(line) == 0 {
			return mapping, nil
		}
		if err != nil && !errors.Is(err, io.EOF) {
			return nil, fmt.Errorf("convert mimo: reading %q: %w", in.Name, err)
		}
		bad := func(format string, args ...any) error {
			return stagecmd.BadInputError{Err: fmt.Errorf("%q line %d: %s; each line must be {\"dataset_image\": ..., \"dockerhub_image\": ...}", in.Name, lineNo, fmt.Sprintf(format, args...))}
		}
		line = bytes.TrimRight(line, "\r\n")
		if len(bytes.TrimSpace(line)) == 0 {
			return nil, bad("blank line")
		}
		var entry map[string]json.RawMessage
		if err := json.Unmarshal(line, &entry); err != nil || entry == nil {
			return nil, bad("not a JSON object (%v)", err)
		}
		var pair [2]string
		for i, k := range []string{"dataset_image", "dockerhub_image"} {
			raw, ok := entry[k]
			if !ok {
				return nil, bad("key %q is missing", k)
			}
			if err := json.Unmarshal(raw, &pair[i]); err != nil || raw[0] != '"' {
				return nil, bad("key %q is %s, want a string", k, jsonType(raw))
			}
		}
		mapping[pair[0]] = pair[1]
		if errors.Is(err, io.EOF) {
			return mapping, nil
		}
	}
}
