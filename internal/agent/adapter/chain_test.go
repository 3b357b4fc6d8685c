package adapter

import (
	"math/rand/v2"
	"slices"
	"testing"
)

// TestChain: lists extended from any earlier list (the last one, a
// shorter one, a branch, none), the holders rebased whenever a new array
// takes over, as the adapter does: every list held keeps its elements, and
// a run of extensions of the last list stays in one array.
func TestChain(t *testing.T) {
	self := func(l *[]int) *[]int { return l }
	for seed := range 200 {
		rng := rand.New(rand.NewPCG(uint64(seed), 9))
		var c chain[int]
		var held, want [][]int
		next := 0
		for step := range 60 {
			var prev []int
			switch r := rng.IntN(10); {
			case r < 6 && len(held) > 0: // the last list: the common case
				prev = held[len(held)-1]
			case r < 9 && len(held) > 0: // an earlier list, or a prefix of one (a branch)
				h := held[rng.IntN(len(held))]
				prev = h[:rng.IntN(len(h)+1)]
			}
			var parts [][]int
			for range rng.IntN(3) {
				part := make([]int, rng.IntN(5))
				for i := range part {
					part[i], next = next, next+1
				}
				parts = append(parts, part)
			}
			expect := slices.Concat(append([][]int{prev}, parts...)...)
			list, moved := c.extend(prev, parts...)
			if !slices.Equal(list, expect) || cap(list) != len(list) {
				t.Fatalf("seed %d step %d: extend gave %v (cap %d), want %v", seed, step, list, cap(list), expect)
			}
			if moved {
				rebase(prev, list, viewsOf(held, self))
			}
			held, want = append(held, list), append(want, expect)
			for i := range held {
				if !slices.Equal(held[i], want[i]) {
					t.Fatalf("seed %d step %d: list %d changed to %v, want %v", seed, step, i, held[i], want[i])
				}
			}
		}
	}

	// Extending the last list again and again: one array, however long.
	var c chain[int]
	var held [][]int
	var last []int
	for i := range 1000 {
		list, moved := c.extend(last, []int{i})
		if moved {
			rebase(last, list, viewsOf(held, self))
		}
		held, last = append(held, list), list
	}
	arrays := map[*int]bool{}
	for _, h := range held {
		arrays[&h[0]] = true
	}
	if len(arrays) != 1 {
		t.Fatalf("1000 extensions of the last list are in %d arrays, want one", len(arrays))
	}
}
