package protocol

import (
	"bytes"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"strconv"
	"unicode/utf8"

	"github.com/kilnrl/kiln/internal/agent/jsonskim"
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
	// The first fields' room, in the same allocation: most objects of a
	// chat request (messages, content blocks) have a handful of keys.
	keyRoom [objectRoom]string
	valRoom [objectRoom]any
}

const objectRoom = 4

// newObject returns an empty object with room for n fields.
func newObject(n int) *object {
	o := &object{}
	if n <= objectRoom {
		o.keys, o.vals = o.keyRoom[:0], o.valRoom[:0]
	} else {
		o.keys, o.vals = make([]string, 0, n), make([]any, 0, n)
	}
	return o
}

// obj builds an object from key, value pairs.
func obj(kv ...any) *object {
	o := newObject(len(kv) / 2)
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

// parseJSON decodes one JSON value (and nothing after it but white space)
// into ordered form. It is strict as encoding/json is (RFC 8259 grammar;
// invalid UTF-8 and lone surrogates become U+FFFD, as there), reads a
// request body in one pass without a token stream, and reports errors with
// their byte offset.
func parseJSON(data []byte) (any, error) {
	return parseJSONWith(data, nil)
}

// skippedValue stands for a value the parser skipped at its caller's word
// (a cached part, see Cache).
type skippedValue struct{}

// topHook reads the value of a top-level key itself, starting at p.i, and
// leaves p.i after it (handled), or leaves it to the parser.
type topHook func(p *jsonParser, key string) (v any, handled bool, err error)

// parseJSONWith is parseJSON that offers each value of a top-level object
// to top first. top may be nil.
func parseJSONWith(data []byte, top topHook) (any, error) {
	p := jsonParser{b: data, top: top}
	p.ws()
	v, err := p.value(0)
	if err != nil {
		return nil, err
	}
	if p.ws(); p.i < len(p.b) {
		return nil, fmt.Errorf("unexpected data after the JSON value at offset %d", p.i)
	}
	return v, nil
}

type jsonParser struct {
	b   []byte
	i   int
	top topHook // nil: none
}

func (p *jsonParser) ws() {
	for p.i < len(p.b) {
		switch p.b[p.i] {
		case ' ', '\t', '\n', '\r':
			p.i++
		default:
			return
		}
	}
}

func (p *jsonParser) errorf(format string, args ...any) error {
	if p.i >= len(p.b) {
		return io.ErrUnexpectedEOF
	}
	return fmt.Errorf("invalid character %q at offset %d: %s", p.b[p.i], p.i, fmt.Sprintf(format, args...))
}

func (p *jsonParser) value(depth int) (any, error) {
	if p.i >= len(p.b) {
		return nil, io.ErrUnexpectedEOF
	}
	switch c := p.b[p.i]; {
	case c == '{':
		if depth >= maxDepth {
			return nil, errTooDeep
		}
		return p.object(depth)
	case c == '[':
		if depth >= maxDepth {
			return nil, errTooDeep
		}
		return p.array(depth)
	case c == '"':
		return p.str()
	case c == 't':
		return p.literal("true", true)
	case c == 'f':
		return p.literal("false", false)
	case c == 'n':
		return p.literal("null", nil)
	case c == '-' || (c >= '0' && c <= '9'):
		return p.number()
	}
	return nil, p.errorf("looking for the beginning of a value")
}

func (p *jsonParser) literal(word string, v any) (any, error) {
	if !bytes.HasPrefix(p.b[p.i:], []byte(word)) {
		if len(p.b)-p.i < len(word) && bytes.HasPrefix([]byte(word), p.b[p.i:]) {
			return nil, io.ErrUnexpectedEOF
		}
		return nil, p.errorf("in literal %s", word)
	}
	p.i += len(word)
	return v, nil
}

func (p *jsonParser) object(depth int) (any, error) {
	p.i++ // {
	o := newObject(objectRoom)
	p.ws()
	if p.i < len(p.b) && p.b[p.i] == '}' {
		p.i++
		return o, nil
	}
	for {
		if p.i >= len(p.b) {
			return nil, io.ErrUnexpectedEOF
		}
		if p.b[p.i] != '"' {
			return nil, p.errorf("looking for the beginning of an object key string")
		}
		k, err := p.key()
		if err != nil {
			return nil, err
		}
		if p.ws(); p.i >= len(p.b) {
			return nil, io.ErrUnexpectedEOF
		}
		if p.b[p.i] != ':' {
			return nil, p.errorf("after object key")
		}
		p.i++
		p.ws()
		var v any
		handled := false
		if depth == 0 && p.top != nil {
			if v, handled, err = p.top(p, k); err != nil {
				return nil, err
			}
		}
		if !handled {
			if v, err = p.value(depth + 1); err != nil {
				return nil, err
			}
		}
		o.set(k, v)
		if closed, err := p.next('}', "after object key:value pair"); err != nil || closed {
			return o, err
		}
	}
}

// next reads what follows a container's element: a comma and the space
// after it (closed false), or the closing byte (closed true). after words
// the error for anything else.
func (p *jsonParser) next(closing byte, after string) (closed bool, err error) {
	if p.ws(); p.i >= len(p.b) {
		return false, io.ErrUnexpectedEOF
	}
	switch p.b[p.i] {
	case ',':
		p.i++
		p.ws()
		return false, nil
	case closing:
		p.i++
		return true, nil
	}
	return false, p.errorf("%s", after)
}

func (p *jsonParser) array(depth int) (any, error) {
	p.i++ // [
	a := []any{}
	p.ws()
	if p.i < len(p.b) && p.b[p.i] == ']' {
		p.i++
		return a, nil
	}
	for {
		v, err := p.value(depth + 1)
		if err != nil {
			return nil, err
		}
		a = append(a, v)
		if closed, err := p.next(']', "after array element"); err != nil || closed {
			return a, err
		}
	}
}

// number reads the RFC 8259 number grammar and keeps its text.
func (p *jsonParser) number() (any, error) {
	s := p.i
	b := p.b
	i := p.i
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
		p.i = i
		return nil, io.ErrUnexpectedEOF
	case b[i] == '0':
		i++
	case b[i] >= '1' && b[i] <= '9':
		digits()
	default:
		p.i = i
		return nil, p.errorf("in numeric literal")
	}
	if i < len(b) && b[i] == '.' {
		i++
		if digits() == 0 {
			p.i = i
			if i >= len(b) {
				return nil, io.ErrUnexpectedEOF
			}
			return nil, p.errorf("after decimal point in numeric literal")
		}
	}
	if i < len(b) && (b[i] == 'e' || b[i] == 'E') {
		i++
		if i < len(b) && (b[i] == '+' || b[i] == '-') {
			i++
		}
		if digits() == 0 {
			p.i = i
			if i >= len(b) {
				return nil, io.ErrUnexpectedEOF
			}
			return nil, p.errorf("in exponent of numeric literal")
		}
	}
	p.i = i
	return json.Number(b[s:i]), nil
}

