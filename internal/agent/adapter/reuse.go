package adapter

import (
	"bytes"
	"context"
	"crypto/sha256"
	"encoding/binary"
	"encoding/json"
	"errors"
	"hash/maphash"
	"slices"
	"sort"
	"strings"

	"github.com/kilnrl/kiln/formats/records"
	"github.com/kilnrl/kiln/internal/agent/engine"
	"github.com/kilnrl/kiln/internal/agent/parse"
	"github.com/kilnrl/kiln/internal/ojson"
)

type digest = [sha256.Size]byte

// prefix is one stored prompt prefix (docs/adapter.md §3 "State"): the hashes of the
// turn's translated request messages plus its assistant message, the hash of
// its tool list, and the recorded turn it came from.
type prefix struct {
	msgs  []digest
	tools digest
	key   digest // hash of msgs and tools together (ambiguity check)
	turn  int    // index into session.turns
}

// canonicalHash hashes one JSON value so that deep-equal values (object
// keys in any order, docs/adapter.md §3 step 3) hash alike. raw is JSON as package
// protocol encodes it: compact, one encoding per string value and numbers
// kept as sent, so equal scalars are equal bytes and only object key order
// needs normalizing (keys are sorted by their encoded bytes, which orders
// equal keys alike).
func canonicalHash(raw []byte) digest {
	buf := make([]byte, 0, len(raw))
	if out, end, ok := appendCanonical(buf, raw, ojson.Space(raw, 0), 0); ok && ojson.Space(raw, end) == len(raw) {
		return sha256.Sum256(out)
	}
	// Not JSON: hash the bytes, prefixed so it never equals a value.
	return sha256.Sum256(append([]byte{0}, raw...))
}

// maxCanonicalDepth bounds the recursion of appendCanonical.
const maxCanonicalDepth = 10000

// appendCanonical appends the canonical form of the JSON value at b[i] and
// returns the index after it.
func appendCanonical(out, b []byte, i, depth int) ([]byte, int, bool) {
	if i >= len(b) || depth > maxCanonicalDepth {
		return out, i, false
	}
	switch b[i] {
	case '{':
		type field struct{ key, val []byte }
		var room [6]field // most objects' fields, without an allocation
		fields := room[:0]
		i = ojson.Space(b, i+1)
		if i < len(b) && b[i] == '}' {
			return append(out, '{', '}'), i + 1, true
		}
		for {
			if i >= len(b) || b[i] != '"' {
				return out, i, false
			}
			ks := i
			if i = ojson.StringEnd(b, i); i < 0 {
				return out, i, false
			}
			key := b[ks:i]
			if i = ojson.Space(b, i); i >= len(b) || b[i] != ':' {
				return out, i, false
			}
			vs := ojson.Space(b, i+1)
			if i = ojson.ValueEnd(b, vs); i < 0 {
				return out, i, false
			}
			fields = append(fields, field{key, b[vs:i]})
			if i = ojson.Space(b, i); i >= len(b) {
				return out, i, false
			}
			if b[i] == '}' {
				i++
				break
			}
			if b[i] != ',' {
				return out, i, false
			}
			i = ojson.Space(b, i+1)
		}
		slices.SortStableFunc(fields, func(x, y field) int { return bytes.Compare(x.key, y.key) })
		out = append(out, '{')
		for k, f := range fields {
			if k > 0 {
				out = append(out, ',')
			}
			out = append(out, f.key...)
			out = append(out, ':')
			var ok bool
			if out, _, ok = appendCanonical(out, f.val, 0, depth+1); !ok {
				return out, i, false
			}
		}
		return append(out, '}'), i, true
	case '[':
		out = append(out, '[')
		i = ojson.Space(b, i+1)
		if i < len(b) && b[i] == ']' {
			return append(out, ']'), i + 1, true
		}
		for n := 0; ; n++ {
			if n > 0 {
				out = append(out, ',')
			}
			var ok bool
			if out, i, ok = appendCanonical(out, b, i, depth+1); !ok {
				return out, i, false
			}
			if i = ojson.Space(b, i); i >= len(b) {
				return out, i, false
			}
			if b[i] == ']' {
				return append(out, ']'), i + 1, true
			}
			if b[i] != ',' {
				return out, i, false
			}
			i = ojson.Space(b, i+1)
		}
	}
	j := ojson.ValueEnd(b, i)
	if j < 0 {
		return out, i, false
	}
	return append(out, b[i:j]...), j, true
}

// hashMemo remembers, per session, the last request's messages and tools
// by fingerprint with their hashes. A client resends its whole history every
// turn, byte for byte, so a message whose fingerprint equals the one at its
// index last time has that one's hash: a hardware-assisted 128-bit hash of
// the bytes instead of a canonical encoding and a SHA-256 of each message,
// every turn. The fingerprint is two 64-bit maphashes under seeds drawn per
// memo, so no client can aim a collision at it, and it costs 16 bytes a
// message rather than a copy of the history.
type hashMemo struct {
	seeds     [2]maphash.Seed
	seeded    bool
	raws      []json.RawMessage // the last request's messages
	sums      []rawSum
	hashes    []digest
	toolsSum  rawSum
	toolsHash digest
	haveTools bool
	toolList  []json.RawMessage // for toolSet
	parsed    *parse.ToolSet    // of parseTools(toolList), nil until asked
	toolsRead bool
}

