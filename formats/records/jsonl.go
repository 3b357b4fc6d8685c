package records

import (
	"bufio"
	"bytes"
	"encoding/json"
	"errors"
	"fmt"
	"io"
)

// ErrNoRows is EachJSONLine's error for input without a single line: an
// empty file is never an empty import, it is a wrong file.
var ErrNoRows = errors.New("no rows: the file is empty")

// LineError is a JSONL line that is not what EachJSONLine accepts, or that
// fn rejected. Line is 1-based.
type LineError struct {
	Line int
	Err  error
}

func (e *LineError) Error() string { return fmt.Sprintf("line %d: %v", e.Line, e.Err) }
func (e *LineError) Unwrap() error { return e.Err }

// EachJSONLine reads JSON lines from r and calls fn with each line (its
// line ending removed) and its 1-based number. The contract every kiln
// import relies on, so that what commits is exactly what the file says:
//
//   - every line is exactly one JSON object: a line that is not valid JSON,
//     is truncated, is another kind of value, or has anything but white
//     space after the object ({...}}]garbage) is a *LineError;
//   - a blank line between rows is a *LineError (a row was lost there);
//     blank lines after the last row are ignored (a trailing newline, or a
//     few, is how editors end files);
//   - input without a single row is ErrNoRows.
//
// An error fn returns stops the reading and comes back as a *LineError
// for that line (io.EOF from fn stops quietly). Lines may be of any length.
func EachJSONLine(r io.Reader, fn func(lineNo int, line []byte) error) error {
	br := bufio.NewReaderSize(r, 1<<20)
	rows, blank := 0, 0 // blank: the first blank line since the last row
	for lineNo := 1; ; lineNo++ {
		line, err := br.ReadBytes('\n')
		if err != nil && !errors.Is(err, io.EOF) {
			return fmt.Errorf("line %d: reading: %w", lineNo, err)
		}
		if len(line) == 0 && err != nil {
			break
		}
		line = bytes.TrimRight(line, "\r\n")
		if len(bytes.TrimSpace(line)) == 0 {
			if blank == 0 {
				blank = lineNo
			}
		} else {
			if blank != 0 {
				return &LineError{Line: blank, Err: errors.New("empty line (a row is missing there: remove the line, or restore the row)")}
			}
			if err := checkJSONObjectLine(line); err != nil {
				return &LineError{Line: lineNo, Err: err}
			}
			rows++
			if ferr := fn(lineNo, line); ferr != nil {
				if errors.Is(ferr, io.EOF) {
					return nil
				}
				return &LineError{Line: lineNo, Err: ferr}
			}
		}
		if err != nil {
			break
		}
	}
	if rows == 0 {
		return ErrNoRows
	}
	return nil
}

// checkJSONObjectLine says why line is not exactly one JSON object.
func checkJSONObjectLine(line []byte) error {
	dec := json.NewDecoder(bytes.NewReader(line))
	var v json.RawMessage
	if err := dec.Decode(&v); err != nil {
		if errors.Is(err, io.ErrUnexpectedEOF) {
			return fmt.Errorf("not a JSON object: truncated: %s", shortJSON(line))
		}
		return fmt.Errorf("not a JSON object: %w", err)
	}
	if v[0] != '{' {
		return fmt.Errorf("not a JSON object: want {...}, got %s", shortJSON(v))
	}
	if rest := bytes.TrimSpace(line[dec.InputOffset():]); len(rest) > 0 {
		return fmt.Errorf("not a JSON object: trailing data %s after the object", shortJSON(rest))
	}
	return nil
}
