package assembly

import (
	"bytes"
	"encoding/json"
	"fmt"

	"github.com/kilnrl/kiln/internal/ojson"
)

// Splitter splits a session's prompt_messages (a JSON array per turn) into
// the messages of Turn.PromptMessages and their heads (Turn.PromptHeads).
// Consecutive turns usually resend the previous history plus new messages,
// so when a turn's text extends the previous turn's array, only the new
// tail is scanned: a session costs time linear in its final history, not
// quadratic.
//
// Each message that is a JSON object is read by ScanMessage as it is cut,
// and its Head goes with it (Record then does not read it again); a message
// whose text is that of the Head given to Expect (the previous turn's
// response, which the client echoes) is cut by comparing its bytes instead
// of scanning them. A Splitter serves one session, one turn after another.
type Splitter struct {
	prev  []byte
	msgs  []json.RawMessage
	heads []Head // parallel to msgs; zero where not read
	// hint, if set, is a message expected at the start of the next turn's
	// new messages (the previous turn's response_message).
	hint Head
	// capHint, if set, is the capacity of a list split from scratch: the
	// messages a session is expected to reach, so the turns that extend the
	// list in place do not regrow it (each regrowth copies it).
	capHint int
	// spare and spareHeads, if set, are the storage of the next list split
	// from scratch (as Session.MessageLists hands it out, recycled from
	// session to session), used once; otherwise a list is allocated.
	spare      []json.RawMessage
	spareHeads []Head
}

// NewSplitter returns a Splitter for sess's turns whose lists hold up to
// about n messages: its first list is the pair sess.MessageLists(n) hands
// out, so a stream of sessions with an Arena reuses it.
func NewSplitter(sess *Session, n int) *Splitter {
	s := &Splitter{capHint: n}
	s.spare, s.spareHeads = sess.MessageLists(n)
	return s
}

// Expect tells the splitter that the next turn's new messages likely begin
// with the message h was read from (the turn's response, which a client
// echoes); a zero Head expects nothing.
func (s *Splitter) Expect(h Head) { s.hint = h }

// Split splits the next turn's prompt_messages text into its messages and
// their heads (a zero Head for a message it did not read); an error
// (encoding/json's) says why text is not a JSON array. The messages alias
// text without copying it (a session's histories add up to far more bytes
// than its tokens): nothing may write to text while they are in use, and
// nothing writes to a message. Earlier turns' lists stay as they were.
func (s *Splitter) Split(text []byte) ([]json.RawMessage, []Head, error) {
	// The extension path trims only leading white space: splitting checks
	// what follows the closing ']', and reading the text's far end before
	// its start would cost a cache miss per turn. s.prev is trimmed at both
	// ends, so its last byte is the closing ']'.
	if n := len(s.prev); n > 2 {
		ext := text[ojson.Space(text, 0):]
		if len(ext) > n && ext[n-1] == ',' && bytes.Equal(ext[:n-1], s.prev[:n-1]) {
			// Appending in place is safe: earlier turns' slices never see
			// elements past their own length.
			if msgs, heads, ok := splitElements(ext, n, s.msgs, s.heads, &s.hint); ok {
				s.prev, s.msgs, s.heads = trimRightSpace(ext), msgs, heads
				return msgs, heads, nil
			}
		}
	}
	text = bytes.TrimSpace(text)
	var out []json.RawMessage
	var heads []Head
	switch {
	case s.spare != nil:
		out, heads, s.spare, s.spareHeads = s.spare[:0], s.spareHeads[:0], nil, nil
	case s.capHint > 0:
		out, heads = make([]json.RawMessage, 0, s.capHint), make([]Head, 0, s.capHint)
	}
	msgs, heads, ok := appendArray(out, heads, text, &s.hint)
	if !ok {
		// Let encoding/json say what is wrong.
		var v []json.RawMessage
		if err := json.Unmarshal(text, &v); err != nil {
			return nil, nil, fmt.Errorf("prompt_messages: %w", err)
		}
		msgs, heads = v, make([]Head, len(v)) // none read
	}
	s.prev, s.msgs, s.heads = text, msgs, heads
	return msgs, heads, nil
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
	msgs, _, ok := appendArray(nil, nil, b, nil)
	return msgs, ok
}

// appendArray is splitArray appending the elements to out and their heads
// to heads (see splitElements).
func appendArray(out []json.RawMessage, heads []Head, b []byte, hint *Head) ([]json.RawMessage, []Head, bool) {
	i := ojson.Space(b, 0)
	if i >= len(b) || b[i] != '[' {
		return nil, nil, false
	}
	i = ojson.Space(b, i+1)
	if i < len(b) && b[i] == ']' {
		return out, heads, ojson.Space(b, i+1) == len(b)
	}
	return splitElements(b, i, out, heads, hint)
}

// splitElements appends to out the array elements starting at b[i] (the
// first element, or whitespace before it) up to the closing ']', which must
// end b, and to heads their heads: what ScanMessage read of an
// element that is a JSON object it vouches for, a zero Head for any other.
//
// An element ends at the first ',', '}' or ']' outside strings where the
// brackets counted from its start balance. For an object ScanMessage
// accepts, that is the first such byte after its closing brace (see
// ScanMessage), so those elements are cut where ScanMessage ends; so are
// those whose bytes are hint's, which ScanMessage has read already.
func splitElements(b []byte, i int, out []json.RawMessage, heads []Head, hint *Head) ([]json.RawMessage, []Head, bool) {
	i = ojson.Space(b, i)
	for {
		start := i
		if i < len(b) && b[i] == '{' {
			var h Head
			end, ok := 0, false
			if hint != nil {
				h, end, ok = hint.At(b, i)
			}
			if !ok {
				h, end, ok = ScanMessage(b, i)
			}
			if ok {
				j := ojson.Space(b, end)
				if j < len(b) && (b[j] == ',' || b[j] == '}' || b[j] == ']') {
					out, heads = append(out, b[start:end:end]), append(heads, h)
					if b[j] == ']' {
						return out, heads, ojson.Space(b, j+1) == len(b)
					}
					i = ojson.Space(b, j+1) // past ','
					continue
				}
			}
		}
		depth := 0
	value:
		for ; i < len(b); i++ {
			switch b[i] {
			case '"':
				if i = ojson.StringEnd(b, i); i < 0 {
					return nil, nil, false
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
			return nil, nil, false
		}
		elem := bytes.TrimSpace(b[start:i])
		if len(elem) == 0 {
			return nil, nil, false
		}
		out, heads = append(out, elem), append(heads, Head{})
		if b[i] == ']' {
			return out, heads, ojson.Space(b, i+1) == len(b)
		}
		i = ojson.Space(b, i+1) // past ','
	}
}
