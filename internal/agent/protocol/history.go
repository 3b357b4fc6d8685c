package protocol

import (
	"bytes"
	"encoding/json"
	"hash/maphash"
	"net/http"
	"sync"

	"github.com/kilnrl/kiln/internal/ojson"
)

// History carries one client session's message history (Anthropic
// messages, Responses input items) from a request to the next. A coding CLI
// resends its whole history every turn, so without it the adapter parses
// and translates the whole of it on every turn — time that grows with the
// session, a turn at a time. With it, the messages up to the previous
// request's last clean boundary are recognized by a 128-bit fingerprint of
// their bytes (of the whole span when it is resent byte for byte, else of
// each message), skipped by the parser, and their translation (and the
// translator's state there) taken from the previous request; only what
// follows is parsed and translated.
//
// A boundary is clean when the translation before it is final and a
// function of the messages before it alone. Anthropic: right after an
// assistant message (every tool result before it was flushed there, nothing
// after it is pending yet, later messages only append), provided no docs/adapter.md §4.3
// folding of a late system message crosses it — each system message folds
// into a user message on its own side; a request whose new messages would
// fold into the reused part decodes whole.
// Responses: between items where nothing is pending (no open assistant
// message, call or output), with at least two messages translated so that
// no later developer message can merge into the first, and only for
// requests with the same instructions. Safe for concurrent use; the zero
// History is ready.
type History struct {
	mu    sync.Mutex
	ck    *historyCheckpoint
	seeds *[2]maphash.Seed // the fingerprints', drawn at first use
}

// skippedValue stands for a value the parser skipped at the History's
// word (a message of the checkpoint's prefix).
type skippedValue struct{}

// historyCheckpoint is the state after the source messages [0, k) of a
// request and a flush: immutable once stored.
type historyCheckpoint struct {
	sums []rawSum // fingerprints of source messages [0, k)
	// The bytes of source messages [0, k) as one span, from the first
	// one's start to the last one's end (separators included): its length,
	// its fingerprint and each message's extent within it. A request whose
	// list starts with the same span has the same k messages, told by one
	// hash of the span rather than a skim and a hash of each message.
	span    int
	spanSum rawSum
	rel     [][2]int
	out     []json.RawMessage // their translation, encoded (no top-level system message)
	pos     map[string]int    // the translator's tool_use positions
	calls   int
	// Responses: the system message "instructions" became (nil: none);
	// developer messages merge into it, so a checkpoint serves only
	// requests with the same.
	instr json.RawMessage
}

type rawSum [2]uint64

// decode starts a request's use of h; nil h, nil (no history). The seeds
// are drawn per History, so no client can aim a collision at its
// fingerprints.
func (h *History) decode() *historyDecode {
	if h == nil {
		return nil
	}
	h.mu.Lock()
	defer h.mu.Unlock()
	if h.seeds == nil {
		h.seeds = &[2]maphash.Seed{maphash.MakeSeed(), maphash.MakeSeed()}
	}
	return &historyDecode{h: h, ck: h.ck, seeds: *h.seeds}
}

func (h *History) store(ck *historyCheckpoint) {
	h.mu.Lock()
	h.ck = ck
	h.mu.Unlock()
}

// DecodeAnthropicHistory is DecodeAnthropic that also reuses what h holds
// of the session's previous request, and leaves in h what the next one can
// reuse. A nil h decodes without.
func DecodeAnthropicHistory(header http.Header, body []byte, h *History) (Request, error) {
	return decodeAnthropic(header, body, h.decode())
}

// historyTop is the parser hook of a decode with a History: the list at
// key goes through hd. hd nil: no hook.
func historyTop(key string, hd *historyDecode) ojson.TopHook {
	if hd == nil {
		return nil
	}
	return func(p *ojson.Decoder, k string) (any, bool, error) {
		if k == key {
			return hd.messages(p)
		}
		return nil, false, nil
	}
}

// historyDecode is one request's use of a History.
type historyDecode struct {
	seeds  [2]maphash.Seed
	h      *History
	ck     *historyCheckpoint // what the previous request left; nil: nothing
	reused int                // source messages taken from ck (for tests)
	bySpan bool               // ck's messages were told by their span (for tests)
}

// historyList is the parsed "messages" list: elements the checkpoint
// covers are skippedValue (all of [0, ck.k) or none of them), the others
// parsed.
type historyList struct {
	elems   []any
	sums    []rawSum
	extents [][2]int // each element's bytes in the body
	skipped int      // leading elements skipped: 0 or len(ck.sums)
	// The span hash from the first element's start, written up to
	// spanEnd (0: not started); the next checkpoint's span continues it.
	span    spanHash
	spanEnd int
}

// spanHash fingerprints a span of bytes as historyDecode.sum does,
// written in pieces.
type spanHash [2]maphash.Hash

func (h *spanHash) start(seeds [2]maphash.Seed) {
	for k := range h {
		h[k].SetSeed(seeds[k])
	}
}

