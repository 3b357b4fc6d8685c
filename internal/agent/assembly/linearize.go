package assembly

import (
	"bytes"
	"encoding/binary"
	"math"
	"slices"
	"unsafe"

	"github.com/kilnrl/kiln/formats/records"
)

// span is one generated output appended to a builder.
type span struct {
	start   int // index of the first output token in builder.tokens
	turn    *turn
	trained bool
}

// builder is one segment under construction (docs/assembly.md §2.2). Loss mask and
// logprobs are implied by its spans: every token outside a span is context.
// The spans of a leaf's builders share one list (linearizer.spans): a
// builder only grows while it is the leaf's last, so its spans are
// spans[lo:hi], at the list's end until the next builder starts.
type builder struct {
	tokens    []int32
	lo, hi    int // its spans, linearizer.spans[lo:hi]
	lastStart int // last_response_start
	lead      int // leading_prompt_len
}

// leafMeta is the metadata a leaf gives all of its segments.
type leafMeta struct {
	truncated, useTool, illFormed bool
}

// Segments linearizes the session (docs/assembly.md §2.2, §2.3): one or more segments
// per leaf of the routing tree, leaves in depth-first insertion order,
// numbered 0..k-1. Every segment carries base's ids and reward. The session
// is drained whether or not an error is returned: a second call returns nil.
//
// Segment slices are freshly allocated, except RoutedExperts, which shares
// memory with the recorded turn's routes.
func (s *Session) Segments(base Base) ([]records.Trajectory, error) {
	root, kind, T := s.root, s.replay, s.opts.ForkMergeMaxResponseTokens
	sc := s.scratch
	*s = Session{opts: s.opts}
	if sc == nil {
		return nil, nil // nothing recorded
	}
	if root == nil {
		return nil, nil // nothing recorded
	}
	l := linearizer{kind: kind, T: T, base: base, scratch: sc}
	if err := l.walk(root); err != nil {
		return nil, err
	}
	if len(l.segs) == 0 {
		return nil, nil
	}
	// The list is built in the scratch and handed out at its final length.
	return slices.Clone(l.segs), nil
}

type linearizer struct {
	kind replayKind
	T    int
	base Base
	seen map[int32]struct{} // scratch for top-p row validation

	// The session's scratch: gens is the generated nodes on the path being
	// walked; builders and spans those of the current leaf; segs the
	// segments emitted so far.
	*scratch
}

// walk linearizes the leaves under n, depth first in insertion order.
func (l *linearizer) walk(n *node) error {
	if n.turn != nil {
		l.gens = append(l.gens, n)
	}
	if len(n.children) == 0 && len(l.gens) > 0 {
		if err := l.leaf(l.gens); err != nil {
			return err
		}
	}
	for _, c := range n.children {
		if err := l.walk(c); err != nil {
			return err
		}
	}
	if n.turn != nil {
		l.gens = l.gens[:len(l.gens)-1]
	}
	return nil
}

// leaf linearizes the generated nodes of one root-to-leaf path.
func (l *linearizer) leaf(gens []*node) error {
	var meta leafMeta
	for _, g := range gens {
		meta.useTool = meta.useTool || g.useTool
		meta.illFormed = meta.illFormed || g.turn.illFormed
	}
	last := gens[len(gens)-1].turn
	meta.truncated = last.truncated
	capHint := len(last.PromptIDs) + len(last.OutputIDs)

	l.builders, l.spans = l.builders[:0], l.spans[:0]
	for _, g := range gens {
		trained := !g.trained
		g.trained = true
		t := g.turn
		var b *builder
		if len(l.builders) > 0 && !l.kind.routes { // R3: every turn is its own segment
			b = &l.builders[len(l.builders)-1]
			L := lcp(b.tokens, t.PromptIDs)
			switch {
			case L == len(b.tokens): // CLEAN
				b.tokens = append(b.tokens, t.PromptIDs[L:]...)
			case L >= b.lastStart && len(t.OutputIDs) < l.T: // REALIGN
				l.realign(b, t.PromptIDs)
			default: // FORK
				b = nil
			}
		}
		if b == nil {
			hint := capHint
			if l.kind.routes {
				hint = len(t.PromptIDs) + len(t.OutputIDs)
			}
			// capHint bounds the segment (its leaf's last prompt and
			// output), so appends stay inside this memory.
			tokens := make([]int32, max(hint, len(t.PromptIDs)))[:len(t.PromptIDs)]
			copy(tokens, t.PromptIDs)
			l.builders = append(l.builders, builder{tokens: tokens, lead: len(tokens), lo: len(l.spans), hi: len(l.spans)})
			b = &l.builders[len(l.builders)-1]
		}
		l.appendOutput(b, t, trained)
	}
	for i := range l.builders {
		if err := l.emit(&l.builders[i], meta); err != nil {
			return err
		}
	}
	return nil
}

