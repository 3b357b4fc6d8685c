package assembly

import (
	"bytes"
	"encoding/json"

	"github.com/kilnrl/kiln/stages/rollout/jsonskim"
)

// scanHead reads the top-level "role" and "tool_calls" of a JSON object
// without decoding the rest, checking the object's structure on the way
// (balanced brackets, terminated strings, key/colon/value/comma order).
// ok is false for anything it cannot vouch for; callers then fall back to
// encoding/json, which also produces the error message. Routing needs only
// these two keys, and a session's messages add up to far more bytes than its
// tokens, so this runs at memory speed instead of encoding/json's.
func scanHead(b []byte) (role string, hasRole bool, toolCalls []byte, ok bool) {
	i := jsonskim.Space(b, 0)
	if i >= len(b) || b[i] != '{' {
		return "", false, nil, false
	}
	i = jsonskim.Space(b, i+1)
	if i < len(b) && b[i] == '}' {
		return "", false, nil, jsonskim.Space(b, i+1) == len(b)
	}
	for {
		if i >= len(b) || b[i] != '"' {
			return "", false, nil, false
		}
		ks := i
		if i = jsonskim.String(b, i); i < 0 {
			return "", false, nil, false
		}
		key := b[ks:i]
		if i = jsonskim.Space(b, i); i >= len(b) || b[i] != ':' {
			return "", false, nil, false
		}
		vs := jsonskim.Space(b, i+1)
		if i = jsonskim.Value(b, vs); i < 0 {
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
		if i = jsonskim.Space(b, i); i >= len(b) {
			return "", false, nil, false
		}
		switch b[i] {
		case ',':
			i = jsonskim.Space(b, i+1)
		case '}':
			return role, hasRole, toolCalls, jsonskim.Space(b, i+1) == len(b)
		default:
			return "", false, nil, false
		}
	}
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