func (h *spanHash) write(b []byte) {
	for k := range h {
		h[k].Write(b)
	}
}

func (h *spanHash) sum() rawSum { return rawSum{h[0].Sum64(), h[1].Sum64()} }

// checkpointSpan is the span of elements [0, k) for a checkpoint: its
// length, fingerprint and the elements' extents within it. The hash goes
// on from where the span check left it when it can.
func (d *historyDecode) checkpointSpan(body []byte, l *historyList, k int) (int, rawSum, [][2]int) {
	if k == 0 {
		return 0, rawSum{}, nil
	}
	start, end := l.extents[0][0], l.extents[k-1][1]
	if l.spanEnd == 0 || l.spanEnd > end {
		l.span.start(d.seeds)
		l.spanEnd = start
	}
	l.span.write(body[l.spanEnd:end])
	l.spanEnd = end
	rel := make([][2]int, k)
	for j := range rel {
		rel[j] = [2]int{l.extents[j][0] - start, l.extents[j][1] - start}
	}
	return end - start, l.span.sum(), rel
}

// parsePrefix parses the skipped prefix after all, when the checkpoint
// cannot serve (bytes already checked, so no error can come of it).
func (l *historyList) parsePrefix(body []byte) error {
	for j := 0; j < l.skipped; j++ {
		v, err := ojson.Decode(body[l.extents[j][0]:l.extents[j][1]])
		if err != nil {
			return err
		}
		l.elems[j] = v
	}
	l.skipped = 0
	return nil
}

// sum is b's 128-bit fingerprint: two maphashes under the History's seeds.
func (d *historyDecode) sum(b []byte) rawSum {
	return rawSum{maphash.Bytes(d.seeds[0], b), maphash.Bytes(d.seeds[1], b)}
}

// messages is the parser's hook for the top-level "messages": a list is
// read element by element, the checkpoint's prefix skipped when every one
// of its elements has the same bytes as before.
func (d *historyDecode) messages(p *ojson.Decoder) (any, bool, error) {
	b := p.Data()
	if p.Offset() >= len(b) || b[p.Offset()] != '[' {
		return nil, false, nil
	}
	l := &historyList{}
	if ck := d.ck; ck != nil && len(ck.sums) > 0 && ck.span > 0 {
		// The prefix as one span: the same bytes are the same messages.
		if i := ojson.Space(b, p.Offset()+1); i+ck.span <= len(b) {
			l.span.start(d.seeds)
			l.span.write(b[i : i+ck.span])
			l.spanEnd = i + ck.span
			if l.span.sum() == ck.spanSum {
				k := len(ck.sums)
				l.elems = make([]any, k, k+8)
				for j := range l.elems {
					l.elems[j] = skippedValue{}
				}
				l.sums = ck.sums[:k:k] // appended to by copying: ck stays as it is
				l.extents = make([][2]int, k, k+8)
				for j, e := range ck.rel {
					l.extents[j] = [2]int{i + e[0], i + e[1]}
				}
				l.skipped, d.bySpan = k, true
				p.Seek(i + ck.span)
			} else {
				l.spanEnd = 0
			}
		}
	}
	if ck := d.ck; l.skipped == 0 && ck != nil && len(ck.sums) > 0 {
		// The prefix, skimmed message by message (the same messages with
		// other separators between them): a match skips it whole,
		// anything else parses the list from its start.
		i := ojson.Space(b, p.Offset()+1)
		for n := range ck.sums {
			end := ojson.ValueEnd(b, i)
			if end < 0 {
				break
			}
			s := d.sum(b[i:end])
			if s != ck.sums[n] {
				break
			}
			l.elems = append(l.elems, skippedValue{})
			l.sums = append(l.sums, s)
			l.extents = append(l.extents, [2]int{i, end})
			if n == len(ck.sums)-1 {
				l.skipped = len(ck.sums)
				p.Seek(end)
				break
			}
			if i = ojson.Space(b, end); i >= len(b) || b[i] != ',' {
				break
			}
			i = ojson.Space(b, i+1)
		}
		if l.skipped == 0 {
			l.elems, l.sums, l.extents = l.elems[:0], l.sums[:0], l.extents[:0]
		}
	}
	if l.skipped == 0 {
		p.Seek(p.Offset() + 1) // [
		p.Space()
		if p.Offset() < len(b) && b[p.Offset()] == ']' {
			p.Seek(p.Offset() + 1)
			return l, true, nil
		}
	} else if closed, err := p.Next(']'); err != nil || closed {
		return l, err == nil, err
	}
	for {
		start := p.Offset()
		v, err := p.Value(2)
		if err != nil {
			return nil, false, err
		}
		l.elems = append(l.elems, v)
		l.sums = append(l.sums, d.sum(b[start:p.Offset()]))
		l.extents = append(l.extents, [2]int{start, p.Offset()})
		if closed, err := p.Next(']'); err != nil || closed {
			return l, err == nil, err
		}
	}
}