// rawSum fingerprints a message's bytes.
type rawSum [2]uint64

func (m *hashMemo) sum(raw []byte) rawSum {
	if !m.seeded {
		m.seeds, m.seeded = [2]maphash.Seed{maphash.MakeSeed(), maphash.MakeSeed()}, true
	}
	return rawSum{maphash.Bytes(m.seeds[0], raw), maphash.Bytes(m.seeds[1], raw)}
}

// messages returns the hashes of msgs.
//
// A message that is the very slice it was last time (the decode History
// hands a session's unchanged history back as the same translated bytes,
// which nothing writes) is not even fingerprinted: m.raws keeps those
// slices, so their memory cannot be reused for other bytes meanwhile.
// Message bytes given to the adapter's memo are never written afterwards.
func (m *hashMemo) messages(msgs []json.RawMessage) []digest {
	out := make([]digest, len(msgs))
	sums := make([]rawSum, len(msgs))
	for i, raw := range msgs {
		if i < len(m.raws) && sameSlice(raw, m.raws[i]) {
			sums[i], out[i] = m.sums[i], m.hashes[i]
			continue
		}
		sums[i] = m.sum(raw)
		if i < len(m.sums) && sums[i] == m.sums[i] {
			out[i] = m.hashes[i]
		} else {
			out[i] = canonicalHash(raw)
		}
	}
	// The slice headers are copied: the caller's list may be reused for
	// other messages, the bytes it points to may not.
	m.raws, m.sums, m.hashes = append(m.raws[:0], msgs...), sums, out[:len(msgs):len(msgs)]
	return out
}

// sameSlice reports whether a and b are the same memory: the same bytes,
// as long as nothing writes them.
func sameSlice(a, b []byte) bool {
	return len(a) == len(b) && (len(a) == 0 || &a[0] == &b[0])
}

// tools returns hashTools(tools), remembered while the list is unchanged.
func (m *hashMemo) tools(tools []json.RawMessage) digest {
	m.sum(nil) // seeds
	var sum rawSum
	for k := range sum {
		var h maphash.Hash
		h.SetSeed(m.seeds[k])
		for _, t := range tools {
			maphash.WriteComparable(&h, len(t)) // the list's framing
			h.Write(t)
		}
		sum[k] = h.Sum64()
	}
	if m.haveTools && sum == m.toolsSum {
		return m.toolsHash
	}
	m.toolList, m.toolsSum, m.toolsHash, m.haveTools = tools, sum, hashTools(tools), true
	m.parsed, m.toolsRead = nil, false
	return m.toolsHash
}

// toolSet indexes parseTools of the list last given to tools, once.
func (m *hashMemo) toolSet() *parse.ToolSet {
	if !m.toolsRead {
		m.parsed, m.toolsRead = parse.NewToolSet(parseTools(m.toolList)), true
	}
	return m.parsed
}

// hashTools hashes a tool list; nil and empty hash alike (null).
func hashTools(tools []json.RawMessage) digest {
	if len(tools) == 0 {
		return sha256.Sum256([]byte("null"))
	}
	h := sha256.New()
	h.Write([]byte("tools"))
	for _, t := range tools {
		d := canonicalHash(t)
		h.Write(d[:])
	}
	var d digest
	h.Sum(d[:0])
	return d
}

func prefixKey(msgs []digest, tools digest) digest {
	h := sha256.New()
	h.Write(tools[:])
	for _, m := range msgs {
		h.Write(m[:])
	}
	var d digest
	h.Sum(d[:0])
	return d
}

// renderFunc renders messages with the session's tools and kwargs.
type renderFunc func(ctx context.Context, msgs []json.RawMessage, addGenerationPrompt bool) ([]int32, error)

