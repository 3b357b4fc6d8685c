package protocol

import (
	"bytes"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"strconv"
	"unicode/utf8"
)

// Ordered JSON. Values decoded from a request are nil, bool, json.Number,
// string, []any and *object; an *object keeps its keys in document order (a
// repeated key keeps its first position and takes its last value, as a
// Python dict does), so tool arguments and schemas reach the chat template in
// the order the client sent them. Encoding is compact, keeps non-ASCII
// characters raw and escapes no HTML (<, >, & stay as they are).

type object struct {
	keys []string
	vals []any
}

// obj builds an object from key, value pairs.
func obj(kv ...any) *object {
	o := &object{keys: make([]string, 0, len(kv)/2), vals: make([]any, 0, len(kv)/2)}
	for i := 0; i+1 < len(kv); i += 2 {
		o.set(kv[i].(string), kv[i+1])
	}
	return o
}

func (o *object) get(k string) (any, bool) {
	if o == nil {
		return nil, false
	}
	for i, key := range o.keys {
		if key == k {
			return o.vals[i], true
		}
	}
	return nil, false
}

// val returns the value of k, nil when absent.
func (o *object) val(k string) any {
	v, _ := o.get(k)
	return v
}

func (o *object) set(k string, v any) {
	for i, key := range o.keys {
		if key == k {
			o.vals[i] = v
			return
		}
	}
	o.keys = append(o.keys, k)
	o.vals = append(o.vals, v)
}

// str returns the value of k when it is a string.
func (o *object) str(k string) (string, bool) {
	s, ok := o.val(k).(string)
	return s, ok
}

// maxDepth bounds nesting so that a hostile body cannot exhaust the stack.
const maxDepth = 10000

var errTooDeep = errors.New("JSON nested too deeply")

// parseJSON decodes one JSON value (and nothing after it) into ordered form.
func parseJSON(data []byte) (any, error) {
	dec := json.NewDecoder(bytes.NewReader(data))
	dec.UseNumber()
	v, err := parseValue(dec, 0)
	if err != nil {
		return nil, err
	}
	if _, err := dec.Token(); err != io.EOF {
		if err == nil {
			return nil, fmt.Errorf("unexpected data after the JSON value at offset %d", dec.InputOffset())
		}
		return nil, err
	}
	return v, nil
}

func parseValue(dec *json.Decoder, depth int) (any, error) {
	tok, err := dec.Token()
	if err != nil {
		if err == io.EOF {
			return nil, io.ErrUnexpectedEOF
		}
		return nil, err
	}
	d, ok := tok.(json.Delim)
	if !ok {
		return tok, nil
	}
	if depth >= maxDepth {
		return nil, errTooDeep
	}
	switch d {
	case '{':
		o := &object{}
		for dec.More() {
			kt, err := dec.Token()
			if err != nil {
				return nil, err
			}
			k, _ := kt.(string)
			v, err := parseValue(dec, depth+1)
			if err != nil {
				return nil, err
			}
			o.set(k, v)
		}
		if _, err := dec.Token(); err != nil {
			return nil, err
		}
		return o, nil
	case '[':
		a := []any{}
		for dec.More() {
			v, err := parseValue(dec, depth+1)
			if err != nil {
				return nil, err
			}
			a = append(a, v)
		}
		if _, err := dec.Token(); err != nil {
			return nil, err
		}
		return a, nil
	}
	return nil, fmt.Errorf("unexpected %v", d)
}

// marshal encodes v compactly: keys in order, non-ASCII raw, no HTML
// escaping. It accepts the decoded types plus int, int64, []string,
// []*object and json.RawMessage (copied verbatim; it must be compact JSON).
func marshal(v any) []byte { return appendJSON(nil, v) }

func appendJSON(b []byte, v any) []byte {
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
	case string:
		return appendString(b, t)
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
			b = appendJSON(b, e)
		}
		return append(b, ']')
	case []string:
		b = append(b, '[')
		for i, e := range t {
			if i > 0 {
				b = append(b, ',')
			}
			b = appendString(b, e)
		}
		return append(b, ']')
	case []*object:
		b = append(b, '[')
		for i, e := range t {
			if i > 0 {
				b = append(b, ',')
			}
			b = appendJSON(b, e)
		}
		return append(b, ']')
	case *object:
		if t == nil {
			return append(b, "null"...)
		}
		b = append(b, '{')
		for i, k := range t.keys {
			if i > 0 {
				b = append(b, ',')
			}
			b = appendString(b, k)
			b = append(b, ':')
			b = appendJSON(b, t.vals[i])
		}
		return append(b, '}')
	}
	panic(fmt.Sprintf("protocol: cannot encode %T", v))
}

