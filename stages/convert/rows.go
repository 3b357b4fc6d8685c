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
	"sort"
	"strings"

	"github.com/parquet-go/parquet-go"

	"github.com/kilnrl/kiln/formats/dataset"
	"github.com/kilnrl/kiln/internal/stagecmd"
)

// rowSource reads row-per-task inputs (SWE-bench style, SWE-bench Pro,
// f2p-script): JSONL files (optionally .zst) or Parquet files, or a
// directory of them (taken in name order). A row is either flat (the
// dataset's own columns) or a reference row {prompt, label, metadata}; a
// reference row's metadata.remote_env_info and metadata keys are read as if
// they were columns.
type rowSource struct {
	format  string
	opts    *Options
	convert func(ctx context.Context, s *rowSource, f *fields) (converted, error)
	files   []stagecmd.Input
	tmpDir  string
}

func newRowSource(o *Options, convert func(context.Context, *rowSource, *fields) (converted, error)) (*rowSource, error) {
	s := &rowSource{format: o.Format, opts: o, convert: convert}
	if fi, err := os.Stat(o.Data); err == nil && fi.IsDir() {
		entries, err := os.ReadDir(o.Data)
		if err != nil {
			return nil, err
		}
		var names []string
		for _, e := range entries {
			if n := e.Name(); !e.IsDir() && (isParquet(n) || strings.Contains(n, ".jsonl")) {
				names = append(names, filepath.Join(o.Data, n))
			}
		}
		sort.Strings(names)
		if len(names) == 0 {
			return nil, stagecmd.Usagef("%s: --data %q holds no .parquet or .jsonl files", o.Format, o.Data)
		}
		for _, n := range names {
			s.files = append(s.files, stagecmd.Input{Name: n})
		}
		return s, nil
	}
	in, err := stagecmd.ParseInput(o.Data)
	if err != nil {
		return nil, stagecmd.UsageError{Err: err}
	}
	s.files = []stagecmd.Input{in}
	return s, nil
}

func isParquet(name string) bool { return strings.HasSuffix(name, ".parquet") }

func (s *rowSource) Externals(ctx context.Context) ([]dataset.External, error) {
	var ext []dataset.External
	for _, in := range s.files {
		e, err := in.Identify(ctx, "rows")
		if err != nil {
			return nil, fmt.Errorf("convert %s: %w", s.format, err)
		}
		ext = append(ext, e)
	}
	if s.format == "swepro" {
		e, err := s.scriptsInput(ctx)
		if err != nil {
			return nil, err
		}
		ext = append(ext, e)
	}
	return ext, nil
}

func (s *rowSource) Close() error {
	if s.tmpDir != "" {
		return os.RemoveAll(s.tmpDir)
	}
	return nil
}

func (s *rowSource) Each(ctx context.Context, fn rowFunc) error {
	return s.eachFields(ctx, func(loc location, f *fields) error {
		id, err := f.str("instance_id")
		if err != nil || id == "" {
			if err == nil {
				err = fmt.Errorf("required key \"instance_id\" is empty")
			}
			return stagecmd.BadInputError{Err: fmt.Errorf("%s: %w", loc, err)}
		}
		return fn(loc, id, func() (converted, error) {
			c, err := s.convert(ctx, s, f)
			if err == nil {
				err = c.Task.Validate()
			}
			return c, err
		})
	})
}

// eachFields calls fn with every row of every file, in order.
func (s *rowSource) eachFields(ctx context.Context, fn func(location, *fields) error) error {
	for _, in := range s.files {
		emit := func(loc location, raw map[string]json.RawMessage) error { return fn(loc, newFields(raw)) }
		var err error
		if isParquet(in.Name) {
			err = s.eachParquet(ctx, in, emit)
		} else {
			err = eachJSONL(ctx, in, emit)
		}
		if err != nil {
			return err
		}
	}
	return nil
}

// eachJSONL reads one JSON object per line; a blank line other than at the
// end is an error.
func eachJSONL(ctx context.Context, in stagecmd.Input, fn func(location, map[string]json.RawMessage) error) error {
	r, err := in.Open(ctx)
	if err != nil {
		return err
	}
	defer r.Close()
	br := bufio.NewReaderSize(r, 1<<20)
	for lineNo := int64(1); ; lineNo++ {
		line, err := br.ReadBytes('\n')
		if errors.Is(err, io.EOF) && len(line) == 0 {
			return nil
		}
		if err != nil && !errors.Is(err, io.EOF) {
			return fmt.Errorf("reading %q: %w", in.Name, err)
		}
		loc := location{File: in.Name, Row: lineNo, Line: true}
		line = bytes.TrimRight(line, "\r\n")
		if len(bytes.TrimSpace(line)) == 0 {
			if _, perr := br.Peek(1); perr == io.EOF {
				return nil
			}
			return stagecmd.BadInputError{Err: fmt.Errorf("%s: blank line; remove it", loc)}
		}
		var obj map[string]json.RawMessage
		if jerr := json.Unmarshal(line, &obj); jerr != nil {
			return stagecmd.BadInputError{Err: fmt.Errorf("%s: not a JSON object (%w)", loc, jerr)}
		} else if obj == nil {
			return stagecmd.BadInputError{Err: fmt.Errorf("%s: not a JSON object (null)", loc)}
		}
		if ferr := fn(loc, obj); ferr != nil {
			return ferr
		}
		if errors.Is(err, io.EOF) {
			return nil
		}
	}
}

