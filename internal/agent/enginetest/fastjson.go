package enginetest

import (
	"bytes"
	"encoding/json"
	"unicode/utf8"

	"github.com/kilnrl/kiln/internal/agent/jsonskim"
)

// The engine decodes every request body, and the bulk of those bodies is
// token id lists and chat messages. Their decoding has fast paths here for
// the shapes clients send. Contract of each: it gives exactly what the
// encoding/json path beside it gives, or it declines (false) and that path
// runs, with its own errors' wording. The engine stands in for a GPU server
// in tests and benchmarks, where its CPU time is noise in what they measure.

// fastMaxDepth is below encoding/json's nesting limit (10000): deeper text
// is left to encoding/json, which reports it.
const fastMaxDepth = 9000

// splitObject is decodeBody's fast path: body's top-level object as raw
// values by key (the last of duplicate keys wins). Like json.Decoder, it
// reads the first value only and ignores what follows it.
func splitObject(b []byte) (map[string]json.RawMessage, bool) {
	i := jsonskim.Space(b, 0)
	if i >= len(b) || b[i] != '{' {
		return nil, false
	}
	m := map[string]json.RawMessage{}
	if i = jsonskim.Space(b, i+1); i < len(b) && b[i] == '}' {
		return m, true
	}
	for {
		if i >= len(b) || b[i] != '"' {
			return nil, false
		}
		end, plain := skipString(b, i)
		if end < 0 || !plain {
			return nil, false
		}
		key := string(b[i+1 : end-1])
		if i = jsonskim.Space(b, end); i >= len(b) || b[i] != ':' {
			return nil, false
		}
		i = jsonskim.Space(b, i+1)
		vend := skipValue(b, i, 1)
		if vend < 0 {
			return nil, false
		}
		m[key] = b[i:vend:vend]
		if i = jsonskim.Space(b, vend); i >= len(b) {
			return nil, false
		}
		switch b[i] {
		case '}':
			return m, true
		case ',':
			i = jsonskim.Space(b, i+1)
		default:
			return nil, false
		}
	}
}

// unmarshalInts is json.Unmarshal(raw, dst) for a list of integers.
func unmarshalInts(raw []byte, dst *[]int) error {
	if ids, ok := parseInts(raw); ok {
		*dst = ids
		return nil
	}
	return json.Unmarshal(raw, dst)
}

// parseInts reads a JSON array of integers of at most 18 digits each.
func parseInts(b []byte) ([]int, bool) {
	i := jsonskim.Space(b, 0)
	if i >= len(b) || b[i] != '[' {
		return nil, false
	}
	ids := make([]int, 0, bytes.Count(b, []byte{','})+1)
	if i = jsonskim.Space(b, i+1); i < len(b) && b[i] == ']' {
		return ids, jsonskim.Space(b, i+1) == len(b)
	}
	for {
		neg := i < len(b) && b[i] == '-'
		if neg {
			i++
		}
		start := i
		n := 0
		for i < len(b) && b[i] >= '0' && b[i] <= '9' {
			n = n*10 + int(b[i]-'0')
			i++
		}
		digits := i - start
		if digits == 0 || digits > 18 || (digits > 1 && b[start] == '0') {
			return nil, false
		}
		if neg {
			n = -n
		}
		ids = append(ids, n)
		if i = jsonskim.Space(b, i); i >= len(b) {
			return nil, false
		}
		switch b[i] {
		case ']':
			return ids, jsonskim.Space(b, i+1) == len(b)
		case ',':
			i = jsonskim.Space(b, i+1)
		default: // a fraction, an exponent or not a number
			return nil, false
		}
	}
}

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

// skipValue returns the index after the valid JSON value at b[i], or -1.
func skipValue(b []byte, i, depth int) int {
	if i >= len(b) {
		return -1
	}
	switch c := b[i]; {
	case c == '{' || c == '[':
		if depth > fastMaxDepth {
			return -1
		}
		if c == '[' {
			if end := skipIDs(b, i); end > 0 {
				return end
			}
		}
		closer := byte('}')
		if c == '[' {
			closer = ']'
		}
		if i = jsonskim.Space(b, i+1); i < len(b) && b[i] == closer {
			return i + 1
		}
		for {
			if c == '{' {
				if i >= len(b) || b[i] != '"' {
					return -1
				}
				if i, _ = skipString(b, i); i < 0 {
					return -1
				}
				if i = jsonskim.Space(b, i); i >= len(b) || b[i] != ':' {
					return -1
				}
				i = jsonskim.Space(b, i+1)
			}
			if i = skipValue(b, i, depth+1); i < 0 {
				return -1
			}
			if i = jsonskim.Space(b, i); i >= len(b) {
				return -1
			}
			switch b[i] {
			case closer:
				return i + 1
			case ',':
				i = jsonskim.Space(b, i+1)
			default:
				return -1
			}
		}
	case c == '"':
		end, _ := skipString(b, i)
		return end
	case c == '-' || (c >= '0' && c <= '9'):
		return skipNumber(b, i)
	default:
		for _, l := range [...]string{"true", "false", "null"} {
			if len(b)-i >= len(l) && string(b[i:i+len(l)]) == l {
				return i + len(l)
			}
		}
		return -1
	}
}

// skipIDs returns the index after the array at b[i] if it is a compact
// list of non-negative integers (what token id lists are), else -1.
func skipIDs(b []byte, i int) int {
	i++
	if i < len(b) && b[i] == ']' {
		return i + 1
	}
	for i < len(b) {
		start := i
		for i < len(b) && b[i] >= '0' && b[i] <= '9' {
			i++
		}
		if i == start || i == len(b) || (i-start > 1 && b[start] == '0') {
			return -1
		}
		switch b[i] {
		case ']':
			return i + 1
		case ',':
			i++
		default:
			return -1
		}
	}
	return -1
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
