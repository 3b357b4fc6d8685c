package engine

import (
	"bytes"
	"encoding/binary"
	"encoding/json"
	"math"
	"strconv"
	"unsafe"

	"github.com/kilnrl/kiln/internal/agent/jsonskim"
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
	// The commas up to the list's first ']' bound the count (an id list
	// holds none before its end). Not the commas of all that follows: a
	// generate reply's token_ids come before its logprob entries, and the
	// array, kept as a turn's output ids, would be several times their
	// size.
	ids := dst[:0]
	end := bytes.IndexByte(b[from:], ']')
	if end < 0 {
		return nil, i, false
	}
	if most := bytes.Count(b[from:from+end], []byte{','}) + 1; cap(ids) >= most {
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
	if f, ok := decimal32(raw); ok {
		return f, true
	}
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

// decimal32 reads a plain JSON number — the -0.0123… and -1.2e-05 that
// vLLM writes for logprobs, one per sampled token — as
// float32(strconv.ParseFloat(b, 64)) without strconv, whose digit loop was
// most of a reply's parse. ok is false, and the caller uses strconv, for
// anything it does not settle exactly.
//
// Exactness: the value is computed in float64 from up to 19 significant
// digits with at most three roundings (the digits' conversion, a power of
// ten past 1e22, the scaling), so it lies within a few units in the last
// place of the decimal's exact value, as does ParseFloat's correctly
// rounded one. Rounding either to float32 drops the low 29 bits of the
// significand; the two agree unless a float32 rounding boundary (a halfway
// point, low bits 1<<28) lies between them, so a value whose low bits are
// within decimalSlack of that point is refused. Magnitudes outside
// float32's normal range are refused too: there the boundary moves.
func decimal32(b []byte) (float32, bool) {
	f, n, ok := decimal32Prefix(b)
	return f, ok && n == len(b)
}

// decimal32Prefix is decimal32 for the number that begins b: it returns
// the number's length too, and leaves what follows to the caller.
func decimal32Prefix(b []byte) (_ float32, n int, ok bool) {
	i, neg := 0, false
	if i < len(b) && b[i] == '-' {
		neg = true
		i++
	}
	// m holds the first 19 significant digits, scaled by 10^exp; digits
	// past them are dropped (an error under 1e-18 of the value, far inside
	// decimalSlack; a dropped integer digit still scales m by ten).
	const full = 1e18 // m has 19 digits from here
	var m uint64
	exp := 0
	start := i
	for ; i < len(b) && b[i] >= '0' && b[i] <= '9'; i++ {
		if m < full {
			m = m*10 + uint64(b[i]-'0')
		} else {
			exp++
		}
	}
	if i == start || (b[start] == '0' && i-start > 1) {
		return 0, 0, false // no digits, or a leading zero JSON forbids
	}
	if i < len(b) && b[i] == '.' {
		i++
		frac := i
		for {
			if m < 1e11 && i+8 <= len(b) { // eight more digits fit in m
				if v, ok := eightDigits(b[i:]); ok {
					m, exp, i = m*1e8+v, exp-8, i+8
					continue
				}
			}
			if i >= len(b) || b[i] < '0' || b[i] > '9' {
				break
			}
			if m < full {
				m, exp = m*10+uint64(b[i]-'0'), exp-1
			}
			i++
		}
		if i == frac {
			return 0, 0, false
		}
	}
	if i < len(b) && (b[i] == 'e' || b[i] == 'E') {
		i++
		eneg := false
		if i < len(b) && (b[i] == '+' || b[i] == '-') {
			eneg = b[i] == '-'
			i++
		}
		e, digits := 0, i
		for i < len(b) && b[i] >= '0' && b[i] <= '9' && i-digits < 3 {
			e = e*10 + int(b[i]-'0')
			i++
		}
		if i == digits {
			return 0, 0, false
		}
		if eneg {
			e = -e
		}
		exp += e
	}
	if m == 0 {
		if neg {
			return float32(math.Copysign(0, -1)), i, true
		}
		return 0, i, true
	}
	f := float64(m)
	switch {
	case exp == 0:
	case exp > 0 && exp <= 22:
		f *= pow10[exp]
	case exp < 0 && exp >= -22:
		f /= pow10[-exp]
	case exp > 22 && exp <= 44:
		f *= 1e22 * pow10[exp-22]
	case exp < -22 && exp >= -44:
		f /= 1e22 * pow10[-exp-22]
	default:
		return 0, 0, false
	}
	if f < 0x1p-126 || f > 0x1p127 {
		return 0, 0, false
	}
	if low := int64(math.Float64bits(f) & (1<<29 - 1)); low > 1<<28-decimalSlack && low < 1<<28+decimalSlack {
		return 0, 0, false
	}
	if neg {
		f = -f
	}
	return float32(f), i, true
}

// decimalSlack is how near a float32 rounding boundary (in float64 units
// in the last place) decimal32 still trusts its value: well over the few
// units its roundings can add up to.
const decimalSlack = 64

// eightDigits reads b[:8] as a decimal number if all eight are digits,
// eight at a time (the fraction of a logprob runs to 16 or 17 digits).
func eightDigits(b []byte) (uint64, bool) {
	u := binary.LittleEndian.Uint64(b)
	if (u&0xF0F0F0F0F0F0F0F0)|(((u+0x0606060606060606)&0xF0F0F0F0F0F0F0F0)>>4) != 0x3333333333333333 {
		return 0, false
	}
	u -= 0x3030303030303030
	u = u*10 + u>>8 // pairs of digits, in every other byte
	u = ((u&0x000000FF000000FF)*(100+1000000<<32) + (u>>16&0x000000FF000000FF)*(1+10000<<32)) >> 32
	return u, true
}

// pow10 holds the powers of ten float64 represents exactly.
var pow10 = [23]float64{1e0, 1e1, 1e2, 1e3, 1e4, 1e5, 1e6, 1e7, 1e8, 1e9, 1e10,
	1e11, 1e12, 1e13, 1e14, 1e15, 1e16, 1e17, 1e18, 1e19, 1e20, 1e21, 1e22}