// eachParquet reads every row of a Parquet file generically (each column
// becomes a key; lists, structs and maps become JSON), one row at a time.
func (s *rowSource) eachParquet(ctx context.Context, in stagecmd.Input, fn func(location, map[string]json.RawMessage) error) error {
	path := in.Name
	if strings.HasPrefix(path, "s3://") {
		if s.tmpDir == "" {
			dir, err := os.MkdirTemp("", "kiln-convert-")
			if err != nil {
				return err
			}
			s.tmpDir = dir
		}
		p, err := download(ctx, in, filepath.Join(s.tmpDir, filepath.Base(path)))
		if err != nil {
			return err
		}
		path = p
	}
	file, err := os.Open(path)
	if err != nil {
		return err
	}
	defer file.Close()
	fi, err := file.Stat()
	if err != nil {
		return err
	}
	pf, err := parquet.OpenFile(file, fi.Size(), parquet.SkipPageIndex(true), parquet.SkipBloomFilters(true))
	if err != nil {
		return stagecmd.BadInputError{Err: fmt.Errorf("%q is not a readable Parquet file: %w", in.Name, err)}
	}
	r := parquet.NewReader(pf)
	defer r.Close()
	for row := int64(1); ; row++ {
		if err := ctx.Err(); err != nil {
			return err
		}
		m := map[string]any{}
		err := readRow(r, &m)
		if errors.Is(err, io.EOF) {
			return nil
		}
		loc := location{File: in.Name, Row: row}
		if err != nil {
			return stagecmd.BadInputError{Err: fmt.Errorf("%s: %w", loc, err)}
		}
		obj := make(map[string]json.RawMessage, len(m))
		for k, v := range m {
			b, err := json.Marshal(jsonable(v))
			if err != nil {
				return stagecmd.BadInputError{Err: fmt.Errorf("%s: column %q: %w", loc, k, err)}
			}
			obj[k] = b
		}
		if err := fn(loc, obj); err != nil {
			return err
		}
	}
}

// readRow reads one row, turning a panic of the generic reconstruction
// (a schema it cannot map) into an error.
func readRow(r *parquet.Reader, m *map[string]any) (err error) {
	defer func() {
		if p := recover(); p != nil {
			err = fmt.Errorf("cannot read the row's columns: %v", p)
		}
	}()
	return r.Read(m)
}

// jsonable turns byte slices (Parquet strings read generically) into
// strings, recursively.
func jsonable(v any) any {
	switch x := v.(type) {
	case []byte:
		return string(x)
	case []any:
		for i := range x {
			x[i] = jsonable(x[i])
		}
	case map[string]any:
		for k := range x {
			x[k] = jsonable(x[k])
		}
	}
	return v
}

func download(ctx context.Context, in stagecmd.Input, path string) (string, error) {
	r, err := in.Open(ctx)
	if err != nil {
		return "", err
	}
	defer r.Close()
	f, err := os.Create(path)
	if err != nil {
		return "", err
	}
	if _, err := io.Copy(f, r); err != nil {
		f.Close()
		return "", fmt.Errorf("downloading %q: %w", in.Name, err)
	}
	return path, f.Close()
}

// fields is one input row's keys, with reference rows flattened: keys of
// metadata.remote_env_info, then of metadata, then top-level keys (other
// than prompt, label and metadata) each override the one before. It records
// which keys were used, so the rest can be kept in the metadata column.
type fields struct {
	m    map[string]json.RawMessage
	used map[string]bool
	// prompt is the reference row's prompt, if any.
	prompt json.RawMessage
}

func newFields(row map[string]json.RawMessage) *fields {
	f := &fields{m: map[string]json.RawMessage{}, used: map[string]bool{}}
	md, isRef := row["metadata"]
	var mdObj map[string]json.RawMessage
	if isRef && json.Unmarshal(md, &mdObj) == nil && mdObj != nil {
		var rei map[string]json.RawMessage
		if raw, ok := mdObj["remote_env_info"]; ok && json.Unmarshal(raw, &rei) == nil && rei != nil {
			for k, v := range rei {
				f.m[k] = v
			}
			delete(mdObj, "remote_env_info")
		}
		for k, v := range mdObj {
			f.m[k] = v
		}
		f.prompt = row["prompt"]
		for k, v := range row {
			if k != "prompt" && k != "label" && k != "metadata" {
				f.m[k] = v
			}
		}
		if _, ok := f.m["instance_id"]; !ok {
			if l, ok := row["label"]; ok {
				f.m["instance_id"] = l
			}
		}
		return f
	}
	for k, v := range row {
		f.m[k] = v
	}
	return f
}

