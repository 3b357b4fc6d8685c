package assembly

import (
	"bytes"
	"encoding/json"

	"github.com/kilnrl/kiln/internal/ojson"
)

// Head is what routing reads of a chat message, its role and tool_calls,
// together with the message bytes it was read from. Only ScanMessage makes
// one. Record uses a Head (Turn.PromptHeads, Turn.ResponseHead) only for the
// very bytes it was read from (the same memory); any other message it
// reads itself. The zero Head describes no message.
type Head struct {
	raw     []byte
	role    string
	hasRole bool
	tc0, tc int // the tool_calls value is raw[tc0:tc]; tc == 0: absent
}

// For reports whether h was read from msg's bytes (the same memory).
func (h *Head) For(msg []byte) bool { return len(h.raw) > 0 && sameMemory(h.raw, msg) }

// At reports whether b[i:] begins with the bytes h was read from and if so
// returns what ScanMessage(b, i) would (the Head of that copy and the index
// after it) without scanning the copy: a comparison instead of a scan.
func (h *Head) At(b []byte, i int) (Head, int, bool) {
	n := len(h.raw)
	if n == 0 || !bytes.HasPrefix(b[i:], h.raw) {
		return Head{}, 0, false
	}
	c := *h
	c.raw = b[i : i+n : i+n]
	return c, i + n, true
}

// ScanMessage reads the JSON object that starts at b[i] (a '{') as scanHead
// does and returns its Head and the index after its closing brace. ok is
// false where scanHead would decline, and also where a top-level scalar
// value holds a '"', '{' or '[' (invalid JSON, which encoding/json rejects
// later): when ok, a splitter that counts brackets outside strings ends the
// element exactly at the closing brace, so the Head's bytes are the element
// such a splitter would cut.
func ScanMessage(b []byte, i int) (h Head, end int, ok bool) {
	role, hasRole, tc0, tc, end, plain, ok := scanObject(b, i)
	if !ok || !plain {
		return Head{}, 0, false
	}
	if tc > 0 {
		tc0, tc = tc0-i, tc-i
	}
	return Head{raw: b[i:end:end], role: role, hasRole: hasRole, tc0: tc0, tc: tc}, end, true
}

// scanHead reads the top-level "role" and "tool_calls" of a JSON object
// without decoding the rest, checking the object's structure on the way
// (balanced brackets, terminated strings, key/colon/value/comma order).
// ok is false for anything it cannot vouch for; callers then fall back to
// encoding/json, which also produces the error message. Routing needs only
// these two keys, and a session's messages add up to far more bytes than its
// tokens, so this runs at memory speed instead of encoding/json's.
// Measured side by side (issue 37): without it and the arena, streamed
// assembly of BenchmarkAssemble's 250 sessions went from 2.48x the copy of
// their tokens to 9.8x (goal <= 3x); without the arena alone, 4.45x (see Arena
// for the figures and the command).
func scanHead(b []byte) (role string, hasRole bool, toolCalls []byte, ok bool) {
	role, hasRole, tc0, tc, end, _, ok := scanObject(b, ojson.Space(b, 0))
	if !ok || ojson.Space(b, end) != len(b) {
		return "", false, nil, false
	}
	if tc > 0 {
		toolCalls = b[tc0:tc]
	}
	return role, hasRole, toolCalls, true
}

// scanObject is scanHead's reading of the object at b[i], up to the index
// after its closing brace (end), with the tool_calls value at b[tc0:tc]
// (tc == 0: absent). plain reports that no top-level scalar value holds a
// '"', '{' or '[' (ojson.Value takes scalars by extent).
func scanObject(b []byte, i int) (role string, hasRole bool, tc0, tc, end int, plain, ok bool) {
	if i >= len(b) || b[i] != '{' {
		return "", false, 0, 0, 0, false, false
	}
	plain = true
	i = ojson.Space(b, i+1)
	if i < len(b) && b[i] == '}' {
		return "", false, 0, 0, i + 1, true, true
	}
	for {
		if i >= len(b) || b[i] != '"' {
			return "", false, 0, 0, 0, false, false
		}
		ks := i
		if i = ojson.StringEnd(b, i); i < 0 {
			return "", false, 0, 0, 0, false, false
		}
		key := b[ks:i]
		if i = ojson.Space(b, i); i >= len(b) || b[i] != ':' {
			return "", false, 0, 0, 0, false, false
		}
		vs := ojson.Space(b, i+1)
		if i = ojson.ValueEnd(b, vs); i < 0 {
			return "", false, 0, 0, 0, false, false
		}
		if c := b[vs]; c != '"' && c != '{' && c != '[' && bytes.ContainsAny(b[vs:i], "\"{[") {
			plain = false
		}
		switch string(key) {
		case `"role"`:
			v := b[vs:i]
			switch {
			case v[0] != '"':
				return "", false, 0, 0, 0, false, false // not a string: let encoding/json judge
			case bytes.IndexByte(v, '\\') < 0:
				role = internRole(v[1 : len(v)-1])
			default:
				var r string
				if json.Unmarshal(v, &r) != nil {
					return "", false, 0, 0, 0, false, false
				}
				role = r
			}
			hasRole = true
		case `"tool_calls"`:
			tc0, tc = vs, i
		}
		if i = ojson.Space(b, i); i >= len(b) {
			return "", false, 0, 0, 0, false, false
		}
		switch b[i] {
		case ',':
			i = ojson.Space(b, i+1)
		case '}':
			return role, hasRole, tc0, tc, i + 1, plain, true
		default:
			return "", false, 0, 0, 0, false, false
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
