package ojson

import (
	"bytes"
	"encoding/json"
	"math"
	"strconv"
	"unicode/utf8"
)

// Marshal encodes v compactly, as Append does. The value is written into
// room on the stack and copied out at its size: growing a buffer from
// nothing cost an allocation and a copy per doubling, and left up to half
// of it unused in what the caller keeps.
func Marshal(v any) []byte {
	var scratch [1024]byte
	return bytes.Clone(Append(scratch[:0], v))
}

// Append appends v as compact JSON: no insignificant white space, object
// keys in order, strings as AppendString writes them. It takes the decoded
// types (nil, bool, json.Number, string, []any, *Object) and int, int64,
// float64, []int, []string, []*Object and json.RawMessage (copied verbatim:
// it must be one compact JSON value; empty writes null). A float64 is
// written shortest ('g'), a non-finite one as Python's json module writes
// it (NaN, Infinity, -Infinity: what a Python server with allow_nan sends).
// Other values are written as encoding/json writes them, without HTML
// escaping.
func Append(b []byte, v any) []byte {
	switch t := v.(type) {
	case nil:
		return append(b, "null"...)
	case bool:
		if t {
			return append(b, "true"...)
		}
		return append(b, "false"...)
	case json.Number:
		return append(b, t...)
	case int:
		return strconv.AppendInt(b, int64(t), 10)
	case int64:
		return strconv.AppendInt(b, t, 10)
	case float64:
		return AppendFloat(b, t)
	case string:
		return AppendString(b, t)
	case json.RawMessage:
		if len(t) == 0 {
			return append(b, "null"...)
		}
		return append(b, t...)
	case []any:
		b = append(b, '[')
		for i, e := range t {
			if i > 0 {
				b = append(b, ',')
			}
			b = Append(b, e)
		}
		return append(b, ']')
	case []string:
		b = append(b, '[')
		for i, e := range t {
			if i > 0 {
				b = append(b, ',')
			}
			b = AppendString(b, e)
		}
		return append(b, ']')
	case []int:
		return appendInts(b, t)
	case []*Object:
		b = append(b, '[')
		for i, e := range t {
			if i > 0 {
				b = append(b, ',')
			}
			b = Append(b, e)
		}
		return append(b, ']')
	case *Object:
		if t == nil {
			return append(b, "null"...)
		}
		b = append(b, '{')
		for i, k := range t.keys {
			if i > 0 {
				b = append(b, ',')
			}
			b = AppendString(b, k)
			b = append(b, ':')
			b = Append(b, t.vals[i])
		}
		return append(b, '}')
	}
	var buf bytes.Buffer
	enc := json.NewEncoder(&buf)
	enc.SetEscapeHTML(false)
	if err := enc.Encode(v); err != nil {
		panic("ojson: cannot encode: " + err.Error())
	}
	return append(b, bytes.TrimSuffix(buf.Bytes(), []byte("\n"))...)
}

// AppendFloat appends f as Append writes a float64: shortest ('g'), a
// non-finite one as Python's json module writes it (NaN, Infinity,
// -Infinity). Writers of large replies call it beside Append to write
// numbers without boxing them in an any.
func AppendFloat(b []byte, f float64) []byte {
	switch {
	case math.IsNaN(f):
		return append(b, "NaN"...)
	case math.IsInf(f, 1):
		return append(b, "Infinity"...)
	case math.IsInf(f, -1):
		return append(b, "-Infinity"...)
	}
	return strconv.AppendFloat(b, f, 'g', -1, 64)
}

// appendInts appends ids as a JSON array; token ids are small non-negative
// numbers, written without strconv's generality.
func appendInts(dst []byte, ids []int) []byte {
	dst = append(dst, '[')
	for i, id := range ids {
		if i > 0 {
			dst = append(dst, ',')
		}
		switch {
		case id < 0 || id >= 100000:
			dst = strconv.AppendInt(dst, int64(id), 10)
		case id < 10:
			dst = append(dst, byte('0'+id))
		case id < 100:
			dst = append(dst, byte('0'+id/10), byte('0'+id%10))
		case id < 1000:
			dst = append(dst, byte('0'+id/100), byte('0'+id/10%10), byte('0'+id%10))
		default:
			var d [5]byte
			n := len(d)
			for ; id > 0; id /= 10 {
				n--
				d[n] = byte('0' + id%10)
			}
			dst = append(dst, d[n:]...)
		}
	}
	return append(dst, ']')
}

const hexDigits = "0123456789abcdef"

// AppendString appends s as a JSON string literal as Python's
// json.dumps(s, ensure_ascii=False) writes it: '"', '\\' and control
// characters escaped (\n, \r, \t, \b, \f by name, others as \u00XX),
// everything else raw — non-ASCII, U+2028 and U+2029, and no HTML escaping
// of <, > and &. Invalid UTF-8 bytes become U+FFFD.
func AppendString(dst []byte, s string) []byte {
	return appendString(dst, s, false)
}

// appendString is AppendString; ascii also escapes what is not printable
// ASCII (DEL and all non-ASCII) as \uXXXX, with surrogate pairs beyond the
// BMP, as json.dumps(s) with its default ensure_ascii=True does.
func appendString(dst []byte, s string, ascii bool) []byte {
	dst = append(dst, '"')
	start := 0
	for i := 0; i < len(s); {
		c := s[i]
		if c < utf8.RuneSelf {
			if c >= 0x20 && c != '"' && c != '\\' && (c != 0x7f || !ascii) {
				i++
				continue
			}
			dst = append(dst, s[start:i]...)
			switch c {
			case '"', '\\':
				dst = append(dst, '\\', c)
			case '\n':
				dst = append(dst, '\\', 'n')
			case '\r':
				dst = append(dst, '\\', 'r')
			case '\t':
				dst = append(dst, '\\', 't')
			case '\b':
				dst = append(dst, '\\', 'b')
			case '\f':
				dst = append(dst, '\\', 'f')
			default:
				dst = appendU(dst, rune(c))
			}
			i++
			start = i
			continue
		}
		r, size := utf8.DecodeRuneInString(s[i:])
		switch {
		case ascii:
			dst = append(dst, s[start:i]...)
			if r >= 0x10000 {
				r -= 0x10000
				dst = appendU(dst, 0xd800+(r>>10))
				r = 0xdc00 + (r & 0x3ff)
			}
			dst = appendU(dst, r)
			start = i + size
		case r == utf8.RuneError && size == 1:
			dst = append(dst, s[start:i]...)
			dst = append(dst, "\ufffd"...)
			start = i + size
		}
		i += size
	}
	dst = append(dst, s[start:]...)
	return append(dst, '"')
}

func appendU(b []byte, r rune) []byte {
	return append(b, '\\', 'u', hexDigits[r>>12&0xf], hexDigits[r>>8&0xf], hexDigits[r>>4&0xf], hexDigits[r&0xf])
}