func isNull(raw json.RawMessage) bool { return len(raw) == 0 || bytes.Equal(raw, []byte("null")) }

// lookup returns the first of keys present and not null.
func (f *fields) lookup(keys ...string) (string, json.RawMessage, bool) {
	for _, k := range keys {
		if raw, ok := f.m[k]; ok && !isNull(raw) {
			f.used[k] = true
			return k, raw, true
		}
	}
	for _, k := range keys {
		if _, ok := f.m[k]; ok {
			f.used[k] = true
		}
	}
	return "", nil, false
}

// str returns the first of keys as a string; absent or null is an error
// naming keys[0].
func (f *fields) str(keys ...string) (string, error) {
	s, ok, err := f.optStr(keys...)
	if err == nil && !ok {
		err = fmt.Errorf("required key %q is missing or null", keys[0])
	}
	return s, err
}

// optStr is str for an optional key.
func (f *fields) optStr(keys ...string) (string, bool, error) {
	k, raw, ok := f.lookup(keys...)
	if !ok {
		return "", false, nil
	}
	var s string
	if raw[0] != '"' || json.Unmarshal(raw, &s) != nil {
		return "", false, fmt.Errorf("key %q is %s, want a string", k, jsonType(raw))
	}
	return s, true, nil
}

// list returns the first of keys as a list of strings: a JSON list, or a
// string holding one (SWE-bench's FAIL_TO_PASS). Absent or null is an error.
func (f *fields) list(keys ...string) ([]string, error) {
	l, ok, err := f.optList(keys...)
	if err == nil && !ok {
		err = fmt.Errorf("required key %q is missing or null", keys[0])
	}
	return l, err
}

func (f *fields) optList(keys ...string) ([]string, bool, error) {
	k, raw, ok := f.lookup(keys...)
	if !ok {
		return nil, false, nil
	}
	if raw[0] == '"' {
		var s string
		if err := json.Unmarshal(raw, &s); err != nil {
			return nil, false, fmt.Errorf("key %q: %w", k, err)
		}
		raw = json.RawMessage(s)
	}
	var l []string
	if err := json.Unmarshal(raw, &l); err != nil || l == nil {
		return nil, false, fmt.Errorf("key %q is not a list of strings (nor a JSON-encoded one)", k)
	}
	return l, true, nil
}

// object returns the first of keys as a JSON object (or a string holding
// one), without marking it used.
func (f *fields) object(keys ...string) map[string]json.RawMessage {
	for _, k := range keys {
		raw, ok := f.m[k]
		if !ok || isNull(raw) {
			continue
		}
		if raw[0] == '"' {
			var s string
			if json.Unmarshal(raw, &s) == nil {
				raw = json.RawMessage(s)
			}
		}
		var o map[string]json.RawMessage
		if json.Unmarshal(raw, &o) == nil && o != nil {
			return o
		}
	}
	return nil
}

// rest is the JSON object of every key not used (sorted by key).
func (f *fields) rest() string {
	left := map[string]json.RawMessage{}
	for k, v := range f.m {
		if !f.used[k] {
			left[k] = v
		}
	}
	s, _ := marshal(left)
	return s
}

// scriptsInput identifies, by content, every SWE-bench Pro script the rows
// name, as one input: the scripts are embedded in the tasks, so they are as
// much an input as the rows. A script that cannot be read is left out here;
// the conversion then fails on its row.
func (s *rowSource) scriptsInput(ctx context.Context) (dataset.External, error) {
	d := newDigest()
	seen := map[string]bool{}
	err := s.eachFields(ctx, func(_ location, f *fields) error {
		id, _, _ := f.optStr("instance_id")
		spec := f
		if o := f.object("swepro"); o != nil {
			spec = &fields{m: o, used: map[string]bool{}}
		}
		paths, err := sweproScriptPaths(s.opts.Scripts, id, spec)
		if err != nil {
			return nil
		}
		// Named by row and role, not path: only content enters version ids.
		for i, p := range paths {
			name := fmt.Sprintf("%s\x00%d", id, i)
			if seen[name] {
				continue
			}
			seen[name] = true
			if e, err := dataset.FileInput("script", p); err == nil {
				d.add(name, e.SHA256, e.Size)
			}
		}
		return nil
	})
	if err != nil {
		return dataset.External{}, err
	}
	sum, size := d.sum()
	return dataset.External{Role: "swepro-scripts", URI: s.opts.Scripts, SHA256: sum, Size: size}, nil
}