// reusePrompt is docs/adapter.md §3's algorithm. full is R, the canonical render with
// the generation prompt (step 1, already computed by the caller). It
// returns the prompt ids and whether a stored prefix was reused.
func (s *Server) reusePrompt(ctx context.Context, sess *session, msgs []json.RawMessage, msgHashes []digest,
	toolsHash digest, full []int32, render renderFunc) ([]int32, bool, error) {
	if len(sess.prefixes) == 0 {
		return full, false, nil
	}
	order := make([]int, len(sess.prefixes))
	for i := range order {
		order[i] = i
	}
	// Step 3: depth descending, stable.
	sort.SliceStable(order, func(a, b int) bool {
		return len(sess.prefixes[order[a]].msgs) > len(sess.prefixes[order[b]].msgs)
	})
	attempts := 0
	for _, i := range order {
		p := &sess.prefixes[i]
		d := len(p.msgs)
		t := &sess.turns[p.turn]
		if p.tools != toolsHash || d >= len(msgs) || !slices.Equal(p.msgs, msgHashes[:d]) ||
			t.FinishReason != "stop" || len(t.OutputIDs) == 0 || !s.specials[t.OutputIDs[len(t.OutputIDs)-1]] {
			continue
		}
		if s.ambiguous(sess, i) { // step 4
			continue
		}
		if attempts >= s.opts.ReuseAttempts {
			break // /tokenize budget spent: canonical render
		}
		attempts++
		// Step 5.
		anchor, err := render(ctx, msgs[:d], false)
		if err != nil {
			if ctx.Err() != nil {
				return nil, false, ctx.Err()
			}
			var he *engine.HTTPError
			if errors.As(err, &he) && he.Status < 500 {
				continue // the template refuses this prefix: not reusable
			}
			return nil, false, err
		}
		if len(anchor) > len(full) || !slices.Equal(full[:len(anchor)], anchor) {
			continue
		}
		// Step 6.
		last := t.OutputIDs[len(t.OutputIDs)-1]
		end := -1
		for j := len(anchor) - 1; j >= 0; j-- {
			if anchor[j] == last {
				end = j
				break
			}
		}
		if end < 0 {
			continue
		}
		if end+1 < len(anchor) {
			blank, err := s.blankTail(ctx, anchor[end+1:])
			if err != nil {
				return nil, false, err
			}
			if !blank {
				continue
			}
		}
		// Step 7. When the canonical render of the prefix is the very ids
		// the turn had, the prompt is the render itself (ids from the
		// engine client are read-only, so it can be shared, not copied).
		if n := len(t.PromptIDs); n+len(t.OutputIDs) == end+1 &&
			slices.Equal(full[:n], t.PromptIDs) && slices.Equal(full[n:end+1], t.OutputIDs) {
			sess.rebasePrompts(t.PromptIDs, full)
			return full, true, nil
		}
		return sess.extendPrompt(t.PromptIDs, t.OutputIDs, full[end+1:]), true, nil
	}
	return full, false, nil // step 8
}

// storeHashes returns the hashes of a recorded turn's prefix (docs/adapter.md §3
// "State"): its request messages' and its assistant message's. A request
// that resends the last turn's history begins with the last prefix's
// hashes, so the lists share one array (chain).
func (sess *session) storeHashes(msgs []digest, assistant digest) []digest {
	var prev []digest
	if n := len(sess.prefixes); n > 0 {
		if p := sess.prefixes[n-1].msgs; len(p) <= len(msgs) && slices.Equal(p, msgs[:len(p)]) {
			prev = p
		}
	}
	list, moved := sess.hashes.extend(prev, msgs[len(prev):], []digest{assistant})
	if moved {
		rebase(prev, list, viewsOf(sess.prefixes, func(p *prefix) *[]digest { return &p.msgs }))
	}
	return list
}

// extendPrompt returns prompt+output+suffix, a reused prompt (docs/adapter.md §3 step
// 7): each begins with the last, so they share one array (chain).
func (sess *session) extendPrompt(prompt, output, suffix []int32) []int32 {
	ids, moved := sess.prompts.extend(prompt, output, suffix)
	if moved {
		sess.rebasePrompts(prompt, ids)
	}
	return ids
}

// rebasePrompts moves the recorded prompts that are views of old's array
// to to, which begins with old's ids (chain).
func (sess *session) rebasePrompts(old, to []int32) {
	rebase(old, to, viewsOf(sess.turns, func(t *records.Turn) *[]int32 { return &t.PromptIDs }))
}

// maxCachedTail bounds the tails blankTail remembers (ids per tail).
const maxCachedTail = 16

// blankTail reports whether ids detokenize to white space only (docs/adapter.md §3
// step 6), asking the engine once per distinct short tail.
func (s *Server) blankTail(ctx context.Context, ids []int32) (bool, error) {
	var key string
	if len(ids) <= maxCachedTail {
		b := make([]byte, 0, 4*len(ids))
		for _, id := range ids {
			b = binary.LittleEndian.AppendUint32(b, uint32(id))
		}
		key = string(b)
		if v, ok := s.blankTails.Load(key); ok {
			return v.(bool), nil
		}
	}
	tail, err := s.opts.Engine.Detokenize(ctx, ids)
	if err != nil {
		return false, err
	}
	blank := strings.TrimSpace(tail) == ""
	if key != "" {
		s.blankTails.Store(key, blank)
	}
	return blank, nil
}

// ambiguous is docs/adapter.md §3 step 4: another stored prefix with identical messages
// and tools whose turn has different prompt or output ids.
func (s *Server) ambiguous(sess *session, i int) bool {
	p := &sess.prefixes[i]
	t := &sess.turns[p.turn]
	for j := range sess.prefixes {
		q := &sess.prefixes[j]
		if j == i || q.key != p.key {
			continue
		}
		u := &sess.turns[q.turn]
		if !slices.Equal(t.PromptIDs, u.PromptIDs) || !slices.Equal(t.OutputIDs, u.OutputIDs) {
			return true
		}
	}
	return false
}