// appendOutput appends t's output as b's newest response; b is the leaf's
// last builder.
func (l *linearizer) appendOutput(b *builder, t *turn, trained bool) {
	b.lastStart = len(b.tokens)
	if len(t.OutputIDs) > 0 {
		l.spans = append(l.spans, span{start: len(b.tokens), turn: t, trained: trained})
		b.hi = len(l.spans)
		b.tokens = append(b.tokens, t.OutputIDs...)
	}
}

// realign replaces b's most recent response span and everything after it
// with prompt[lastStart:], all context; b is the leaf's last builder.
func (l *linearizer) realign(b *builder, prompt []int32) {
	b.tokens = append(b.tokens[:b.lastStart], prompt[b.lastStart:]...)
	for b.hi > b.lo && l.spans[b.hi-1].start >= b.lastStart {
		b.hi--
	}
	l.spans = l.spans[:b.hi]
}

// emit turns a builder into a segment, or drops it when it trains nothing.
func (l *linearizer) emit(b *builder, meta leafMeta) error {
	spans := l.spans[b.lo:b.hi]
	trainedSpan := false
	for _, sp := range spans {
		trainedSpan = trainedSpan || sp.trained
	}
	if !trainedSpan {
		return nil
	}
	n := len(b.tokens)
	if m := l.base.MaxSampleTokens; m > 0 && n > m {
		n = m
	}
	if n <= b.lead {
		return nil // [INFERRED] truncation cut into the leading prompt
	}
	rl := n - b.lead
	// Mask and logprobs are written in one pass, row order: context rows
	// 0, output rows their mask and logprobs.
	mask := make([]uint8, rl)
	lps := make([]float32, rl)
	trained, at := 0, 0 // at: the first row not yet written
	for _, sp := range spans {
		r0 := sp.start - b.lead
		if r0 >= rl {
			break
		}
		clear(mask[at:r0])
		clear(lps[at:r0])
		out := sp.turn.OutputIDs[:min(len(sp.turn.OutputIDs), rl-r0)]
		at = r0 + len(out)
		m := mask[r0:at]
		if sp.trained {
			fillOnes(m)
			trained += len(out)
		} else {
			clear(m)
		}
		if len(sp.turn.OutputLogProbs) > 0 {
			copy(lps[r0:at], sp.turn.OutputLogProbs)
		} else {
			clear(lps[r0:at])
		}
	}
	clear(mask[at:])
	clear(lps[at:])
	if trained == 0 {
		return nil // truncation removed every trained token
	}
	seg := records.Trajectory{
		RolloutID:       l.base.RolloutID,
		Index:           l.base.Index,
		GroupIndex:      l.base.GroupIndex,
		Segment:         int32(len(l.segs)),
		Tokens:          b.tokens[:n:n],
		ResponseLength:  int32(rl),
		LossMask:        mask,
		RolloutLogProbs: lps,
		Truncated:       meta.truncated,
		UseTool:         meta.useTool,
		IllFormed:       meta.illFormed,
	}
	if l.base.Reward != nil {
		r := *l.base.Reward
		seg.Reward = &r
	}
	if l.kind.topP {
		l.topP(&seg, b.lead, spans)
	}
	if l.kind.topK {
		l.topK(&seg, b.lead, spans)
	}
	if l.kind.routes {
		t := spans[0].turn.replay
		sh := t.RoutedExperts
		stride := int(t.RoutedExpertsShape[1]) * int(t.RoutedExpertsShape[2])
		rows := min(n-1, int(t.RoutedExpertsShape[0]))
		seg.RoutedExperts = sh[: rows*stride : rows*stride]
		seg.RoutedExpertsShape = []int32{int32(rows), t.RoutedExpertsShape[1], t.RoutedExpertsShape[2]}
	}
	if l.kind.topP {
		if err := l.validateTopP(&seg); err != nil {
			return err
		}
	}
	// The records invariants (lengths, masks, finite logprobs, a trained
	// token) are checked once, by the writer (records.TrajectoryEncoder),
	// which refuses the whole shard on a violation; the property tests hold
	// assembly to them.
	l.segs = append(l.segs, seg)
	return nil
}

// fillOnes sets every byte of m to 1, eight bytes a store (a loss mask's
// trained rows: the compiler does not vectorize a byte loop).
func fillOnes(m []uint8) {
	for len(m) >= 8 {
		binary.LittleEndian.PutUint64(m, 0x0101010101010101)
		m = m[8:]
	}
	for i := range m {
		m[i] = 1
	}
}