// key reads an object key. The keys of chat requests are a small set that
// every message repeats: those come back as constants (common), neither
// allocated nor boxed as str's values are.
func (p *jsonParser) key() (string, error) {
	b := p.b
	if end := bytes.IndexByte(b[p.i+1:], '"'); end >= 0 {
		if k, ok := common(b[p.i+1 : p.i+1+end]); ok {
			p.i += end + 2
			return k, nil
		}
	}
	k, err := p.str()
	if err != nil {
		return "", err
	}
	return k.(string), nil
}

// common returns the constant for a frequent key or string value of the
// three request protocols — field names, roles, block and item types,
// schema types — which every message repeats (raw is the text as sent,
// without escapes), so that those are not allocated.
func common(raw []byte) (string, bool) {
	if len(raw) > len("additionalProperties") {
		return "", false
	}
	switch string(raw) {
	case "role":
		return "role", true
	case "content":
		return "content", true
	case "type":
		return "type", true
	case "text":
		return "text", true
	case "id":
		return "id", true
	case "name":
		return "name", true
	case "input":
		return "input", true
	case "tool_use_id":
		return "tool_use_id", true
	case "cache_control":
		return "cache_control", true
	case "thinking":
		return "thinking", true
	case "signature":
		return "signature", true
	case "arguments":
		return "arguments", true
	case "call_id":
		return "call_id", true
	case "output":
		return "output", true
	case "tool_calls":
		return "tool_calls", true
	case "tool_call_id":
		return "tool_call_id", true
	case "function":
		return "function", true
	case "description":
		return "description", true
	case "properties":
		return "properties", true
	case "required":
		return "required", true
	case "is_error":
		return "is_error", true
	case "model":
		return "model", true
	case "messages":
		return "messages", true
	case "system":
		return "system", true
	case "tools":
		return "tools", true
	case "metadata":
		return "metadata", true
	case "max_tokens":
		return "max_tokens", true
	case "stream":
		return "stream", true
	case "temperature":
		return "temperature", true
	case "top_p":
		return "top_p", true
	case "top_k":
		return "top_k", true
	case "tool_choice":
		return "tool_choice", true
	case "user_id":
		return "user_id", true
	case "budget_tokens":
		return "budget_tokens", true
	case "effort":
		return "effort", true
	case "output_config":
		return "output_config", true
	case "context_management":
		return "context_management", true
	case "input_schema":
		return "input_schema", true
	case "status":
		return "status", true
	case "summary":
		return "summary", true
	case "encrypted_content":
		return "encrypted_content", true
	case "instructions":
		return "instructions", true
	case "store":
		return "store", true
	case "include":
		return "include", true
	case "parallel_tool_calls":
		return "parallel_tool_calls", true
	case "strict":
		return "strict", true
	case "parameters":
		return "parameters", true
	case "additionalProperties":
		return "additionalProperties", true
	case "items":
		return "items", true
	case "enum":
		return "enum", true
	case "stop_sequences":
		return "stop_sequences", true
	case "edits":
		return "edits", true
	case "keep":
		return "keep", true
	case "display":
		return "display", true
	case "max_output_tokens":
		return "max_output_tokens", true
	case "reasoning":
		return "reasoning", true
	case "user":
		return "user", true
	case "assistant":
		return "assistant", true
	case "developer":
		return "developer", true
	case "tool":
		return "tool", true
	case "tool_use":
		return "tool_use", true
	case "tool_result":
		return "tool_result", true
	case "function_call":
		return "function_call", true
	case "function_call_output":
		return "function_call_output", true
	case "message":
		return "message", true
	case "input_text":
		return "input_text", true
	case "output_text":
		return "output_text", true
	case "summary_text":
		return "summary_text", true
	case "object":
		return "object", true
	case "string":
		return "string", true
	case "ephemeral":
		return "ephemeral", true
	case "completed":
		return "completed", true
	}
	return "", false
}

