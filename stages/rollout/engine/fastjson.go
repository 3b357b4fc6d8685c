package engine

import (
	"bytes"
	"encoding/json"
	"math"
)

// scanTokenize reads a /tokenize reply's "tokens", "count" and
// "max_model_len" without encoding/json: prompt id lists are the largest
// thing the adapter reads on every turn (thousands of ids, twice a turn).
// ok is false for anything unexpected; callers then use encoding/json,
// which also produces the error message.
func scanTokenize(b []byte) (tokens []int32, count int, hasCount bool, maxLen int, ok bool) {
	i := skipWS(b, 0)
	if i >= len(b) || b[i] != '{' {
		return nil, 0, false, 0, false
	}
	i = skipWS(b, i+1)
	if i < len(b) && b[i] == '}' {
		return nil, 0, false, 0, false // no tokens: let the slow path report it
	}
	for {
		if i >= len(b) || b[i] != '"' {
			return nil, 0, false, 0, false
		}
		ks := i
		if i = skipStr(b, i); i < 0 {
			return nil, 0, false, 0, false
		}
		key := b[ks:i]
		if i = skipWS(b, i); i >= len(b) || b[i] != ':' {
			return nil, 0, false, 0, false
		}
		i = skipWS(b, i+1)
		switch string(key) {
		case `"tokens"`:
			var good bool
			if tokens, i, good = scanIDs(b, i); !good {
				return nil, 0, false, 0, false
			}
		case `"count"`, `"max_model_len"`:
			n, j, good := scanUint(b, i)
			if !good {
				if j = skipAny(b, i); j < 0 || string(b[i:j]) != "null" {
					return nil, 0, false, 0, false
				}
			} else if string(key) == `"count"` {
				count, hasCount = n, true
			} else {
				maxLen = n
			}
			i = j
		default:
			if i = skipAny(b, i); i < 0 {
				return nil, 0, false, 0, false
			}
		}
		if i = skipWS(b, i); i >= len(b) {
			return nil, 0, false, 0, false
		}
		switch b[i] {
		case ',':
			i = skipWS(b, i+1)
		case '}':
			if skipWS(b, i+1) != len(b) || tokens == nil {
				return nil, 0, false, 0, false
			}
			return tokens, count, hasCount, maxLen, true
		default:
			return nil, 0, false, 0, false
		}
	}
}

// scanIDs parses a JSON array of non-negative int32s at b[i].
func scanIDs(b []byte, i int) ([]int32, int, bool) {
	if i >= len(b) || b[i] != '[' {
		return nil, i, false
	}
	// Each id takes at least two bytes ("n,"), which bounds the count.
	ids := make([]int32, 0, bytes.Count(b[i:], []byte{','})+1)
	i = skipWS(b, i+1)
	if i < len(b) && b[i] == ']' {
		return ids, i + 1, true
	}
	for {
		n, j, ok := scanUint(b, i)
		if !ok || n > math.MaxInt32 {
			return nil, i, false
		}
		ids = append(ids, int32(n))
		i = skipWS(b, j)
		if i >= len(b) {
			return nil, i, false
		}
		switch b[i] {
		case ',':
			i = skipWS(b, i+1)
		case ']':
			return ids, i + 1, true
		default:
			return nil, i, false
		}
	}
}

// scanUint parses a JSON non-negative integer (no sign, fraction or
// exponent, no leading zeros) of at most 18 digits.
func scanUint(b []byte, i int) (int, int, bool) {
	j := i
	n := 0
	for j < len(b) && b[j] >= '0' && b[j] <= '9' && j-i < 18 {
		n = n*10 + int(b[j]-'0')
		j++
	}
	if j == i || (b[i] == '0' && j-i > 1) {
		return 0, i, false
	}
	if j < len(b) && (b[j] == '.' || b[j] == 'e' || b[j] == 'E' || (b[j] >= '0' && b[j] <= '9')) {
		return 0, i, false
	}
	return n, j, true
}

func skipWS(b []byte, i int) int {
	for i < len(b) && (b[i] == ' ' || b[i] == '\t' || b[i] == '\n' || b[i] == '\r') {
		i++
	}
	return i
}

// skipStr returns the index after the string at b[i], or -1.
func skipStr(b []byte, i int) int {
	for j := i + 1; ; {
		k := bytes.IndexByte(b[j:], '"')
		if k < 0 {
			return -1
		}
		q := j + k
		bs := 0
		for p := q - 1; p > i && b[p] == '\\'; p-- {
			bs++
		}
		if bs%2 == 0 {
			return q + 1
		}
		j = q + 1
	}
}

// skipAny returns the index after the JSON value at b[i] (structure only;
// scalars by extent), or -1.
func skipAny(b []byte, i int) int {
	if i >= len(b) {
		return -1
	}
	switch b[i] {
	case '"':
		return skipStr(b, i)
	case '{', '[':
		depth := 0
		for ; i < len(b); i++ {
			switch b[i] {
			case '"':
				if i = skipStr(b, i); i < 0 {
					return -1
				}
				i--
			case '{', '[':
				depth++
			case '}', ']':
				depth--
				if depth == 0 {
					return i + 1
				}
			}
		}
		return -1
	}
	j := i
	for j < len(b) && b[j] != ',' && b[j] != '}' && b[j] != ']' && b[j] != ' ' && b[j] != '\n' && b[j] != '\t' && b[j] != '\r' {
		j++
	}
	if j == i {
		return -1
	}
	return j
}

// splitObject returns the raw values of a JSON object's top-level keys
// (keys without escapes only; duplicates: the last wins, as encoding/json).
// ok is false when the structure is not a plain object.
func splitObject(b []byte) (map[string]json.RawMessage, bool) {
	i := skipWS(b, 0)
	if i >= len(b) || b[i] != '{' {
		return nil, false
	}
	out := map[string]json.RawMessage{}
	i = skipWS(b, i+1)
	if i < len(b) && b[i] == '}' {
		return out, skipWS(b, i+1) == len(b)
	}
	for {
		if i >= len(b) || b[i] != '"' {
			return nil, false
		}
		ks := i
		if i = skipStr(b, i); i < 0 {
			return nil, false
		}
		key := b[ks+1 : i-1]
		if bytes.IndexByte(key, '\\') >= 0 {
			return nil, false
		}
		if i = skipWS(b, i); i >= len(b) || b[i] != ':' {
			return nil, false
		}
		vs := skipWS(b, i+1)
		if i = skipAny(b, vs); i < 0 {
			return nil, false
		}
		out[string(key)] = b[vs:i]
		if i = skipWS(b, i); i >= len(b) {
			return nil, false
		}
		switch b[i] {
		case ',':
			i = skipWS(b, i+1)
		case '}':
			return out, skipWS(b, i+1) == len(b)
		default:
			return nil, false
		}
	}
}

// splitArray returns the raw elements of a JSON array.
func splitArray(b []byte) ([]json.RawMessage, bool) {
	i := skipWS(b, 0)
	if i >= len(b) || b[i] != '[' {
		return nil, false
	}
	var out []json.RawMessage
	i = skipWS(b, i+1)
	if i < len(b) && b[i] == ']' {
		return out, skipWS(b, i+1) == len(b)
	}
	for {
		vs := i
		if i = skipAny(b, vs); i < 0 {
			return nil, false
		}
		out = append(out, b[vs:i])
		if i = skipWS(b, i); i >= len(b) {
			return nil, false
		}
		switch b[i] {
		case ',':
			i = skipWS(b, i+1)
		case ']':
			return out, skipWS(b, i+1) == len(b)
		default:
			return nil, false
		}
	}
}
