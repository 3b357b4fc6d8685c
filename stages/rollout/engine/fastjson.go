package engine

import (
	"bytes"
	"encoding/json"
	"math"
	"strconv"
	"unsafe"

	"github.com/kilnrl/kiln/stages/rollout/jsonskim"
)

// scanTokenize reads a /tokenize reply's "tokens", "count" and
// "max_model_len" without encoding/json: prompt id lists are the largest
// thing the adapter reads on every turn (thousands of ids, twice a turn).
// ok is false for anything unexpected; callers then use encoding/json,
// which also produces the error message.
func scanTokenize(b []byte, memo *Memo) (tokens []int32, count int, hasCount bool, maxLen int, ok bool) {
	i := jsonskim.Space(b, 0)
	if i >= len(b) || b[i] != '{' {
		return nil, 0, false, 0, false
	}
	i = jsonskim.Space(b, i+1)
	if i < len(b) && b[i] == '}' {
		return nil, 0, false, 0, false // no tokens: let the slow path report it
	}
	for {
		if i >= len(b) || b[i] != '"' {
			return nil, 0, false, 0, false
		}
		ks := i
		if i = jsonskim.String(b, i); i < 0 {
			return nil, 0, false, 0, false
		}
		key := b[ks:i]
		if i = jsonskim.Space(b, i); i >= len(b) || b[i] != ':' {
			return nil, 0, false, 0, false
		}
		i = jsonskim.Space(b, i+1)
		switch string(key) {
		case `"tokens"`:
			var good bool
			if tokens, i, good = memo.scan(b, i); !good {
				return nil, 0, false, 0, false
			}
		case `"count"`, `"max_model_len"`:
			n, j, good := scanUint(b, i)
			if !good {
				if j = jsonskim.Value(b, i); j < 0 || string(b[i:j]) != "null" {
					return nil, 0, false, 0, false
				}
			} else if string(key) == `"count"` {
				count, hasCount = n, true
			} else {
				maxLen = n
			}
			i = j
		default:
			if i = jsonskim.Value(b, i); i < 0 {
				return nil, 0, false, 0, false
			}
		}
		if i = jsonskim.Space(b, i); i >= len(b) {
			return nil, 0, false, 0, false
		}
		switch b[i] {
		case ',':
			i = jsonskim.Space(b, i+1)
		case '}':
			if jsonskim.Space(b, i+1) != len(b) || tokens == nil {
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
	return scanIDsFrom(nil, b, i, i)
}

// scanIDsFrom parses the ids of the array at b[i] that come after
// b[from]: from == i for all of them, else the index just after one of its
// commas (the ids before it are the caller's, Memo's). The ids go into
// dst's array when it has room.
func scanIDsFrom(dst []int32, b []byte, i, from int) ([]int32, int, bool) {
	if i >= len(b) || b[i] != '[' {
		return nil, i, false
	}
	// Each id takes at least two bytes ("n,"), which bounds the count.
	ids := dst[:0]
	if most := bytes.Count(b[from:], []byte{','}) + 1; cap(ids) >= most {
		ids = ids[:most]
	} else {
		ids = make([]int32, most)
	}
	n := 0
	if from > i {
		i = jsonskim.Space(b, from)
	} else if i = jsonskim.Space(b, i+1); i < len(b) && b[i] == ']' {
		return ids[:0], i + 1, true
	}
	for n < len(ids) {
		// The digits of one id, inline: this loop reads every prompt id
		// the engine renders. More than 10 digits, a value past int32, a
		// leading zero, a sign, a fraction or an exponent is refused.
		j := i
		var v uint64
		for ; j < len(b); j++ {
			d := b[j] - '0'
			if d > 9 {
				break
			}
			v = v*10 + uint64(d)
		}
		if j == i || j-i > 10 || v > math.MaxInt32 || (b[i] == '0' && j-i > 1) || j >= len(b) {
			return nil, i, false
		}
		ids[n] = int32(v)
		n++
		switch b[j] {
		case ',':
			i = j + 1
			if i < len(b) && b[i] <= ' ' {
				i = jsonskim.Space(b, i)
			}
			continue
		case ']':
			return ids[:n], j + 1, true
		}
		if i = jsonskim.Space(b, j); i >= len(b) {
			return nil, i, false
		}
		switch b[i] {
		case ',':
			i = jsonskim.Space(b, i+1)
		case ']':
			return ids[:n], i + 1, true
		default:
			return nil, i, false
		}
	}
	return nil, i, false
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

// eachField is jsonskim.EachField refusing keys with escapes: keys are
// matched by their raw text.
func eachField(b []byte, fn func(key, val []byte) bool) bool {
	return jsonskim.EachField(b, func(k, v []byte) bool { return bytes.IndexByte(k, '\\') < 0 && fn(k, v) })
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
	ok := jsonskim.EachElem(b, func(val []byte) bool {
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

// scanDetokenize reads a /detokenize reply's "prompt" string as
// encoding/json would (jsonskim.Unquote: a model's output is full of \n and
// \" escapes). ok is false for anything else, and the caller then uses
// encoding/json, which also words the error.
func scanDetokenize(b []byte) (text string, ok bool) {
	found := false
	end := jsonskim.Object(b, jsonskim.Space(b, 0), func(key []byte, v int) int {
		e := jsonskim.Value(b, v)
		switch {
		case e < 0:
			return -1
		case string(key) == "prompt":
			if found {
				return -1
			}
			var ok bool
			if text, ok = jsonskim.Unquote(b[v:e]); !ok {
				return -1
			}
			found = true
		case bytes.IndexByte(key, '\\') >= 0 || foldsTo(key, "prompt"):
			return -1
		}
		return e
	})
	if end < 0 || jsonskim.Space(b, end) != len(b) || !found {
		return "", false
	}
	return text, true
}

// usageCounts is what checkUsage reads of a usage object.
type usageCounts struct {
	fields     bool // the object has a field (it is not {})
	completion int  // 0 when absent or null
	prompt     int  // -1 when absent or null
	cached     int  // prompt_tokens_details.cached_tokens; -1 when absent or null
}

// scanUsage reads a usage object as vLLM writes it — every value a
// non-negative integer or null, every key printable ASCII without escapes
// — without encoding/json's map. ok is false for anything else, and the
// caller decodes it with usageJSON; for what it accepts, usageJSON gives
// the same counts (duplicate keys: the last wins; a prompt_tokens_details
// that is null or a number has no cached tokens).
func scanUsage(raw []byte) (u usageCounts, ok bool) {
	u.prompt, u.cached = -1, -1
	i := jsonskim.Space(raw, 0)
	if i >= len(raw) || raw[i] != '{' {
		return u, false
	}
	end := jsonskim.Object(raw, i, func(key []byte, v int) int {
		for _, c := range key {
			if c < 0x20 || c >= 0x7f || c == '\\' {
				return -1
			}
		}
		u.fields = true
		val, e := -1, -1
		if bytes.HasPrefix(raw[v:], []byte("null")) {
			e = v + 4
		} else if x, j, ok := scanUint(raw, v); ok {
			val, e = x, j
		} else {
			return -1
		}
		switch string(key) {
		case "completion_tokens":
			u.completion = max(val, 0)
		case "prompt_tokens":
			u.prompt = val
		}
		return e
	})
	return u, end >= 0 && jsonskim.Space(raw, end) == len(raw)
}
