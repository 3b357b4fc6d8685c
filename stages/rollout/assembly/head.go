package assembly

import (
	"bytes"
	"encoding/json"
)

// scanHead reads the top-level "role" and "tool_calls" of a JSON object
// without decoding the rest, checking the object's structure on the way
// (balanced brackets, terminated strings, key/colon/value/comma order).
// ok is false for anything it cannot vouch for; callers then fall back to
// encoding/json, which also produces the error message. Routing needs only
// these two keys, and a session's messages add up to far more bytes than its
// tokens, so this runs at memory speed instead of encoding/json's.
func scanHead(b []byte) (role string, hasRole bool, toolCalls []byte, ok bool) {
	i := ws(b, 0)
	if i >= len(b) || b[i] != '{' {
		return "", false, nil, false
	}
	i = ws(b, i+1)
	if i < len(b) && b[i] == '}' {
		return "", false, nil, ws(b, i+1) == len(b)
	}
	for {
		if i >= len(b) || b[i] != '"' {
			return "", false, nil, false
		}
		ks := i
		if i = skipString(b, i); i < 0 {
			return "", false, nil, false
		}
		key := b[ks:i]
		if i = ws(b, i); i >= len(b) || b[i] != ':' {
			return "", false, nil, false
		}
		vs := ws(b, i+1)
		if i = skipValue(b, vs); i < 0 {
			return "", false, nil, false
		}
		switch string(key) {
		case `"role"`:
			v := b[vs:i]
			switch {
			case v[0] != '"':
				return "", false, nil, false // not a string: let encoding/json judge
			case bytes.IndexByte(v, '\\') < 0:
				role = internRole(v[1 : len(v)-1])
			default:
				var r string
				if json.Unmarshal(v, &r) != nil {
					return "", false, nil, false
				}
				role = r
			}
			hasRole = true
		case `"tool_calls"`:
			toolCalls = b[vs:i]
		}
		if i = ws(b, i); i >= len(b) {
			return "", false, nil, false
		}
		switch b[i] {
		case ',':
			i = ws(b, i+1)
		case '}':
			return role, hasRole, toolCalls, ws(b, i+1) == len(b)
		default:
			return "", false, nil, false
		}
	}
}

func ws(b []byte, i int) int {
	for i < len(b) && (b[i] == ' ' || b[i] == '\t' || b[i] == '\n' || b[i] == '\r') {
		i++
	}
	return i
}

// skipString returns the index after the string starting at b[i] ('"'), or -1.
func skipString(b []byte, i int) int { return SkipJSONString(b, i) }

// SkipJSONString returns the index after the JSON string starting at b[i]
// (a '"'), or -1 if it does not end. It jumps from quote to quote with the
// vectorized bytes.IndexByte, so long message texts cost memory bandwidth,
// not a loop per byte.
func SkipJSONString(b []byte, i int) int {
	for j := i + 1; ; {
		k := bytes.IndexByte(b[j:], '"')
		if k < 0 {
			return -1
		}
		q := j + k
		bs := 0 // backslashes right before the quote
		for p := q - 1; p > i && b[p] == '\\'; p-- {
			bs++
		}
		if bs%2 == 0 {
			return q + 1
		}
		j = q + 1
	}
}

// skipValue returns the index after the JSON value starting at b[i], or -1.
// Scalars are skipped by their extent, not checked character by character.
func skipValue(b []byte, i int) int {
	if i >= len(b) {
		return -1
	}
	switch b[i] {
	case '"':
		return skipString(b, i)
	case '{', '[':
		var stack [64]byte // closers expected; deeper nesting falls back
		depth := 0
		for ; i < len(b); i++ {
			switch c := b[i]; c {
			case '"':
				if i = skipString(b, i); i < 0 {
					return -1
				}
				i--
			case '{', '[':
				if depth == len(stack) {
					return -1
				}
				stack[depth] = c + 2 // '{'+2 = '}', '['+2 = ']'
				depth++
			case '}', ']':
				if depth == 0 || stack[depth-1] != c {
					return -1
				}
				depth--
				if depth == 0 {
					return i + 1
				}
			}
		}
		return -1
	}
	start := i
	for i < len(b) && b[i] != ',' && b[i] != '}' && b[i] != ']' && b[i] != ' ' && b[i] != '\n' && b[i] != '\t' && b[i] != '\r' {
		i++
	}
	if i == start {
		return -1
	}
	return i
}

// internRole returns the chat roles as constants, so reading a role
// allocates nothing; any other role is copied.
func internRole(b []byte) string {
	switch string(b) {
	case "user":
		return "user"
	case "assistant":
		return "assistant"
	case "system":
		return "system"
	case "tool":
		return "tool"
	case "developer":
		return "developer"
	}
	return string(b)
}
