package assembly

import (
	"bytes"
	"math"
	"unsafe"

	"github.com/kilnrl/kiln/formats/records"
)

// span is one generated output appended to a builder.
type span struct {
	start   int // index of the first output token in builder.tokens
	turn    *Turn
	trained bool
}

// builder is one segment under construction (spec §2.2). Loss mask and
// logprobs are implied by spans: every token outside a span is context.
type builder struct {
	tokens    []int32
	spans     []span // non-empty outputs, in token order
	lastStart int    // last_response_start
	lead      int    // leading_prompt_len
}

func newBuilder(a *Arena, prompt []int32, capHint int) *builder {
	// capHint bounds the segment (its leaf's last prompt and output), so
	// appends stay inside this memory.
	tokens := a.int32s(max(capHint, len(prompt)))[:len(prompt)]
	copy(tokens, prompt)
	return &builder{tokens: tokens, lead: len(prompt)}
}

// appendOutput appends t's output as the builder's newest response.
func (b *builder) appendOutput(t *Turn, trained bool) {
	b.lastStart = len(b.tokens)
	if len(t.OutputIDs) > 0 {
		b.spans = append(b.spans, span{start: len(b.tokens), turn: t, trained: trained})
		b.tokens = append(b.tokens, t.OutputIDs...)
	}
}

// realign replaces the most recent response span and everything after it
// with prompt[lastStart:], all context.
func (b *builder) realign(prompt []int32) {
	b.tokens = append(b.tokens[:b.lastStart], prompt[b.lastStart:]...)
	for len(b.spans) > 0 && b.spans[len(b.spans)-1].start >= b.lastStart {
		b.spans = b.spans[:len(b.spans)-1]
	}
}

func (b *builder) anyTrained() bool {
	for _, sp := range b.spans {
		if sp.trained {
			return true
		}
	}
	return false
}

// leafMeta is the metadata a leaf gives all of its segments.
type leafMeta struct {
	truncated, useTool, illFormed bool
}

// Segments linearizes the session (spec §2.2, §2.3): one or more segments
// per leaf of the routing tree, leaves in depth-first insertion order,
// numbered 0..k-1. Every segment carries base's ids and reward. The session
// is drained whether or not an error is returned: a second call returns nil.
//
// Segment slices are freshly allocated (tokens, masks and logprobs from
// Options.Arena when set), except RoutedExperts, which shares memory with
// the recorded turn's routes.
func (s *Session) Segments(base Base) ([]records.Trajectory, error) {
	root, kind, T := s.root, s.replay, s.opts.ForkMergeMaxResponseTokens
	nodes, kids, turns := s.nodeSlab, s.kidSlab, s.turnSlab
	*s = Session{opts: s.opts, root: &node{}}
	// The segments hold no reference into the tree: once linearized, its
	// memory serves the next session.
	defer func() {
		a := s.opts.Arena
		a.nodeSlabs().put(nodes)
		a.kidSlabs().put(kids)
		a.turnSlabs().put(turns)
	}()

	l := &linearizer{kind: kind, T: T, base: base, arena: s.opts.Arena}
	var gens []*node
	var walk func(n *node) error
	walk = func(n *node) error {
		if n.turn != nil {
			gens = append(gens, n)
			defer func() { gens = gens[:len(gens)-1] }()
		}
		if len(n.children) == 0 && len(gens) > 0 {
			if err := l.leaf(gens); err != nil {
				return err
			}
		}
		for _, c := range n.children {
			if err := walk(c); err != nil {
				return err
			}
		}
		return nil
	}
	if err := walk(root); err != nil {
		return nil, err
	}
	return l.out, nil
}

type linearizer struct {
	kind  replayKind
	T     int
	base  Base
	arena *Arena
	out   []records.Trajectory
	seen  map[int32]struct{} // scratch for top-p row validation
}

