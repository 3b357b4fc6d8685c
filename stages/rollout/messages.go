package rollout

import (
	"bytes"
	"encoding/json"
	"fmt"
	"unsafe"
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
	text := bytes.TrimSpace(unsafe.Slice(unsafe.StringData(str), len(str)))
	if n := len(s.prev); n > 2 && len(text) > n && bytes.HasPrefix(text, s.prev[:n-1]) && text[n-1] == ',' {
		if tail, ok := splitArray(append([]byte{'['}, text[n:]...)); ok {
			msgs := append(s.msgs[:len(s.msgs):len(s.msgs)], tail...)
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
	i := skipSpace(b, 0)
	if i >= len(b) || b[i] != '[' {
		return nil, false
	}
	i = skipSpace(b, i+1)
	var out []json.RawMessage
	if i < len(b) && b[i] == ']' {
		return out, skipSpace(b, i+1) == len(b)
	}
	for {
		start := i
		depth := 0
	value:
		for ; i < len(b); i++ {
			switch b[i] {
			case '"':
				for i++; i < len(b) && b[i] != '"'; i++ {
					if b[i] == '\\' {
						i++
					}
				}
				if i >= len(b) {
					return nil, false
				}
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
			return out, skipSpace(b, i+1) == len(b)
		}
		i = skipSpace(b, i+1) // past ','
	}
}

func skipSpace(b []byte, i int) int {
	for i < len(b) && (b[i] == ' ' || b[i] == '\t' || b[i] == '\n' || b[i] == '\r') {
		i++
	}
	return i
}
