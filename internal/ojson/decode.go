package ojson

import (
	"bytes"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"strconv"
	"unicode/utf8"
)

// MaxDepth bounds nesting, as encoding/json's limit does, so that hostile
// text cannot exhaust the stack: a container nested deeper fails.
const MaxDepth = 10000

// errTooDeep is the error of text nested deeper than MaxDepth.
var errTooDeep = errors.New("JSON nested too deeply")

// Decode decodes one JSON value (and nothing after it but white space). It
// accepts what encoding/json accepts — the RFC 8259 grammar; invalid UTF-8
// and lone surrogates become U+FFFD, as there — which is also what Python's
// json.loads accepts but for NaN and the infinities (no JSON encoding:
// refused here). It reads the text in one pass without a token stream and
// reports errors with their byte offset; a truncated text is
// io.ErrUnexpectedEOF.
func Decode(data []byte) (any, error) {
	return decode(data, nil, false)
}

// DecodeLenient is Decode that also takes raw control characters inside
// strings, as Python's json.loads(strict=False) does: the mode for model
// output.
func DecodeLenient(data []byte) (any, error) {
	return decode(data, nil, true)
}

// TopHook reads the value of a top-level object's key itself, at
// d.Offset(), and leaves d after it (handled true), or leaves it to the
// decoder (handled false, d unmoved). A hook that skips a value it has
// seen before returns a stand-in of its own as v.
type TopHook func(d *Decoder, key string) (v any, handled bool, err error)

// DecodeWith is Decode that offers each value of a top-level object to top
// first. top may be nil.
func DecodeWith(data []byte, top TopHook) (any, error) {
	return decode(data, top, false)
}

func decode(data []byte, top TopHook, lenient bool) (any, error) {
	d := Decoder{b: data, top: top, lenient: lenient}
	d.Space()
	v, err := d.Value(0)
	if err != nil {
		return nil, err
	}
	if d.Space(); d.i < len(d.b) {
		return nil, fmt.Errorf("unexpected data after the JSON value at offset %d", d.i)
	}
	return v, nil
}

// Decoder is one decode in progress, as a TopHook sees it: the text, an
// offset into it, and the reading of values and separators there.
type Decoder struct {
	b       []byte
	i       int
	top     TopHook // nil: none
	lenient bool    // raw control characters allowed in strings
}

// Data is the whole text being decoded.
func (d *Decoder) Data() []byte { return d.b }

// Offset is where the decoder stands in Data.
func (d *Decoder) Offset() int { return d.i }

// Seek moves the decoder to offset i of Data (a hook that skipped a value
// moves past it).
func (d *Decoder) Seek(i int) { d.i = i }

// Space moves past white space.
func (d *Decoder) Space() {
	for d.i < len(d.b) {
		switch d.b[d.i] {
		case ' ', '\t', '\n', '\r':
			d.i++
		default:
			return
		}
	}
}

func (d *Decoder) errorf(format string, args ...any) error {
	if d.i >= len(d.b) {
		return io.ErrUnexpectedEOF
	}
	return fmt.Errorf("invalid character %q at offset %d: %s", d.b[d.i], d.i, fmt.Sprintf(format, args...))
}

// Value decodes the value at the offset and moves past it. depth is how
// many containers enclose it (0 for the top level; the hook of a top-level
// key reads a list's elements at depth 2).
func (d *Decoder) Value(depth int) (any, error) {
	if d.i >= len(d.b) {
		return nil, io.ErrUnexpectedEOF
	}
	switch c := d.b[d.i]; {
	case c == '{':
		if depth >= MaxDepth {
			return nil, errTooDeep
		}
		return d.object(depth)
	case c == '[':
		if depth >= MaxDepth {
			return nil, errTooDeep
		}
		return d.array(depth)
	case c == '"':
		return d.str()
	case c == 't':
		return d.literal("true", true)
	case c == 'f':
		return d.literal("false", false)
	case c == 'n':
		return d.literal("null", nil)
	case c == '-' || (c >= '0' && c <= '9'):
		return d.number()
	}
	return nil, d.errorf("looking for the beginning of a value")
}

func (d *Decoder) literal(word string, v any) (any, error) {
	if !bytes.HasPrefix(d.b[d.i:], []byte(word)) {
		if len(d.b)-d.i < len(word) && bytes.HasPrefix([]byte(word), d.b[d.i:]) {
			return nil, io.ErrUnexpectedEOF
		}
		return nil, d.errorf("in literal %s", word)
	}
	d.i += len(word)
	return v, nil
}

