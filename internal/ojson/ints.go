package ojson

import (
	"bytes"
	"math"
)

// DecodeInts reads b, one JSON value (white space around it aside), as
// encoding/json's Unmarshal reads it into a nil []int, and reports whether
// Unmarshal would have succeeded: null gives (nil, true), an array a
// non-nil slice (empty for []) whose null elements read as 0; an element
// that is not an integer literal in int's range (a fraction, an exponent,
// a string, a bool, a container), or text that is not JSON, gives false.
// It reads the array where it stands, without encoding/json's reflection
// per element: that was half of the scripted engine's CPU reading prompt
// ids (docs/rollout.md §6.2; BenchmarkDecodeInts: ÷unmarshal).
func DecodeInts(b []byte) ([]int, bool) {
	i := Space(b, 0)
	if bytes.HasPrefix(b[i:], []byte("null")) {
		return nil, Space(b, i+4) == len(b)
	}
	if i >= len(b) || b[i] != '[' {
		return nil, false
	}
	ids := make([]int, 0, bytes.Count(b[i:], []byte{','})+1)
	// WalkArray's grammar in one loop of its own, without a call per
	// element: prompts are thousands of short numbers.
	if i = Space(b, i+1); i < len(b) && b[i] == ']' {
		return ids, Space(b, i+1) == len(b)
	}
	for {
		if i < len(b) && b[i] == 'n' {
			if !bytes.HasPrefix(b[i:], []byte("null")) {
				return nil, false
			}
			ids, i = append(ids, 0), i+4
		} else {
			n, e := intAt(b, i)
			if e < 0 {
				return nil, false
			}
			ids, i = append(ids, n), e
		}
		if i < len(b) && b[i] == ',' { // the common case: no space
			i = Space(b, i+1)
			continue
		}
		if i = Space(b, i); i >= len(b) {
			return nil, false
		}
		switch b[i] {
		case ',':
			i = Space(b, i+1)
		case ']':
			return ids, Space(b, i+1) == len(b)
		default:
			return nil, false // what follows a number ('.', 'e', a digit after 0) makes it no integer
		}
	}
}

// intAt reads the JSON integer literal at b[i] (an optional '-', then 0 or
// digits without a leading zero) and returns it and the index after it,
// or -1 when there is none there or it overflows int. The caller checks
// what follows: a '.', 'e' or digit there makes the literal no integer.
func intAt(b []byte, i int) (int, int) {
	neg := i < len(b) && b[i] == '-'
	if neg {
		i++
	}
	start := i
	var u uint64
	limit := uint64(math.MaxInt)
	if neg {
		limit++ // -MinInt
	}
	for i < len(b) && b[i] >= '0' && b[i] <= '9' {
		if i > start && b[start] == '0' {
			return 0, -1 // a leading zero: not JSON
		}
		d := uint64(b[i] - '0')
		if u > (limit-d)/10 {
			return 0, -1
		}
		u = u*10 + d
		i++
	}
	if i == start {
		return 0, -1
	}
	if neg {
		return int(-u), i // -(1<<63) wraps to MinInt, as intended
	}
	return int(u), i
}