// topP concatenates the recorded nucleus spans in token order; context rows
// get an empty span (docs/assembly.md §2.3).
func (l *linearizer) topP(seg *records.Trajectory, lead int, spans []span) {
	rl := int(seg.ResponseLength)
	total := 0
	for _, sp := range spans {
		total += len(sp.turn.replay.TopPTokenIDs)
	}
	off := make([]int32, rl+1)
	ids := make([]int32, 0, total)
	var lps []float32
	if l.kind.topPLP {
		lps = make([]float32, 0, total)
	}
	row := 0
	for _, sp := range spans {
		r0 := sp.start - lead
		if r0 >= rl {
			break
		}
		for ; row < r0; row++ {
			off[row+1] = int32(len(ids))
		}
		t := sp.turn.replay
		toff := t.TopPTokenOffsets
		cnt := min(len(sp.turn.OutputIDs), rl-r0)
		for i := 0; i < cnt; i++ {
			ids = append(ids, t.TopPTokenIDs[toff[i]:toff[i+1]]...)
			if lps != nil {
				lps = append(lps, t.TopPLogProbs[toff[i]:toff[i+1]]...)
			}
			row++
			off[row] = int32(len(ids))
		}
	}
	for ; row < rl; row++ {
		off[row+1] = int32(len(ids))
	}
	seg.TopPTokenOffsets, seg.TopPTokenIDs, seg.TopPLogProbs = off, ids, lps
}

// topK gives generated rows their recorded head and context rows the dummy
// head 0..k-1 with logprob log(1/k) (docs/assembly.md §2.3).
func (l *linearizer) topK(seg *records.Trajectory, lead int, spans []span) {
	rl, k := int(seg.ResponseLength), int(l.kind.k)
	ids := make([]int32, rl*k)
	lps := make([]float32, rl*k)
	dummy := float32(-math.Log(float64(k)))
	for r := 0; r < rl; r++ {
		for c := 0; c < k; c++ {
			ids[r*k+c] = int32(c)
			lps[r*k+c] = dummy
		}
	}
	for _, sp := range spans {
		r0 := sp.start - lead
		if r0 >= rl {
			break
		}
		cnt := min(len(sp.turn.OutputIDs), rl-r0)
		copy(ids[r0*k:], sp.turn.replay.TopKTokenIDs[:cnt*k])
		copy(lps[r0*k:], sp.turn.replay.TopKLogProbs[:cnt*k])
	}
	seg.TopKTokenIDs, seg.TopKLogProbs, seg.TopK = ids, lps, l.kind.k
}

// lcp is the length of the longest common prefix of a and b. It reads each
// element at most once: blocks are compared with the runtime's vectorized
// memequal, and only the block holding the first difference is narrowed
// down (a drift is found in one pass, not a failed whole-prefix compare and
// a second pass).
//
// Why not a plain loop (or slices.Equal, a loop too): the stage's wall
// time needs it. kiln-rollout assemble --turns-jsonl on the 198 MB file of
// BenchmarkAssembleJSONL (20 sessions of 100 turns), 15 alternating rounds
// of the built binaries, 2026-12-03, load ~0.7 on 2 cores: median 0.41 s
// wall (0.38-0.49), 0.44 s CPU with this lcp; 0.44 s wall (0.39-0.47),
// 0.47 s CPU with an element-by-element loop: 7% of the stage. Command
// (the binary timed with /usr/bin/time on the benchmark's file):
//
//	KILN_BENCH_TURNS_SESSIONS=20 go test ./stages/rollout -run '^$' -bench AssembleJSONL -benchtime 1x -timeout 30m
func lcp(a, b []int32) int {
	n := min(len(a), len(b))
	const block, sub = 1024, 32 // int32s: 4 KiB blocks, 128-byte sub-blocks
	for i := 0; i < n; {
		m := min(block, n-i)
		if int32sEqual(a[i:i+m], b[i:i+m]) {
			i += m
			continue
		}
		for end := i + m; i+sub <= end && int32sEqual(a[i:i+sub], b[i:i+sub]); {
			i += sub
		}
		for a[i] == b[i] { // a difference lies ahead, within the block
			i++
		}
		return i
	}
	return n
}

// int32sEqual reports whether a and b, of equal length, hold the same
// values.
func int32sEqual(a, b []int32) bool {
	if len(a) == 0 {
		return true
	}
	ab := unsafe.Slice((*byte)(unsafe.Pointer(&a[0])), 4*len(a))
	bb := unsafe.Slice((*byte)(unsafe.Pointer(&b[0])), 4*len(b))
	return bytes.Equal(ab, bb)
}
