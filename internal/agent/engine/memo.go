package engine

import (
	"bytes"
	"encoding/json"
	"math"
	"slices"
	"sync"
)

// Memo is what the client remembers of one conversation between its calls,
// so that each call reads and writes only what is new. An adapter renders a
// turn's whole history (twice, docs/adapter.md §3) and sends the whole prompt to
// generate, and every turn the history is the last one's plus a little:
//
//   - /tokenize replies (ChatRequest.Memo): the id list of the longest
//     render seen, its bytes and its ids. A reply that begins with the same
//     bytes has those ids compared as bytes rather than parsed, and a render
//     of fewer messages is not even copied. An id is taken from the memo
//     only when its digits and the comma after them lie within the common
//     byte prefix, so the reply says exactly that id there; everything after
//     the last such comma is parsed. A reply that is a prefix of the
//     remembered one leaves the memo as it is.
//   - /tokenize requests: a message or tool that is the very slice the
//     last request checked (a session's unchanged history, handed back by
//     the decoder as the same bytes) is not checked again. Message and tool
//     bytes given with a memo must not be written afterwards.
//   - generate requests (GenerateRequest.Memo): a prompt that is the
//     remembered render's very ids is written as the reply's bytes of them.
//
// Ids read through a memo may share memory with it and with other replies
// read through it: they are read-only. The renders of a growing
// conversation share one array, so the prompts a session keeps cost about
// the memory of its longest one rather than the sum of all of them. The
// zero value is ready. Safe for concurrent use, though it only pays when
// one conversation's calls use it.
type Memo struct {
	mu sync.Mutex
	// /tokenize: the remembered list's bytes ('[' through ']') and ids
	// (never written once remembered).
	raw []byte
	ids []int32
	// The messages and tools of the last /tokenize body, found well formed
	// (the slices, not copies: see checked).
	msgs, tools []json.RawMessage
}

// scan reads raw, a /tokenize reply's "tokens" value, as an id list
// (non-negative int32s) with encoding/json, taking the ids it shares with
// the remembered list from it, and remembers this list unless it is a
// prefix of that one. ok is false for anything but such a list; nothing is
// remembered then. A nil memo reads the whole list.
func (m *Memo) scan(raw []byte) (_ []int32, ok bool) {
	raw = bytes.TrimSpace(raw)
	if m == nil {
		return decodeIDs(raw)
	}
	m.mu.Lock()
	defer m.mu.Unlock()
	// The ids before the last comma the reply shares with the remembered
	// list are the remembered ones (k of them); the rest, from just after
	// that comma, is decoded as a list of its own. raw[:from] is then the
	// remembered list's own prefix up to a comma ("[a,b,"), so raw is a
	// list exactly when "[" + raw[from:] is a list of at least one id.
	p := commonPrefix(raw, m.raw)
	from, k := 0, 0
	if c := bytes.LastIndexByte(raw[:p], ','); c >= 0 {
		from, k = c+1, bytes.Count(raw[:c+1], []byte{','})
	}
	var tail []int32
	if from == 0 {
		tail, ok = decodeIDs(raw)
	} else {
		tail, ok = decodeIDs(append([]byte{'['}, raw[from:]...))
		ok = ok && len(tail) > 0
	}
	if !ok {
		return nil, false
	}
	n := k + len(tail)
	if n == 0 {
		return []int32{}, true
	}
	// q: how far the reply agrees with the remembered ids (the tail
	// re-reads the id whose comma was not yet shared).
	q := k
	for q < len(m.ids) && q < n && tail[q-k] == m.ids[q] {
		q++
	}
	if q == n {
		return m.ids[:n:n], true // the remembered list, or a prefix of it
	}
	var ids []int32
	if q == len(m.ids) && n <= cap(m.ids) {
		// The reply extends the remembered list, and its new ids fit in the
		// array's room past it, which no result has ever covered (results
		// are cut to their length and capacity): the renders of a growing
		// conversation, each kept as a turn's prompt, share one array.
		ids = append(m.ids, tail[q-k:]...)
	} else {
		// Room for the conversation to grow by half again before the next
		// copy; earlier results keep the old array.
		ids = make([]int32, n, n+n/2)
		copy(ids, m.ids[:k])
		copy(ids[k:], tail)
	}
	// Only the bytes past the shared ones are copied into raw, which grows
	// by half again (append grows large slices by a quarter: a copy of
	// the whole list every turn or two).
	if need := len(raw); need > cap(m.raw) {
		m.raw = append(make([]byte, 0, need+need/2), m.raw[:p]...)
	}
	m.raw, m.ids = append(m.raw[:p], raw[p:]...), ids
	return ids[:n:n], true
}

// decodeIDs reads raw as a JSON list of non-negative int32 ids, as
// json.Unmarshal into []int64 reads it (null elements read as 0).
func decodeIDs(raw []byte) ([]int32, bool) {
	var vals []int64
	if json.Unmarshal(raw, &vals) != nil || vals == nil {
		return nil, false
	}
	ids := make([]int32, len(vals))
	for i, v := range vals {
		if v < 0 || v > math.MaxInt32 {
			return nil, false
		}
		ids[i] = int32(v)
	}
	return ids, true
}

// appendPrompt appends ids as a JSON array, as appendIDs does; when ids
// are the remembered render's own (the prompt an adapter builds from a
// render it reuses whole), the reply's bytes of them are written instead of
// formatting thousands of ids again. A nil memo is appendIDs.
func (m *Memo) appendPrompt(b []byte, ids []int32) []byte {
	if m == nil || len(ids) == 0 {
		return appendIDs(b, ids)
	}
	m.mu.Lock()
	defer m.mu.Unlock()
	if len(ids) == len(m.ids) && &ids[0] == &m.ids[0] { // the same read-only array
		return append(b, m.raw...)
	}
	return appendIDs(b, ids)
}

// holds reports whether ids are the remembered render or a prefix of it,
// the very memory: ids the memo read from a reply (non-negative int32s,
// never written since). A nil memo holds nothing.
func (m *Memo) holds(ids []int32) bool {
	if m == nil || len(ids) == 0 {
		return false
	}
	m.mu.Lock()
	defer m.mu.Unlock()
	return len(ids) <= len(m.ids) && &ids[0] == &m.ids[0]
}

// checked returns the messages and tools the last /tokenize body written
// through m held, all found well formed; a nil memo has none. The memo
// keeps the slices themselves, so their memory holds those bytes as long as
// it does.
func (m *Memo) checked() (msgs, tools []json.RawMessage) {
	if m == nil {
		return nil, nil
	}
	m.mu.Lock()
	defer m.mu.Unlock()
	return m.msgs, m.tools
}

// setChecked remembers a body's messages and tools as checked; the lists
// are copied (their elements, not the bytes), as the caller may reuse them.
func (m *Memo) setChecked(msgs, tools []json.RawMessage) {
	if m == nil {
		return
	}
	m.mu.Lock()
	defer m.mu.Unlock()
	m.msgs, m.tools = slices.Clone(msgs), slices.Clone(tools)
}

// sameSlice reports whether a and b are the same memory.
func sameSlice(a, b []byte) bool {
	return len(a) == len(b) && (len(a) == 0 || &a[0] == &b[0])
}

// commonPrefix is the length of the longest common prefix of a and b,
// compared a block at a time with the vectorized bytes.Equal.
func commonPrefix(a, b []byte) int {
	n := min(len(a), len(b))
	const block = 256
	i := 0
	for i+block <= n && bytes.Equal(a[i:i+block], b[i:i+block]) {
		i += block
	}
	for i < n && a[i] == b[i] {
		i++
	}
	return i
}
