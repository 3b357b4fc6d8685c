package parse

import (
	"encoding/json"
	"strings"
	"unicode/utf8"
)

// kind is the type of a decoded JSON (or Python-literal) value.
type kind uint8

const (
	kNull kind = iota
	kBool
	kNum // s holds a valid JSON number literal
	kStr
	kArr
	kObj
)

// value is an order-preserving JSON value tree.
type value struct {
	k   kind
	b   bool
	s   string
	arr []value
	obj []member
}

type member struct {
	key string
	val value
}

func strValue(s string) value { return value{k: kStr, s: s} }

// get returns the member named key of an object value.
func (v *value) get(key string) (value, bool) {
	if v.k != kObj {
		return value{}, false
	}
	for i := range v.obj {
		if v.obj[i].key == key {
			return v.obj[i].val, true
		}
	}
	return value{}, false
}

// objectBuilder appends members with Python dict semantics: a repeated key
// keeps its first position and takes the last value.
type objectBuilder struct {
	members []member
	index   map[string]int
}

func (b *objectBuilder) set(key string, v value) {
	if b.index == nil && len(b.members) >= 8 {
		b.index = make(map[string]int, 16)
		for i, m := range b.members {
			b.index[m.key] = i
		}
	}
	if b.index != nil {
		if i, ok := b.index[key]; ok {
			b.members[i].val = v
			return
		}
		b.index[key] = len(b.members)
	} else {
		for i := range b.members {
			if b.members[i].key == key {
				b.members[i].val = v
				return
			}
		}
	}
	b.members = append(b.members, member{key, v})
}

func (b *objectBuilder) value() value {
	if b.members == nil {
		return value{k: kObj, obj: []member{}}
	}
	return value{k: kObj, obj: b.members}
}

// ---- writer ----

// appendValue appends v as compact JSON: no insignificant whitespace, keys
// in stored order, no HTML escaping.
func appendValue(dst []byte, v value) []byte {
	switch v.k {
	case kNull:
		return append(dst, "null"...)
	case kBool:
		if v.b {
			return append(dst, "true"...)
		}
		return append(dst, "false"...)
	case kNum:
		return append(dst, v.s...)
	case kStr:
		return AppendString(dst, v.s)
	case kArr:
		dst = append(dst, '[')
		for i, e := range v.arr {
			if i > 0 {
				dst = append(dst, ',')
			}
			dst = appendValue(dst, e)
		}
		return append(dst, ']')
	default:
		dst = append(dst, '{')
		for i, m := range v.obj {
			if i > 0 {
				dst = append(dst, ',')
			}
			dst = AppendString(dst, m.key)
			dst = append(dst, ':')
			dst = appendValue(dst, m.val)
		}
		return append(dst, '}')
	}
}

func encode(v value) json.RawMessage { return appendValue(nil, v) }

const hexDigits = "0123456789abcdef"

// AppendString appends s as a JSON string literal. Only '"', '\\' and
// control characters are escaped (no HTML escaping, non-ASCII stays raw);
// invalid UTF-8 bytes become U+FFFD.
func AppendString(dst []byte, s string) []byte {
	dst = append(dst, '"')
	start := 0
	for i := 0; i < len(s); {
		c := s[i]
		if c < utf8.RuneSelf {
			if c >= 0x20 && c != '"' && c != '\\' {
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
				dst = append(dst, '\\', 'u', '0', '0', hexDigits[c>>4], hexDigits[c&0xf])
			}
			i++
			start = i
			continue
		}
		r, size := utf8.DecodeRuneInString(s[i:])
		if r == utf8.RuneError && size == 1 {
			dst = append(dst, s[start:i]...)
			dst = append(dst, "\ufffd"...)
			i++
			start = i
			continue
		}
		i += size
	}
	dst = append(dst, s[start:]...)
	return append(dst, '"')
}

// ObjectWriter builds one JSON object whose keys appear in the order they
// are written, compact and without HTML escaping. The zero value is ready
// to use. Keys are written as given; the caller avoids duplicates.
type ObjectWriter struct {
	buf []byte
}