// translateAnthropic is docs/adapter.md §4.4 over l, from the checkpoint when it covers l's prefix,
// and stores the next checkpoint when one is sound. It returns the
// translated messages (without the top-level system one).
//
// docs/adapter.md §4.3 folds a system message past the first position into the nearest
// user message before it (else the next one after it). A checkpoint at
// source index j is a function of the messages [0, j) alone only if no
// folding crosses j: every system message before j folds into a user
// message before it, and every one from j on into a user message from j on
// — foldsWithin checks that, and reuse checks it again for the new tail.
func (d *historyDecode) translateAnthropic(body []byte, l *historyList) ([]json.RawMessage, error) {
	role := func(j int) any {
		if mo, ok := l.elems[j].(*ojson.Object); ok {
			return mo.Val("role")
		}
		return nil
	}
	// foldsWithin: each system message at i in [a, b), i > 0, has a user
	// message in [a, i). Roles of skipped elements are not read (a is
	// never below l.skipped when it matters).
	foldsWithin := func(a, b int) bool {
		user := false
		for i := a; i < b; i++ {
			switch role(i) {
			case "user":
				user = true
			case "system":
				if i > 0 && !user {
					return false
				}
			}
		}
		return true
	}
	n := len(l.elems)
	if l.skipped > 0 && !foldsWithin(l.skipped, n) {
		// The tail folds into the prefix.
		if err := l.parsePrefix(body); err != nil {
			return nil, err
		}
	}
	from := l.skipped
	// The next checkpoint: right after the last assistant message, from
	// which on, and before which, folding stays on its side. (Clients
	// resend that message unchanged — Claude Code 2.1.328 checked over three
	// turns — while the last user message changes: its cache_control
	// marker moves to the next one.)
	last := -1
	for j := n - 1; j >= from; j-- {
		if role(j) == "assistant" {
			last = j
			break
		}
	}
	if last >= 0 && !(foldsWithin(from, last) && foldsWithin(last, n)) {
		last = -1
	}

	t := anthropicTranslator{pos: map[string]int{}}
	var prefix []json.RawMessage
	if from > 0 {
		ck := d.ck
		t.pos, t.posShared, t.calls, prefix = ck.pos, true, ck.calls, ck.out
		d.reused = from
	}
	msgs, origin := foldSystemOrigin(l.elems[from:])
	if last >= 0 {
		for x, o := range origin {
			if o == last-from {
				t.snapOn, t.snapAt = true, x
				break
			}
		}
	}
	t.translate(msgs)
	out := rawAll(t.out)
	if len(prefix) > 0 {
		out = append(append(make([]json.RawMessage, 0, len(prefix)+len(out)), prefix...), out...)
	}
	if t.snap != nil {
		k, m := last+1, len(prefix)+t.snap.outLen
		span, spanSum, rel := d.checkpointSpan(body, l, k)
		d.h.store(&historyCheckpoint{sums: l.sums[:k:k], span: span, spanSum: spanSum, rel: rel,
			out: out[:m:m], pos: t.snap.pos, calls: t.snap.calls})
	} else if from == 0 {
		// Nothing of this request can serve the next one.
		d.h.store(nil)
	}
	return out, nil
}

// translateResponses is docs/adapter.md §5.3 over l, from the checkpoint when it covers l's
// prefix and the request's instructions are the same, and stores the next
// checkpoint: the last item boundary where nothing was pending (see
// responsesTranslator.boundary). instr is the system message of the
// request's instructions, nil for none.
func (d *historyDecode) translateResponses(body []byte, l *historyList, instr *ojson.Object) ([]json.RawMessage, error) {
	var instrRaw json.RawMessage
	if instr != nil {
		instrRaw = ojson.Marshal(instr)
	}
	if l.skipped > 0 && !bytes.Equal(instrRaw, d.ck.instr) {
		if err := l.parsePrefix(body); err != nil {
			return nil, err
		}
	}
	t := responsesTranslator{snapOn: true}
	var prefix []json.RawMessage
	from := l.skipped
	if from > 0 {
		prefix, t.prior = d.ck.out, len(d.ck.out)
		d.reused = from
	} else if instr != nil {
		t.out = append(t.out, instr)
	}
	if err := t.translate(l.elems[from:]); err != nil {
		return nil, err
	}
	out := rawAll(t.out)
	if len(prefix) > 0 {
		out = append(append(make([]json.RawMessage, 0, len(prefix)+len(out)), prefix...), out...)
	}
	if t.snap != nil {
		k, m := from+t.snap.item, len(prefix)+t.snap.outLen
		span, spanSum, rel := d.checkpointSpan(body, l, k)
		d.h.store(&historyCheckpoint{sums: l.sums[:k:k], span: span, spanSum: spanSum, rel: rel,
			out: out[:m:m], instr: instrRaw})
	} else if from == 0 {
		d.h.store(nil)
	}
	return out, nil
}
