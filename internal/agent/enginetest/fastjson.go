package enginetest

import (
	"encoding/json"
	"unicode/utf8"

	"github.com/kilnrl/kiln/internal/agent/jsonskim"
)

// fastOrdered is the one decoding fast path left here, parseOrdered's
// (ojson.go): it gives exactly what decodeOrdered gives, or it declines
// (false) and decodeOrdered runs, with its own errors' wording. It goes
// with ojson.go, which moves to the shared ordered-JSON package; every
// other request field is decoded by encoding/json.

// fastMaxDepth is below encoding/json's nesting limit (10000): deeper text
// is left to encoding/json, which reports it.
const fastMaxDepth = 9000

// fastOrdered is parseOrdered's fast path.
func fastOrdered(b []byte) (any, bool) {
	i := jsonskim.Space(b, 0)
	v, end := orderedValue(b, i, 1)
	if end < 0 || jsonskim.Space(b, end) != len(b) {
		return nil, false
	}
	return v, true
}

// orderedValue decodes the value at b[i] as parseValue does and returns the
// index after it, or -1.
func orderedValue(b []byte, i, depth int) (any, int) {
	if i >= len(b) {
		return nil, -1
	}
	switch c := b[i]; {
	case c == '{':
		if depth > fastMaxDepth {
			return nil, -1
		}
		o := &object{}
		if i = jsonskim.Space(b, i+1); i < len(b) && b[i] == '}' {
			return o, i + 1
		}
		for {
			if i >= len(b) || b[i] != '"' {
				return nil, -1
			}
			k, end := stringValue(b, i)
			if end < 0 {
				return nil, -1
			}
			if i = jsonskim.Space(b, end); i >= len(b) || b[i] != ':' {
				return nil, -1
			}
			v, vend := orderedValue(b, jsonskim.Space(b, i+1), depth+1)
			if vend < 0 {
				return nil, -1
			}
			o.set(k, v)
			if i = jsonskim.Space(b, vend); i >= len(b) {
				return nil, -1
			}
			switch b[i] {
			case '}':
				return o, i + 1
			case ',':
				i = jsonskim.Space(b, i+1)
			default:
				return nil, -1
			}
		}
	case c == '[':
		if depth > fastMaxDepth {
			return nil, -1
		}
		a := []any{}
		if i = jsonskim.Space(b, i+1); i < len(b) && b[i] == ']' {
			return a, i + 1
		}
		for {
			v, end := orderedValue(b, i, depth+1)
			if end < 0 {
				return nil, -1
			}
			a = append(a, v)
			if i = jsonskim.Space(b, end); i >= len(b) {
				return nil, -1
			}
			switch b[i] {
			case ']':
				return a, i + 1
			case ',':
				i = jsonskim.Space(b, i+1)
			default:
				return nil, -1
			}
		}
	case c == '"':
		return stringValue(b, i)
	case c == '-' || (c >= '0' && c <= '9'):
		end := skipNumber(b, i)
		if end < 0 {
			return nil, -1
		}
		return json.Number(b[i:end]), end
	default:
		for _, l := range [...]struct {
			text string
			v    any
		}{{"true", true}, {"false", false}, {"null", nil}} {
			if len(b)-i >= len(l.text) && string(b[i:i+len(l.text)]) == l.text {
				return l.v, i + len(l.text)
			}
		}
		return nil, -1
	}
}

// stringValue decodes the string at b[i] (a '"') and returns the index
// after it, or -1.
func stringValue(b []byte, i int) (string, int) {
	end, plain := skipString(b, i)
	if end < 0 {
		return "", -1
	}
	if plain {
		return string(b[i+1 : end-1]), end
	}
	s, ok := jsonskim.Unquote(b[i:end])
	if !ok {
		return "", -1
	}
	return s, end
}

// skipString returns the index after the valid JSON string at b[i] (a
// '"'), or -1; plain reports that its value is its bytes between the quotes
// (no escapes, valid UTF-8).
func skipString(b []byte, i int) (end int, plain bool) {
	plain = true
	ascii := true
	for j := i + 1; j < len(b); j++ {
		switch c := b[j]; {
		case c == '"':
			if !ascii {
				plain = plain && utf8.Valid(b[i+1:j])
			}
			return j + 1, plain
		case c < 0x20:
			return -1, false
		case c == '\\':
			plain = false
			if j+1 >= len(b) {
				return -1, false
			}
			j++
			switch b[j] {
			case '"', '\\', '/', 'b', 'f', 'n', 'r', 't':
			case 'u':
				if j+4 >= len(b) {
					return -1, false
				}
				for _, h := range b[j+1 : j+5] {
					if !(h >= '0' && h <= '9' || h >= 'a' && h <= 'f' || h >= 'A' && h <= 'F') {
						return -1, false
					}
				}
				j += 4
			default:
				return -1, false
			}
		case c >= 0x80:
			ascii = false
		}
	}
	return -1, false
}

// skipNumber returns the index after the JSON number at b[i], or -1.
func skipNumber(b []byte, i int) int {
	if i < len(b) && b[i] == '-' {
		i++
	}
	digits := func() int {
		s := i
		for i < len(b) && b[i] >= '0' && b[i] <= '9' {
			i++
		}
		return i - s
	}
	switch {
	case i < len(b) && b[i] == '0':
		i++
	case digits() == 0:
		return -1
	}
	if i < len(b) && b[i] == '.' {
		i++
		if digits() == 0 {
			return -1
		}
	}
	if i < len(b) && (b[i] == 'e' || b[i] == 'E') {
		i++
		if i < len(b) && (b[i] == '+' || b[i] == '-') {
			i++
		}
		if digits() == 0 {
			return -1
		}
	}
	return i
}