// str reads a string at p.i (which holds '"'). Plain ASCII strings are one
// slice conversion, or a constant (common); others are decoded by
// jsonskim.Unquote.
func (p *jsonParser) str() (any, error) {
	b := p.b
	start := p.i + 1
	i := start
	for i < len(b) {
		c := b[i]
		if c == '"' {
			p.i = i + 1
			if v, ok := common(b[start:i]); ok {
				return v, nil
			}
			return string(b[start:i]), nil
		}
		if c == '\\' || c < 0x20 || c >= utf8.RuneSelf {
			break
		}
		i++
	}
	// The slow path: escapes and non-ASCII text, decoded by
	// jsonskim.Unquote as encoding/json decodes them.
	if end := jsonskim.String(b, p.i); end > 0 {
		if s, ok := jsonskim.Unquote(b[p.i:end]); ok {
			p.i = end
			return s, nil
		}
	}
	return nil, p.strError(i)
}

// strError words what is wrong with the string at p.i, from i (before it
// all is plain text), as encoding/json does, and leaves p.i at it.
func (p *jsonParser) strError(i int) error {
	b := p.b
	for i < len(b) {
		switch c := b[i]; {
		case c < 0x20:
			p.i = i
			return p.errorf("in string literal")
		case c == '\\':
			if i+1 >= len(b) {
				p.i = len(b)
				return io.ErrUnexpectedEOF
			}
			switch b[i+1] {
			case '"', '\\', '/', 'b', 'f', 'n', 'r', 't':
				i += 2
			case 'u':
				if len(b)-(i+2) < 4 {
					p.i = i + 2
					return io.ErrUnexpectedEOF
				}
				if _, err := strconv.ParseUint(string(b[i+2:i+6]), 16, 16); err != nil {
					p.i = i + 2
					return p.errorf("in \\u hexadecimal character escape")
				}
				i += 6
			default:
				p.i = i + 1
				return p.errorf("in string escape code")
			}
		default:
			i++
		}
	}
	p.i = len(b)
	return io.ErrUnexpectedEOF
}

// marshal encodes v compactly: keys in order, non-ASCII raw, no HTML
// escaping. It accepts the decoded types plus int, int64, []string,
// []*object and json.RawMessage (copied verbatim; it must be compact JSON).
// The value is written into room on the stack and copied out at its size:
// growing a buffer from nothing cost an allocation and a copy per doubling,
// and left up to half of it unused in what the caller keeps.
func marshal(v any) []byte {
	var scratch [1024]byte
	return bytes.Clone(appendJSON(scratch[:0], v))
}

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