func (w *ObjectWriter) key(k string) {
	if len(w.buf) == 0 {
		w.buf = append(w.buf, '{')
	} else {
		w.buf = append(w.buf, ',')
	}
	w.buf = AppendString(w.buf, k)
	w.buf = append(w.buf, ':')
}

// String writes key: "s".
func (w *ObjectWriter) String(key, s string) {
	w.key(key)
	w.buf = AppendString(w.buf, s)
}

// Raw writes key: raw. raw must be one valid JSON value; it is copied
// verbatim (an empty raw writes null).
func (w *ObjectWriter) Raw(key string, raw json.RawMessage) {
	w.key(key)
	if len(raw) == 0 {
		w.buf = append(w.buf, "null"...)
		return
	}
	w.buf = append(w.buf, raw...)
}

// Bytes returns the finished object ("{}" when nothing was written). The
// writer may keep being used; later writes extend a fresh copy.
func (w *ObjectWriter) Bytes() json.RawMessage {
	if len(w.buf) == 0 {
		return json.RawMessage("{}")
	}
	out := make([]byte, len(w.buf)+1)
	copy(out, w.buf)
	out[len(w.buf)] = '}'
	return out
}

// ---- parser ----

// maxDepth bounds nesting so hostile input cannot exhaust the stack.
const maxDepth = 10000

// parseJSON decodes exactly one JSON value surrounded by optional JSON
// whitespace, following Python's json.loads except that NaN / Infinity
// are rejected (they have no JSON encoding). lenient allows raw control
// characters inside strings (json.loads(strict=False)).
func parseJSON(s string, lenient bool) (value, bool) {
	p := jsonParser{s: s, lenient: lenient}
	p.ws()
	v, ok := p.value(0)
	if !ok {
		return value{}, false
	}
	p.ws()
	if p.i != len(p.s) {
		return value{}, false
	}
	return v, true
}

type jsonParser struct {
	s       string
	i       int
	lenient bool
}

func (p *jsonParser) ws() {
	for p.i < len(p.s) {
		switch p.s[p.i] {
		case ' ', '\t', '\n', '\r':
			p.i++
		default:
			return
		}
	}
}

func (p *jsonParser) value(depth int) (value, bool) {
	if p.i >= len(p.s) || depth > maxDepth {
		return value{}, false
	}
	switch c := p.s[p.i]; {
	case c == '{':
		p.i++
		var b objectBuilder
		p.ws()
		if p.i < len(p.s) && p.s[p.i] == '}' {
			p.i++
			return b.value(), true
		}
		for {
			if p.i >= len(p.s) || p.s[p.i] != '"' {
				return value{}, false
			}
			k, ok := p.str()
			if !ok {
				return value{}, false
			}
			p.ws()
			if p.i >= len(p.s) || p.s[p.i] != ':' {
				return value{}, false
			}
			p.i++
			p.ws()
			v, ok := p.value(depth + 1)
			if !ok {
				return value{}, false
			}
			b.set(k, v)
			p.ws()
			if p.i >= len(p.s) {
				return value{}, false
			}
			if p.s[p.i] == '}' {
				p.i++
				return b.value(), true
			}
			if p.s[p.i] != ',' {
				return value{}, false
			}
			p.i++
			p.ws()
		}
	case c == '[':
		p.i++
		arr := []value{}
		p.ws()
		if p.i < len(p.s) && p.s[p.i] == ']' {
			p.i++
			return value{k: kArr, arr: arr}, true
		}
		for {
			v, ok := p.value(depth + 1)
			if !ok {
				return value{}, false
			}
			arr = append(arr, v)
			p.ws()
			if p.i >= len(p.s) {
				return value{}, false
			}
			if p.s[p.i] == ']' {
				p.i++
				return value{k: kArr, arr: arr}, true
			}
			if p.s[p.i] != ',' {
				return value{}, false
			}
			p.i++
			p.ws()
		}
	case c == '"':
		s, ok := p.str()
		return strValue(s), ok
	case c == 't':
		return p.lit("true", value{k: kBool, b: true})
	case c == 'f':
		return p.lit("false", value{k: kBool})
	case c == 'n':
		return p.lit("null", value{k: kNull})
	case c == '-' || (c >= '0' && c <= '9'):
		return p.num()
	}
	return value{}, false
}

