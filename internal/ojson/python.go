package ojson

import (
	"encoding/json"
	"errors"
	"math"
	"strconv"
	"strings"
)

// AppendPy appends v as Python's json.dumps(v, ensure_ascii=ascii) writes
// the value json.loads gave for it — the tojson of chat templates, and what
// the reference embeds in text the model reads: ", " and ": " separators,
// keys in insertion order, no HTML escaping; an integer literal as Python's
// int writes it, any other number as the float's repr (1.0, 1e-05, 1e+16,
// Infinity past the float range). ascii escapes all but printable ASCII as
// \uXXXX (json.dumps' default); else only what AppendString escapes. Values
// other than the decoded types are written as Append writes them.
func AppendPy(b []byte, v any, ascii bool) []byte {
	switch t := v.(type) {
	case json.Number:
		return append(b, pyNumber(t)...)
	case float64:
		return append(b, PyFloat(t)...)
	case string:
		return appendString(b, t, ascii)
	case []any:
		b = append(b, '[')
		for i, e := range t {
			if i > 0 {
				b = append(b, ", "...)
			}
			b = AppendPy(b, e, ascii)
		}
		return append(b, ']')
	case *Object:
		if t == nil {
			return append(b, "null"...)
		}
		b = append(b, '{')
		for i, k := range t.keys {
			if i > 0 {
				b = append(b, ", "...)
			}
			b = appendString(b, k, ascii)
			b = append(b, ": "...)
			b = AppendPy(b, t.vals[i], ascii)
		}
		return append(b, '}')
	}
	return Append(b, v)
}

// pyNumber is the text Python's json.dumps gives for the number json.loads
// read from the literal n: an integer as int writes it, else a float's repr.
func pyNumber(n json.Number) string {
	s := string(n)
	if !strings.ContainsAny(s, ".eE") {
		if s == "-0" {
			return "0"
		}
		return s
	}
	f, err := strconv.ParseFloat(s, 64)
	if err != nil && !errors.Is(err, strconv.ErrRange) {
		return s // not a number literal: as it is
	}
	return PyFloat(f)
}

// PyFloat is Python's repr(f) (which json.dumps writes): the shortest text
// that reads back as f, in positional notation with at least one fraction
// digit when the decimal exponent is in [-4, 16), else in exponent notation
// with a sign and at least two exponent digits (1e-05, 1.5e+16); NaN,
// Infinity and -Infinity as json.dumps writes them.
func PyFloat(f float64) string {
	switch {
	case math.IsNaN(f):
		return "NaN"
	case math.IsInf(f, 1):
		return "Infinity"
	case math.IsInf(f, -1):
		return "-Infinity"
	}
	if a := math.Abs(f); a != 0 && (a >= 1e16 || a < 1e-4) {
		// Go's shortest 'e' form is Python's: no trailing ".0" on the
		// mantissa, a signed exponent of at least two digits.
		return strconv.FormatFloat(f, 'e', -1, 64)
	}
	s := strconv.FormatFloat(f, 'f', -1, 64)
	if !strings.Contains(s, ".") {
		s += ".0"
	}
	return s
}
