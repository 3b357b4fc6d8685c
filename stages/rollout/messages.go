package rollout

import (
	"bytes"
	"encoding/json"
	"fmt"
	"unsafe"

	"github.com/kilnrl/kiln/stages/rollout/jsonskim"
)

// messageSplitter splits a session's prompt_messages (a JSON array per
// turn) into messages. Consecutive turns usually resend the previous
// history plus new messages, so when a turn's text extends the previous
// turn's array, only the new tail is scanned: a session costs time linear in
// its final history, not quadratic.
type messageSplitter struct {
	prev []byte
	msgs []json.RawMessage
}

func (s *messageSplitter) split(str string) ([]json.RawMessage, error) {
	// The messages alias str's bytes without copying them (a session's
	// histories add up to far more bytes than its tokens); nothing writes
	// to a message.
	text := bytes.TrimSpace(stringBytes(str))
	if n := len(s.prev); n > 2 && len(text) > n && text[n-1] == ',' && bytes.Equal(text[:n-1], s.prev[:n-1]) {
		// Appending in place is safe: earlier turns' slices never see
		// elements past their own length.
		if msgs, ok := splitElements(text, n, s.msgs); ok {
			s.prev, s.msgs = text, msgs
			return msgs, nil
		}
	}
	msgs, ok := splitArray(text)
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

// splitArray splits the text of a JSON array into its elements' text
// without decoding them. It checks structure (brackets, strings, commas),
// not the elements' grammar: each message is decoded later anyway.
func splitArray(b []byte) ([]json.RawMessage, bool) {
	i := jsonskim.Space(b, 0)
	if i >= len(b) || b[i] != '[' {
		return nil, false
	}
	i = jsonskim.Space(b, i+1)
	if i < len(b) && b[i] == ']' {
		return nil, jsonskim.Space(b, i+1) == len(b)
	}
	return splitElements(b, i, nil)
}

// splitElements appends to out the array elements starting at b[i] (the
// first element, or whitespace before it) up to the closing ']', which must
// end b.
func splitElements(b []byte, i int, out []json.RawMessage) ([]json.RawMessage, bool) {
	i = jsonskim.Space(b, i)
	for {
		start := i
		depth := 0
	value:
		for ; i < len(b); i++ {
			switch b[i] {
			case '"':
				if i = jsonskim.String(b, i); i < 0 {
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
			return out, jsonskim.Space(b, i+1) == len(b)
		}
		i = jsonskim.Space(b, i+1) // past ','
	}
}

// stringBytes is str's bytes without a copy. Nothing may write to them: the
// turn records' strings are immutable, and assembly only reads messages.
func stringBytes(str string) []byte {
	return unsafe.Slice(unsafe.StringData(str), len(str))
}
