package assembly

import (
	"bytes"
	"encoding/json"
	"fmt"

	"github.com/kilnrl/kiln/internal/ojson"
)

// Splitter splits a session's prompt_messages (a JSON array per turn) into
// the messages of Turn.PromptMessages. Consecutive turns usually resend the
// previous history plus new messages, so when a turn's text extends the
// previous turn's array, only the new tail is split: a session costs time
// linear in its final history, not quadratic. A Splitter serves one
// session, one turn after another.
//
// Why not encoding/json (json.Unmarshal of each turn's new tail into
// []json.RawMessage, the text having been validated when its turn was
// read): kiln-rollout assemble --turns-jsonl on the 198 MB file of
// BenchmarkAssembleJSONL, 24 alternating rounds of the built binaries,
// 2026-12-05, quiet 2-core VM: median 0.33 s wall with this splitter,
// 0.35 s with json.Unmarshal (+6%, paired ratios 0.81-1.16). Command (the
// binaries timed with /usr/bin/time on the benchmark's file):
//
//	KILN_BENCH_TURNS_SESSIONS=20 go test ./stages/rollout -run '^$' -bench AssembleJSONL -benchtime 1x -timeout 30m
type Splitter struct {
	prev []byte
	msgs []json.RawMessage
	// capHint, if set, is the capacity of a list split from scratch: the
	// messages a session is expected to reach, so the turns that extend the
	// list in place do not regrow it (each regrowth copies it).
	capHint int
}

// NewSplitter returns a Splitter for a session's turns whose lists hold up
// to about n messages.
func NewSplitter(n int) *Splitter { return &Splitter{capHint: n} }

// Split splits the next turn's prompt_messages text into its messages; an
// error (encoding/json's) says why text is not a JSON array. The messages
// alias text without copying it (a session's histories add up to far more
// bytes than its tokens): nothing may write to text while they are in use,
// and nothing writes to a message. Earlier turns' lists stay as they were.
func (s *Splitter) Split(text []byte) ([]json.RawMessage, error) {
	// The extension path trims only leading white space: splitting checks
	// what follows the closing ']', and reading the text's far end before
	// its start would cost a cache miss per turn. s.prev is trimmed at both
	// ends, so its last byte is the closing ']'.
	if n := len(s.prev); n > 2 {
		ext := text[ojson.Space(text, 0):]
		if len(ext) > n && ext[n-1] == ',' && bytes.Equal(ext[:n-1], s.prev[:n-1]) {
			// Appending in place is safe: earlier turns' slices never see
			// elements past their own length.
			if msgs, ok := splitElements(ext, n, s.msgs); ok {
				s.prev, s.msgs = trimRightSpace(ext), msgs
				return msgs, nil
			}
		}
	}
	text = bytes.TrimSpace(text)
	var out []json.RawMessage
	if s.capHint > 0 {
		out = make([]json.RawMessage, 0, s.capHint)
	}
	msgs, ok := appendArray(out, text)
	if !ok {
		// Let encoding/json say what is wrong.
		var v []json.RawMessage
		if err := json.Unmarshal(text, &v); err != nil {
			return nil, fmt.Errorf("prompt_messages: %w", err)
		}
		msgs = v
	}
	s.prev, s.msgs = text, msgs
	return msgs, nil
}

// trimRightSpace is b without trailing JSON white space.
func trimRightSpace(b []byte) []byte {
	n := len(b)
	for n > 0 && (b[n-1] == ' ' || b[n-1] == '\t' || b[n-1] == '\n' || b[n-1] == '\r') {
		n--
	}
	return b[:n]
}

// splitArray splits the text of a JSON array into its elements' text
// without decoding them. It checks structure (brackets, strings, commas),
// not the elements' grammar: each message is decoded later anyway.
func splitArray(b []byte) ([]json.RawMessage, bool) {
	return appendArray(nil, b)
}

// appendArray is splitArray appending the elements to out.
func appendArray(out []json.RawMessage, b []byte) ([]json.RawMessage, bool) {
	i := ojson.Space(b, 0)
	if i >= len(b) || b[i] != '[' {
		return nil, false
	}
	i = ojson.Space(b, i+1)
	if i < len(b) && b[i] == ']' {
		return out, ojson.Space(b, i+1) == len(b)
	}
	return splitElements(b, i, out)
}

// splitElements appends to out the array elements starting at b[i] (the
// first element, or whitespace before it) up to the closing ']', which must
// end b. An element ends at the first ',', '}' or ']' outside strings where
// the brackets counted from its start balance.
func splitElements(b []byte, i int, out []json.RawMessage) ([]json.RawMessage, bool) {
	i = ojson.Space(b, i)
	for {
		start := i
		depth := 0
	value:
		for ; i < len(b); i++ {
			switch b[i] {
			case '"':
				if i = ojson.StringEnd(b, i); i < 0 {
					return nil, false
				}
				i-- // at the closing quote
			case '{', '[':
				depth++
			case '}', ']':
				if depth == 0 {
					break value
				}
				depth--
			case ',':
				if depth == 0 {
					break value
				}
			}
		}
		if i >= len(b) || depth != 0 {
			return nil, false
		}
		elem := bytes.TrimSpace(b[start:i])
		if len(elem) == 0 {
			return nil, false
		}
		out = append(out, elem)
		if b[i] == ']' {
			return out, ojson.Space(b, i+1) == len(b)
		}
		i = ojson.Space(b, i+1) // past ','
	}
}