const hexDigits = "0123456789abcdef"

func appendString(b []byte, s string) []byte {
	b = append(b, '"')
	start := 0
	for i := 0; i < len(s); {
		c := s[i]
		if c >= 0x20 && c != '"' && c != '\\' && c < utf8.RuneSelf {
			i++
			continue
		}
		if c >= utf8.RuneSelf {
			r, size := utf8.DecodeRuneInString(s[i:])
			if r == utf8.RuneError && size == 1 {
				b = append(b, s[start:i]...)
				b = append(b, `\ufffd`...)
				i++
				start = i
				continue
			}
			i += size
			continue
		}
		b = append(b, s[start:i]...)
		switch c {
		case '"':
			b = append(b, '\\', '"')
		case '\\':
			b = append(b, '\\', '\\')
		case '\n':
			b = append(b, '\\', 'n')
		case '\r':
			b = append(b, '\\', 'r')
		case '\t':
			b = append(b, '\\', 't')
		case '\b':
			b = append(b, '\\', 'b')
		case '\f':
			b = append(b, '\\', 'f')
		default:
			b = append(b, '\\', 'u', '0', '0', hexDigits[c>>4], hexDigits[c&0xf])
		}
		i++
		start = i
	}
	b = append(b, s[start:]...)
	return append(b, '"')
}

// pyDumps renders v as Python's json.dumps(v) with default arguments: ", "
// and ": " separators, non-ASCII escaped as \uXXXX. Used only where the
// reference embeds such text in what the model reads (custom tool formats).
func pyDumps(v any) string { return string(appendPy(nil, v)) }

func appendPy(b []byte, v any) []byte {
	switch t := v.(type) {
	case string:
		b = append(b, '"')
		for _, r := range t {
			switch {
			case r == '"':
				b = append(b, '\\', '"')
			case r == '\\':
				b = append(b, '\\', '\\')
			case r == '\n':
				b = append(b, '\\', 'n')
			case r == '\r':
				b = append(b, '\\', 'r')
			case r == '\t':
				b = append(b, '\\', 't')
			case r == '\b':
				b = append(b, '\\', 'b')
			case r == '\f':
				b = append(b, '\\', 'f')
			case r < 0x20 || (r >= 0x7f && r < 0x10000):
				b = appendU(b, r)
			case r >= 0x10000:
				r -= 0x10000
				b = appendU(b, 0xd800+(r>>10))
				b = appendU(b, 0xdc00+(r&0x3ff))
			default:
				b = append(b, byte(r))
			}
		}
		return append(b, '"')
	case []any:
		b = append(b, '[')
		for i, e := range t {
			if i > 0 {
				b = append(b, ", "...)
			}
			b = appendPy(b, e)
		}
		return append(b, ']')
	case *object:
		b = append(b, '{')
		for i, k := range t.keys {
			if i > 0 {
				b = append(b, ", "...)
			}
			b = appendPy(b, k)
			b = append(b, ": "...)
			b = appendPy(b, t.vals[i])
		}
		return append(b, '}')
	}
	return appendJSON(b, v)
}

func appendU(b []byte, r rune) []byte {
	return append(b, '\\', 'u', hexDigits[r>>12&0xf], hexDigits[r>>8&0xf], hexDigits[r>>4&0xf], hexDigits[r&0xf])
}

// truthy is Python truthiness of a decoded JSON value.
func truthy(v any) bool {
	switch t := v.(type) {
	case nil:
		return false
	case bool:
		return t
	case string:
		return t != ""
	case json.Number:
		f, err := t.Float64()
		return err != nil || f != 0
	case []any:
		return len(t) > 0
	case *object:
		return len(t.keys) > 0
	}
	return true
}

// text renders a scalar as text: strings as themselves, anything else as
// its compact JSON (the Go port's stand-in for Python's str()).
func text(v any) string {
	if s, ok := v.(string); ok {
		return s
	}
	return string(marshal(v))
}
