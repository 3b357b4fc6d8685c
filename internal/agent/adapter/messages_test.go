package adapter

import (
	"encoding/json"
	"fmt"
	"math/rand/v2"
	"slices"
	"testing"
	"unsafe"
)

// TestMessageStore: every turn's stored messages join to exactly the
// array of the messages it was given (the plain definition, joinArray of
// the request's list), whatever happened between turns — a history that
// grows, the same slices handed back, equal bytes in new memory, an edit
// anywhere, messages dropped or inserted, other bytes re-sliced into the
// memory a message had — and a growing history keeps each distinct
// message once, its turns' lists in one array.
func TestMessageStore(t *testing.T) {
	for seed := range 300 {
		rng := rand.New(rand.NewPCG(uint64(seed), 3))
		var store messageStore
		var want []string
		var hist []json.RawMessage
		msg := func(k int) json.RawMessage {
			return json.RawMessage(fmt.Sprintf(`{"role":"user","content":"m%d-%d"}`, k, rng.IntN(1000)))
		}
		for turn := range 30 {
			next := slices.Clone(hist) // the same slices: a History hands back an unchanged history
			switch r := rng.IntN(10); {
			case r < 5 || len(next) == 0: // grows
				for range 1 + rng.IntN(3) {
					next = append(next, msg(len(next)))
				}
			case r < 6: // equal bytes in new memory (a client resends, a fresh decode)
				for i := range next {
					next[i] = slices.Clone(next[i])
				}
			case r < 7: // an edit
				next[rng.IntN(len(next))] = msg(-1)
			case r < 8: // a message dropped (compaction)
				k := rng.IntN(len(next))
				next = slices.Delete(next, k, k+1+rng.IntN(len(next)-k))
				if len(next) == 0 {
					next = append(next, msg(0))
				}
			case r < 9: // inserted
				k := rng.IntN(len(next) + 1)
				next = slices.Insert(next, k, msg(k))
			default: // other bytes in the memory a message had: new slice headers
				// over a buffer that holds other text at the same offsets
				k := rng.IntN(len(next))
				buf := append([]byte(nil), next[k]...)
				buf[len(buf)-3] ^= 1
				next[k] = buf
			}
			hist = next
			store.record(hist)
			want = append(want, joinArray(hist))
			for i := range turn + 1 {
				if got := joinArray(store.turns[i]); got != want[i] {
					t.Fatalf("seed %d turn %d: stored turn %d joins to\n%s\nwant\n%s", seed, turn, i, got, want[i])
				}
			}
		}
	}

	// A growing history: one stored copy of each message.
	var store messageStore
	var hist []json.RawMessage
	for k := range 50 {
		hist = append(slices.Clone(hist), json.RawMessage(fmt.Sprintf(`{"role":"tool","content":"result %d"}`, k)))
		if k%2 == 0 { // and every other turn the history arrives in new memory
			for i := range hist {
				hist[i] = slices.Clone(hist[i])
			}
		}
		store.record(hist)
	}
	arrays := map[*byte]bool{}
	for _, msgs := range store.turns {
		for _, m := range msgs {
			arrays[unsafe.SliceData(m)] = true
		}
	}
	if len(arrays) != 50 {
		t.Fatalf("50 turns of a growing 50-message history stored %d message copies, want 50", len(arrays))
	}
	lists := map[*json.RawMessage]bool{}
	for _, msgs := range store.turns {
		lists[unsafe.SliceData(msgs)] = true
	}
	if len(lists) != 1 {
		t.Fatalf("the 50 turns' message lists are in %d arrays, want one (each list begins with the last)", len(lists))
	}
	for _, m := range store.turns[len(store.turns)-1] {
		for _, given := range hist {
			if unsafe.SliceData(m) == unsafe.SliceData(given) {
				t.Fatal("the store holds the caller's memory")
			}
		}
	}
}