func (d *Decoder) object(depth int) (any, error) {
	d.i++ // {
	o := NewObject(objectRoom)
	d.Space()
	if d.i < len(d.b) && d.b[d.i] == '}' {
		d.i++
		return o, nil
	}
	for {
		if d.i >= len(d.b) {
			return nil, io.ErrUnexpectedEOF
		}
		if d.b[d.i] != '"' {
			return nil, d.errorf("looking for the beginning of an object key string")
		}
		k, err := d.key()
		if err != nil {
			return nil, err
		}
		if d.Space(); d.i >= len(d.b) {
			return nil, io.ErrUnexpectedEOF
		}
		if d.b[d.i] != ':' {
			return nil, d.errorf("after object key")
		}
		d.i++
		d.Space()
		var v any
		handled := false
		if depth == 0 && d.top != nil {
			if v, handled, err = d.top(d, k); err != nil {
				return nil, err
			}
		}
		if !handled {
			if v, err = d.Value(depth + 1); err != nil {
				return nil, err
			}
		}
		o.Set(k, v)
		if closed, err := d.Next('}'); err != nil || closed {
			return o, err
		}
	}
}

// Next reads what follows a container's element: a comma and the space
// after it (closed false), or closing, the container's closing byte ('}'
// or ']'; closed true).
func (d *Decoder) Next(closing byte) (closed bool, err error) {
	if d.Space(); d.i >= len(d.b) {
		return false, io.ErrUnexpectedEOF
	}
	switch d.b[d.i] {
	case ',':
		d.i++
		d.Space()
		return false, nil
	case closing:
		d.i++
		return true, nil
	}
	if closing == '}' {
		return false, d.errorf("after object key:value pair")
	}
	return false, d.errorf("after array element")
}

func (d *Decoder) array(depth int) (any, error) {
	d.i++ // [
	a := []any{}
	d.Space()
	if d.i < len(d.b) && d.b[d.i] == ']' {
		d.i++
		return a, nil
	}
	for {
		v, err := d.Value(depth + 1)
		if err != nil {
			return nil, err
		}
		a = append(a, v)
		if closed, err := d.Next(']'); err != nil || closed {
			return a, err
		}
	}
}

// number reads the RFC 8259 number grammar and keeps its text.
func (d *Decoder) number() (any, error) {
	s := d.i
	b := d.b
	i := d.i
	if b[i] == '-' {
		i++
	}
	digits := func() int {
		j := i
		for i < len(b) && b[i] >= '0' && b[i] <= '9' {
			i++
		}
		return i - j
	}
	switch {
	case i >= len(b):
		d.i = i
		return nil, io.ErrUnexpectedEOF
	case b[i] == '0':
		i++
	case b[i] >= '1' && b[i] <= '9':
		digits()
	default:
		d.i = i
		return nil, d.errorf("in numeric literal")
	}
	if i < len(b) && b[i] == '.' {
		i++
		if digits() == 0 {
			d.i = i
			if i >= len(b) {
				return nil, io.ErrUnexpectedEOF
			}
			return nil, d.errorf("after decimal point in numeric literal")
		}
	}
	if i < len(b) && (b[i] == 'e' || b[i] == 'E') {
		i++
		if i < len(b) && (b[i] == '+' || b[i] == '-') {
			i++
		}
		if digits() == 0 {
			d.i = i
			if i >= len(b) {
				return nil, io.ErrUnexpectedEOF
			}
			return nil, d.errorf("in exponent of numeric literal")
		}
	}
	d.i = i
	return json.Number(b[s:i]), nil
}

// key reads an object key.
func (d *Decoder) key() (string, error) {
	k, err := d.str()
	if err != nil {
		return "", err
	}
	return k.(string), nil
}

// str reads a string at d.i (which holds '"'). Plain ASCII strings are one
// slice conversion; others are decoded by unquote.
func (d *Decoder) str() (any, error) {
	b := d.b
	start := d.i + 1
	i := start
	for i < len(b) {
		c := b[i]
		if c == '"' {
			d.i = i + 1
			return string(b[start:i]), nil
		}
		if c == '\\' || c < 0x20 || c >= utf8.RuneSelf {
			break
		}
		i++
	}
	// The slow path: escapes, control characters and non-ASCII text.
	if end := StringEnd(b, d.i); end > 0 {
		if s, ok := unquote(b[d.i:end], d.lenient); ok {
			d.i = end
			return s, nil
		}
	}
	return nil, d.strError(i)
}

// strError words what is wrong with the string at d.i, from i (before it
// all is plain text), as encoding/json does, and leaves d.i at it.
func (d *Decoder) strError(i int) error {
	b := d.b
	for i < len(b) {
		switch c := b[i]; {
		case c < 0x20 && !d.lenient:
			d.i = i
			return d.errorf("in string literal")
		case c == '\\':
			if i+1 >= len(b) {
				d.i = len(b)
				return io.ErrUnexpectedEOF
			}
			switch b[i+1] {
			case '"', '\\', '/', 'b', 'f', 'n', 'r', 't':
				i += 2
			case 'u':
				if len(b)-(i+2) < 4 {
					d.i = i + 2
					return io.ErrUnexpectedEOF
				}
				if _, err := strconv.ParseUint(string(b[i+2:i+6]), 16, 16); err != nil {
					d.i = i + 2
					return d.errorf("in \\u hexadecimal character escape")
				}
				i += 6
			default:
				d.i = i + 1
				return d.errorf("in string escape code")
			}
		default:
			i++
		}
	}
	d.i = len(b)
	return io.ErrUnexpectedEOF
}
