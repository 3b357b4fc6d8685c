package assembly

import (
	"unsafe"

	"github.com/kilnrl/kiln/formats/records"
)

// Arena hands out the token, mask and logprob slices of segments, and the
// segment lists themselves, from a few large chunks, so assembling a stream
// of sessions does not allocate (and zero, and fault in) fresh memory for
// every segment. Segments built from an arena, and the lists that hold
// them, stay valid until its Reset: a caller that writes segments in
// batches resets the arena after each batch is written. A nil *Arena
// allocates from the heap. Not safe for concurrent use.
//
// Why it stays (issue 37 measured it side by side): BenchmarkAssemble's 250
// sessions, in the thread CPU the benchmark reads (2026-12-03, load ~25),
// assembled at 1,987 Mtok/s, 2.48x the copy of their token arrays, with
// the arena and ScanMessage's heads (head.go); at 1,055 Mtok/s, 4.45x,
// with segments from the heap (Options.Arena nil); at 463 Mtok/s, 9.8x,
// with neither. The goal is <= 3x the copy. Command:
//
//	go test ./stages/rollout -run '^$' -bench 'Assemble$/250' -benchtime 1x
type Arena struct {
	i32 chunks[int32]
	u8  chunks[uint8]
	f32 chunks[float32]
	// The segment lists Segments returns (a few segments a session).
	segs chunks[records.Trajectory]

	// The routing trees' slabs, recycled from one session to the next (a
	// session's tree is garbage once Segments has linearized it).
	nodes slabs[node]
	kids  slabs[*node]
	turns slabs[turn]
	// spare is the last linearized session's scratch, for the next session
	// (NewSession); nil while a session holds it.
	spare *scratch
}

// slabs is a free list of fixed-capacity chunks.
type slabs[T any] struct{ free [][]T }

// get returns an empty chunk of capacity n (a recycled one if any).
func (s *slabs[T]) get(n int) []T {
	if s == nil {
		return make([]T, 0, n)
	}
	if k := len(s.free); k > 0 {
		c := s.free[k-1]
		s.free = s.free[:k-1]
		return c[:0]
	}
	return make([]T, 0, n)
}

// put takes chunks back, cleared (so they hold no references). Only a
// chunk's first len(c) elements are cleared: the slabs write a chunk front
// to back, only below its length, so the rest is still zero (as get hands
// it out, and as newNode relies on).
func (s *slabs[T]) put(cs [][]T) {
	if s == nil {
		return
	}
	for _, c := range cs {
		clear(c)
		s.free = append(s.free, c)
	}
}

func (a *Arena) nodeSlabs() *slabs[node] {
	if a == nil {
		return nil
	}
	return &a.nodes
}

func (a *Arena) kidSlabs() *slabs[*node] {
	if a == nil {
		return nil
	}
	return &a.kids
}

func (a *Arena) turnSlabs() *slabs[turn] {
	if a == nil {
		return nil
	}
	return &a.turns
}

// Reset makes all memory handed out reusable: segments built before must
// no longer be used.
func (a *Arena) Reset() {
	if a != nil {
		a.i32.reset()
		a.u8.reset()
		a.f32.reset()
		// Segments reference memory the arena does not own (reward,
		// routed experts, replay columns): cleared, so the arena keeps
		// no written shard alive.
		a.segs.clearUsed()
		a.segs.reset()
	}
}

// arenaChunk is the smallest chunk of tokens, masks or logprobs, in
// elements.
const arenaChunk = 1 << 20

// chunks is a list of buffers used front to back; reset rewinds to the
// first and keeps them all.
type chunks[T any] struct {
	bufs [][]T
	at   int // buffer in use
	off  int // first free element of bufs[at]
}

// take returns n elements of unspecified content, with capacity n, from a
// buffer of at least least elements (a new buffer when none has room). A
// slice of numbers (tokens, masks, logprobs) starts on a 64-byte boundary
// (chunks are large allocations, page aligned): the vectorized compares and
// copies of segment tokens against the turns' arrays, themselves aligned,
// then never straddle cache lines on one side only.
func (c *chunks[T]) take(n, least int) []T {
	var zero T
	if a := 64 / int(unsafe.Sizeof(zero)); a > 1 {
		c.off = (c.off + a - 1) / a * a
	}
	for c.at < len(c.bufs) && c.off+n > len(c.bufs[c.at]) {
		c.at++
		c.off = 0
	}
	if c.at == len(c.bufs) {
		c.bufs = append(c.bufs, make([]T, max(n, least)))
	}
	s := c.bufs[c.at][c.off : c.off+n : c.off+n]
	c.off += n
	return s
}

func (c *chunks[T]) reset() { c.at, c.off = 0, 0 }

// clearUsed zeroes every element handed out since the last reset.
func (c *chunks[T]) clearUsed() {
	for i := range min(c.at, len(c.bufs)) {
		clear(c.bufs[i])
	}
	if c.at < len(c.bufs) {
		clear(c.bufs[c.at][:c.off])
	}
}

func (a *Arena) int32s(n int) []int32 {
	if a == nil {
		return make([]int32, n)
	}
	return a.i32.take(n, arenaChunk)
}

// uint8s and float32s, like int32s, return n elements of unspecified
// content: the caller writes every one.
func (a *Arena) uint8s(n int) []uint8 {
	if a == nil {
		return make([]uint8, n)
	}
	return a.u8.take(n, arenaChunk)
}

func (a *Arena) float32s(n int) []float32 {
	if a == nil {
		return make([]float32, n)
	}
	return a.f32.take(n, arenaChunk)
}

// trajectories returns n segments of unspecified content, for Segments'
// result: the caller writes every one.
func (a *Arena) trajectories(n int) []records.Trajectory {
	if a == nil {
		return make([]records.Trajectory, n)
	}
	return a.segs.take(n, 256)
}