// leaf linearizes the generated nodes of one root-to-leaf path.
func (l *linearizer) leaf(gens []*node) error {
	var meta leafMeta
	for _, g := range gens {
		meta.useTool = meta.useTool || g.useTool
		meta.illFormed = meta.illFormed || g.turn.IllFormed
	}
	last := gens[len(gens)-1].turn
	meta.truncated = last.FinishReason == "length"
	capHint := len(last.PromptIDs) + len(last.OutputIDs)

	var builders []*builder
	for _, g := range gens {
		trained := !g.trained
		g.trained = true
		t := g.turn
		var b *builder
		if len(builders) > 0 && !l.kind.routes { // R3: every turn is its own segment
			b = builders[len(builders)-1]
			L := lcp(b.tokens, t.PromptIDs)
			switch {
			case L == len(b.tokens): // CLEAN
				b.tokens = append(b.tokens, t.PromptIDs[L:]...)
			case L >= b.lastStart && len(t.OutputIDs) < l.T: // REALIGN
				b.realign(t.PromptIDs)
			default: // FORK
				b = nil
			}
		}
		if b == nil {
			hint := capHint
			if l.kind.routes {
				hint = len(t.PromptIDs) + len(t.OutputIDs)
			}
			b = newBuilder(l.arena, t.PromptIDs, hint)
			builders = append(builders, b)
		}
		b.appendOutput(t, trained)
	}
	for _, b := range builders {
		if err := l.emit(b, meta); err != nil {
			return err
		}
	}
	return nil
}

// emit turns a builder into a segment, or drops it when it trains nothing.
func (l *linearizer) emit(b *builder, meta leafMeta) error {
	if !b.anyTrained() {
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
	mask := l.arena.zeroedUint8s(rl)
	lps := l.arena.zeroedFloat32s(rl)
	trained := 0
	for _, sp := range b.spans {
		r0 := sp.start - b.lead
		if r0 >= rl {
			break
		}
		out := sp.turn.OutputIDs[:min(len(sp.turn.OutputIDs), rl-r0)]
		if sp.trained {
			m := mask[r0 : r0+len(out)]
			for i := range m {
				m[i] = 1
			}
			trained += len(out)
		}
		if len(sp.turn.OutputLogProbs) > 0 {
			copy(lps[r0:], sp.turn.OutputLogProbs[:len(out)])
		}
	}
	if trained == 0 {
		return nil // truncation removed every trained token
	}
	seg := records.Trajectory{
		RolloutID:       l.base.RolloutID,
		Index:           l.base.Index,
		GroupIndex:      l.base.GroupIndex,
		Segment:         int32(len(l.out)),
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
		l.topP(&seg, b)
	}
	if l.kind.topK {
		l.topK(&seg, b)
	}
	if l.kind.routes {
		t := b.spans[0].turn
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
	l.out = append(l.out, seg)
	return nil
}

// topP concatenates the recorded nucleus spans in token order; context rows
// get an empty span (spec §2.3).
func (l *linearizer) topP(seg *records.Trajectory, b *builder) {
	rl := int(seg.ResponseLength)
	total := 0
	for _, sp := range b.spans {
		total += len(sp.turn.TopPTokenIDs)
	}
	off := make([]int32, rl+1)
	ids := make([]int32, 0, total)
	var lps []float32
	if l.kind.topPLP {
		lps = make([]float32, 0, total)
	}
	row := 0
	for _, sp := range b.spans {
		r0 := sp.start - b.lead
		if r0 >= rl {
			break
		}
		for ; row < r0; row++ {
			off[row+1] = int32(len(ids))
		}
		t := sp.turn
		toff := t.TopPTokenOffsets
		cnt := min(len(t.OutputIDs), rl-r0)
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
// head 0..k-1 with logprob log(1/k) (spec §2.3).
func (l *linearizer) topK(seg *records.Trajectory, b *builder) {
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
	for _, sp := range b.spans {
		r0 := sp.start - b.lead
		if r0 >= rl {
			break
		}
		cnt := min(len(sp.turn.OutputIDs), rl-r0)
		copy(ids[r0*k:], sp.turn.TopKTokenIDs[:cnt*k])
		copy(lps[r0*k:], sp.turn.TopKLogProbs[:cnt*k])
	}
	seg.TopKTokenIDs, seg.TopKLogProbs, seg.TopK = ids, lps, l.kind.k
}

// lcp is the length of the longest common prefix of a and b.
func lcp(a, b []int32) int {
	n := min(len(a), len(b))
	if n == 0 {
		return 0
	}
	ab := unsafe.Slice((*byte)(unsafe.Pointer(&a[0])), 4*n)
	bb := unsafe.Slice((*byte)(unsafe.Pointer(&b[0])), 4*n)
	if bytes.Equal(ab, bb) {
		return n
	}
	// Narrow down by blocks compared with the runtime's vectorized memequal.
	const block = 256 // int32s
	i := 0
	for i+block <= n && bytes.Equal(ab[4*i:4*(i+block)], bb[4*i:4*(i+block)]) {
		i += block
	}
	for i < n && a[i] == b[i] {
		i++
	}
	return i
}
