package adapter

import (
	"bytes"
	"encoding/json"
	"strings"
)

// messageStore keeps the prompt messages of a session's recorded turns
// without a copy of the whole history per turn. A client resends its
// history every turn, so turn k's messages are mostly turn k-1's: a message
// equal to the one at its index in the last recorded turn shares that
// turn's bytes, and only the others are copied (compactly: the store never
// holds on to a request body). When the last turn's messages are all
// resent, the turn's list is that turn's extended, in one array (chain), so
// a session of n turns keeps each distinct message once and about one list
// of slice headers, where one joined array per turn was O(n²) bytes (and n
// lists of headers O(n²) headers); Finish joins each turn's list into its
// records.Turn.PromptMessages, the turns kind's JSON array.
type messageStore struct {
	turns [][]json.RawMessage // per recorded turn; stored bytes, never written
	// last is the last recorded turn's messages as the request gave them:
	// a message that is the very same slice again (a decode History hands
	// back an unchanged history as the same bytes, which nothing writes) is
	// equal without a compare.
	last  []json.RawMessage
	lists chain[json.RawMessage]
}

// record stores the messages of the turn just recorded.
func (m *messageStore) record(msgs []json.RawMessage) {
	var prev []json.RawMessage
	if n := len(m.turns); n > 0 {
		prev = m.turns[n-1]
	}
	same := func(i int) bool {
		return i < len(prev) && ((i < len(m.last) && sameSlice(msgs[i], m.last[i])) || bytes.Equal(msgs[i], prev[i]))
	}
	k := 0
	for k < len(prev) && k < len(msgs) && same(k) {
		k++
	}
	var out []json.RawMessage
	if k == len(prev) && k > 0 {
		var moved bool
		out, moved = m.lists.extend(prev, msgs[k:])
		if moved {
			rebase(prev, out, viewsOf(m.turns, func(l *[]json.RawMessage) *[]json.RawMessage { return l }))
		}
		for i := k; i < len(out); i++ {
			out[i] = bytes.Clone(out[i]) // the list's own room: no one else's yet
		}
	} else {
		out = make([]json.RawMessage, len(msgs))
		for i, raw := range msgs {
			if same(i) {
				out[i] = prev[i]
				continue
			}
			out[i] = bytes.Clone(raw)
		}
	}
	m.turns = append(m.turns, out)
	m.last = append(m.last[:0], msgs...) // the headers: the caller may reuse its list
}

// joinArray writes msgs as one JSON array, bytes as given (json.Marshal
// would HTML-escape them), in one allocation: it is a turn's whole history.
func joinArray(msgs []json.RawMessage) string {
	n := 2
	for _, m := range msgs {
		n += len(m) + 1
	}
	var sb strings.Builder
	sb.Grow(n)
	sb.WriteByte('[')
	for i, m := range msgs {
		if i > 0 {
			sb.WriteByte(',')
		}
		sb.Write(m)
	}
	sb.WriteByte(']')
	return sb.String()
}
