package records

import (
	"bytes"
	"encoding/json"
	"errors"
	"strings"
	"testing"
)

func TestEachJSONLine(t *testing.T) {
	cases := []struct {
		name, in string
		rows     []string
		errLine  int // 0: no *LineError
		err      string
	}{
		{name: "rows", in: "{\"a\":1}\n{\"b\":2}\n", rows: []string{`{"a":1}`, `{"b":2}`}},
		{name: "no final newline", in: "{\"a\":1}\r\n{\"b\":2}", rows: []string{`{"a":1}`, `{"b":2}`}},
		{name: "trailing blank lines", in: "{\"a\":1}\n\n \n", rows: []string{`{"a":1}`}},
		{name: "empty", in: "", err: "no rows"},
		{name: "only blank", in: "\n\n", err: "no rows"},
		{name: "blank between rows", in: "{}\n\n{}\n", errLine: 2, err: "empty line"},
		{name: "trailing garbage", in: "{}\n{\"a\":{}}}]garbage\n", errLine: 2, err: "trailing data"},
		{name: "trailing closer", in: "{\"a\":1}}\n", errLine: 1, err: "trailing data"},
		{name: "two objects", in: "{} {}\n", errLine: 1, err: "trailing data"},
		{name: "truncated", in: "{\"prompt\": \n", errLine: 1, err: "truncated"},
		{name: "array", in: "[1]\n", errLine: 1, err: "want {...}"},
		{name: "not json", in: "garbage\n", errLine: 1, err: "not a JSON object"},
	}
	for _, c := range cases {
		t.Run(c.name, func(t *testing.T) {
			var rows []string
			err := EachJSONLine(strings.NewReader(c.in), func(_ int, line []byte) error {
				rows = append(rows, string(line))
				return nil
			})
			if c.err == "" {
				if err != nil {
					t.Fatal(err)
				}
				if strings.Join(rows, "|") != strings.Join(c.rows, "|") {
					t.Fatalf("rows %q, want %q", rows, c.rows)
				}
				return
			}
			if err == nil || !strings.Contains(err.Error(), c.err) {
				t.Fatalf("error %v, want one containing %q", err, c.err)
			}
			var le *LineError
			if got := errors.As(err, &le); got != (c.errLine != 0) || (got && le.Line != c.errLine) {
				t.Fatalf("error %v: want line %d", err, c.errLine)
			}
		})
	}
}

// The parser every task row goes through refuses what the reader refuses.
func TestTaskRowTrailingGarbage(t *testing.T) {
	_, err := TaskFromReferenceRow([]byte(`{"prompt": "p", "label": "a", "metadata": {}}}]garbage`), 0)
	if err == nil || !strings.Contains(err.Error(), "trailing data") {
		t.Fatalf("got %v, want trailing data", err)
	}
}

// FuzzEachJSONLine holds EachJSONLine to its contract against an oracle
// built from encoding/json: the rows it yields are the non-blank lines, in
// order, each exactly one JSON object; it fails exactly when a line is not
// one (trailing garbage, a truncated object, another value), a blank line
// separates rows, or there is no row at all. The committed corpus
// (testdata/fuzz/FuzzEachJSONLine) holds those cases.
func FuzzEachJSONLine(f *testing.F) {
	for _, s := range []string{"{}\n", "", "\n", "{\"a\":{}}}]garbage\n", "{\"prompt\": ", "{}\n\n{}", "{} {}", "[1]\n", "{}\r\n{\"x\":\"\\n\"}\n\n"} {
		f.Add([]byte(s))
	}
	f.Fuzz(func(t *testing.T, in []byte) {
		var got [][]byte
		err := EachJSONLine(bytes.NewReader(in), func(_ int, line []byte) error {
			got = append(got, append([]byte(nil), line...))
			return nil
		})
		var want [][]byte
		wantErr := false
		lines := bytes.Split(in, []byte("\n"))
		last := -1 // the last non-blank line
		for i, l := range lines {
			if len(bytes.TrimSpace(bytes.TrimRight(l, "\r"))) > 0 {
				last = i
			}
		}
		for i := 0; i <= last && !wantErr; i++ {
			l := bytes.TrimRight(lines[i], "\r")
			if len(bytes.TrimSpace(l)) == 0 {
				wantErr = true // blank line before a row
				break
			}
			var v any
			trimmed := bytes.TrimSpace(l)
			if !json.Valid(l) || trimmed[0] != '{' || json.Unmarshal(l, &v) != nil {
				wantErr = true
				break
			}
			want = append(want, l)
		}
		if last < 0 {
			wantErr = true // no rows
		}
		if wantErr != (err != nil) {
			t.Fatalf("input %q: error %v, oracle says error=%v", in, err, wantErr)
		}
		if err != nil {
			if !errors.Is(err, ErrNoRows) {
				var le *LineError
				if !errors.As(err, &le) || le.Line < 1 || le.Line > len(lines) {
					t.Fatalf("input %q: error %v names no line of the input", in, err)
				}
			}
			return
		}
		if len(got) != len(want) {
			t.Fatalf("input %q: %d rows, oracle %d", in, len(got), len(want))
		}
		for i := range got {
			if !bytes.Equal(got[i], want[i]) {
				t.Fatalf("input %q: row %d %q, oracle %q", in, i, got[i], want[i])
			}
		}
	})
}