func (p *jsonParser) lit(word string, v value) (value, bool) {
	if strings.HasPrefix(p.s[p.i:], word) {
		p.i += len(word)
		return v, true
	}
	return value{}, false
}

func isDigit(c byte) bool { return c >= '0' && c <= '9' }

func (p *jsonParser) num() (value, bool) {
	start := p.i
	if p.s[p.i] == '-' {
		p.i++
	}
	if p.i >= len(p.s) || !isDigit(p.s[p.i]) {
		return value{}, false
	}
	if p.s[p.i] == '0' {
		p.i++
	} else {
		for p.i < len(p.s) && isDigit(p.s[p.i]) {
			p.i++
		}
	}
	// Like Python's scanner, a fraction or exponent that does not
	// complete is simply not part of the number (and then fails as
	// extra data).
	if p.i+1 < len(p.s) && p.s[p.i] == '.' && isDigit(p.s[p.i+1]) {
		p.i += 2
		for p.i < len(p.s) && isDigit(p.s[p.i]) {
			p.i++
		}
	}
	if p.i < len(p.s) && (p.s[p.i] == 'e' || p.s[p.i] == 'E') {
		j := p.i + 1
		if j < len(p.s) && (p.s[j] == '+' || p.s[j] == '-') {
			j++
		}
		if j < len(p.s) && isDigit(p.s[j]) {
			for j < len(p.s) && isDigit(p.s[j]) {
				j++
			}
			p.i = j
		}
	}
	return value{k: kNum, s: p.s[start:p.i]}, true
}

func hexVal(c byte) rune {
	switch {
	case c >= '0' && c <= '9':
		return rune(c - '0')
	case c >= 'a' && c <= 'f':
		return rune(c-'a') + 10
	case c >= 'A' && c <= 'F':
		return rune(c-'A') + 10
	}
	return -1
}

// hex4 decodes four hex digits at s[i:].
func hex4(s string, i int) (rune, bool) {
	if i+4 > len(s) {
		return 0, false
	}
	var r rune
	for j := 0; j < 4; j++ {
		h := hexVal(s[i+j])
		if h < 0 {
			return 0, false
		}
		r = r<<4 | h
	}
	return r, true
}

// str decodes a string literal starting at the opening quote.
func (p *jsonParser) str() (string, bool) {
	p.i++ // opening quote
	var sb []byte
	start := p.i
	for p.i < len(p.s) {
		c := p.s[p.i]
		switch {
		case c == '"':
			var out string
			if sb == nil {
				out = p.s[start:p.i]
			} else {
				out = string(append(sb, p.s[start:p.i]...))
			}
			p.i++
			return out, true
		case c < 0x20:
			if !p.lenient {
				return "", false
			}
			p.i++
		case c == '\\':
			sb = append(sb, p.s[start:p.i]...)
			if p.i+1 >= len(p.s) {
				return "", false
			}
			e := p.s[p.i+1]
			p.i += 2
			switch e {
			case '"', '\\', '/':
				sb = append(sb, e)
			case 'b':
				sb = append(sb, '\b')
			case 'f':
				sb = append(sb, '\f')
			case 'n':
				sb = append(sb, '\n')
			case 'r':
				sb = append(sb, '\r')
			case 't':
				sb = append(sb, '\t')
			case 'u':
				r, ok := hex4(p.s, p.i)
				if !ok {
					return "", false
				}
				p.i += 4
				if r >= 0xd800 && r < 0xdc00 && p.i+1 < len(p.s) && p.s[p.i] == '\\' && p.s[p.i+1] == 'u' {
					if r2, ok := hex4(p.s, p.i+2); ok && r2 >= 0xdc00 && r2 < 0xe000 {
						r = 0x10000 + (r-0xd800)<<10 + (r2 - 0xdc00)
						p.i += 6
					}
				}
				// A lone surrogate (kept by Python) has no UTF-8 form:
				// utf8.AppendRune writes U+FFFD for it.
				sb = utf8.AppendRune(sb, r)
			default:
				return "", false
			}
			start = p.i
		default:
			p.i++
		}
	}
	return "", false
}
