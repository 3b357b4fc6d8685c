package engine

import (
	"bytes"
	"encoding/json"
	"math"
	"strconv"
	"unsafe"
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

// structural classifies the bytes skipAny stops at inside containers:
// '"' opens a string, '[' any opening bracket, ']' any closing one.
var structural = [256]byte{'"': '"', '{': '[', '[': '[', '}': ']', ']': ']'}

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
		if b[i] == '[' {
			// A flat array of scalars (an id list: the large values of
			// engine replies) ends at its first ']' when nothing before that
			// opens a string or a container; vectorized byte searches find
			// both.
			if k := bytes.IndexByte(b[i+1:], ']'); k >= 0 {
				seg := b[i+1 : i+1+k]
				if bytes.IndexByte(seg, '"') < 0 && bytes.IndexByte(seg, '[') < 0 && bytes.IndexByte(seg, '{') < 0 && bytes.IndexByte(seg, '}') < 0 {
					return i + 2 + k
				}
			}
		}
		depth := 0
		for ; i < len(b); i++ {
			c := structural[b[i]]
			if c == 0 {
				continue
			}
			switch c {
			case '"':
				if i = skipStr(b, i); i < 0 {
					return -1
				}
				i--
			case '[':
				depth++
			case ']':
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

// eachField calls fn with every key (without escapes) and raw value of the
// JSON object b, in order, without allocating; fn returns false to stop
// early. ok is false when b is not a plain object (structure only, scalars by
// extent) or a key holds an escape.
func eachField(b []byte, fn func(key, val []byte) bool) bool {
	i := skipWS(b, 0)
	if i >= len(b) || b[i] != '{' {
		return false
	}
	i = skipWS(b, i+1)
	if i < len(b) && b[i] == '}' {
		return skipWS(b, i+1) == len(b)
	}
	for {
		if i >= len(b) || b[i] != '"' {
			return false
		}
		ks := i
		if i = skipStr(b, i); i < 0 {
			return false
		}
		key := b[ks+1 : i-1]
		if bytes.IndexByte(key, '\\') >= 0 {
			return false
		}
		if i = skipWS(b, i); i >= len(b) || b[i] != ':' {
			return false
		}
		vs := skipWS(b, i+1)
		if i = skipAny(b, vs); i < 0 {
			return false
		}
		if !fn(key, b[vs:i]) {
			return false
		}
		if i = skipWS(b, i); i >= len(b) {
			return false
		}
		switch b[i] {
		case ',':
			i = skipWS(b, i+1)
		case '}':
			return skipWS(b, i+1) == len(b)
		default:
			return false
		}
	}
}

// eachElem calls fn with every raw element of the JSON array b, in order,
// without allocating; fn returns false to stop early. ok is false when b is
// not an array (structure only).
func eachElem(b []byte, fn func(val []byte) bool) bool {
	i := skipWS(b, 0)
	if i >= len(b) || b[i] != '[' {
		return false
	}
	i = skipWS(b, i+1)
	if i < len(b) && b[i] == ']' {
		return skipWS(b, i+1) == len(b)
	}
	for {
		vs := i
		if i = skipAny(b, vs); i < 0 {
			return false
		}
		if !fn(b[vs:i]) {
			return false
		}
		if i = skipWS(b, i); i >= len(b) {
			return false
		}
		switch b[i] {
		case ',':
			i = skipWS(b, i+1)
		case ']':
			return skipWS(b, i+1) == len(b)
		default:
			return false
		}
	}
}

// splitObject returns the raw values of a JSON object's top-level keys
// (keys without escapes only; duplicates: the last wins, as encoding/json).
// ok is false when the structure is not a plain object.
func splitObject(b []byte) (map[string]json.RawMessage, bool) {
	out := map[string]json.RawMessage{}
	ok := eachField(b, func(key, val []byte) bool {
		out[string(key)] = val
		return true
	})
	if !ok {
		return nil, false
	}
	return out, true
}

// splitArray returns the raw elements of a JSON array.
func splitArray(b []byte) ([]json.RawMessage, bool) {
	var out []json.RawMessage
	ok := eachElem(b, func(val []byte) bool {
		out = append(out, val)
		return true
	})
	if !ok {
		return nil, false
	}
	return out, true
}

// fieldsInto stores the values of the JSON object b whose keys match dst's
// names exactly (the last duplicate wins, as in encoding/json). ok is false
// for anything the fast path does not take: bad structure, or a key that
// matches a name only case-insensitively (encoding/json would take it).
func fieldsInto(b []byte, names []string, dst []json.RawMessage) bool {
	for i := range dst {
		dst[i] = nil
	}
	return eachField(b, func(key, val []byte) bool {
		for i, n := range names {
			if string(key) == n {
				dst[i] = val
				return true
			}
		}
		for _, n := range names {
			if bytes.EqualFold(key, []byte(n)) {
				return false
			}
		}
		return true
	})
}

// parseUint32 reads a JSON non-negative int32 without allocating.
func parseUint32(raw []byte) (int32, bool) {
	t := bytes.TrimSpace(raw)
	v, end, ok := scanUint(t, 0)
	if !ok || end != len(t) || v > math.MaxInt32 {
		return 0, false
	}
	return int32(v), true
}

// parseFinite32 reads a JSON number that is finite as a float32.
func parseFinite32(raw []byte) (float32, bool) {
	t := bytes.TrimSpace(raw)
	if len(t) == 0 || !(t[0] == '-' || (t[0] >= '0' && t[0] <= '9')) {
		return 0, false
	}
	f, err := strconv.ParseFloat(unsafe.String(&t[0], len(t)), 64)
	if err != nil || math.IsNaN(f) || math.IsInf(f, 0) || math.IsInf(float64(float32(f)), 0) {
		return 0, false
	}
	return float32(f), true
}
