package engine

import (
	"encoding/json"
	"fmt"
	"math/rand/v2"
	"slices"
	"strings"
	"testing"
)

// TestMemo: a memo never changes what a reply says. Replies are random
// renders of one growing conversation — extensions, prefixes of an earlier
// one, edits anywhere, ids that differ only in their last digits, spacing
// styles — and each is scanned through one memo and without it.
func TestMemo(t *testing.T) {
	format := func(ids []int32, sep string) string {
		var sb strings.Builder
		sb.WriteString(`{"count":`)
		fmt.Fprint(&sb, len(ids))
		sb.WriteString(`,"tokens":[`)
		for k, id := range ids {
			if k > 0 {
				sb.WriteString(sep)
			}
			fmt.Fprint(&sb, id)
		}
		sb.WriteString(`],"max_model_len":4096}`)
		return sb.String()
	}
	for seed := range 200 {
		rng := rand.New(rand.NewPCG(uint64(seed), 7))
		var memo Memo
		conv := []int32{}
		sep := []string{",", ", ", ",\n  "}[seed%3]
		var earlier, results [][]int32
		for step := range 40 {
			var ids []int32
			switch r := rng.IntN(10); {
			case r < 5 || len(conv) == 0: // the conversation grows
				for range 1 + rng.IntN(30) {
					conv = append(conv, int32(rng.IntN(300)))
				}
				ids = conv
			case r < 7: // a render of fewer messages
				ids = conv[:rng.IntN(len(conv)+1)]
			case r < 8 && len(earlier) > 0: // an older render again
				ids = earlier[rng.IntN(len(earlier))]
			default: // an edit: one id changed, often by a digit appended or dropped
				ids = slices.Clone(conv)
				k := rng.IntN(len(ids))
				switch rng.IntN(3) {
				case 0:
					ids[k] = ids[k]*10 + int32(rng.IntN(10))
				case 1:
					ids[k] /= 10
				default:
					ids[k] = int32(rng.IntN(300))
				}
				if rng.IntN(2) == 0 {
					conv = ids
				}
			}
			earlier = append(earlier, slices.Clone(ids))
			body := []byte(format(ids, sep))
			want, _, err1 := readTokenize(body, nil)
			got, _, err2 := readTokenize(body, &memo)
			if err1 != nil || err2 != nil || !slices.Equal(got, want) || !slices.Equal(got, ids) {
				t.Fatalf("seed %d step %d: memo gave %v (%v), plain %v (%v), sent %v", seed, step, got, err2, want, err1, ids)
			}
			if cap(got) != len(got) {
				t.Fatalf("seed %d step %d: result of %d ids has capacity %d: an append to it would write shared memory", seed, step, len(got), cap(got))
			}
			results = append(results, got)
		}
		// Results may share memory with the memo: no later scan wrote it.
		for k, got := range results {
			if !slices.Equal(got, earlier[k]) {
				t.Fatalf("seed %d: result %d changed to %v after later scans, was %v", seed, k, got, earlier[k])
			}
		}
	}
}

// TestMemoSharesGrowth: the renders of a growing conversation share one
// array until it is full, so a session's kept prompts cost about its
// longest one; a render that changes an earlier id gets an array of its
// own and leaves the shared one as it was.
func TestMemoSharesGrowth(t *testing.T) {
	var memo Memo
	list := func(ids []int32) []byte {
		b, _ := json.Marshal(ids)
		return b
	}
	conv := make([]int32, 0, 4096)
	for k := range 1000 {
		conv = append(conv, int32(k%251))
	}
	first, ok := memo.scan(list(conv))
	if !ok {
		t.Fatal("first render refused")
	}
	var kept [][]int32
	arrays := map[*int32]bool{}
	for turn := range 20 {
		conv = append(conv, int32(turn), 7, 8, 9)
		got, ok := memo.scan(list(conv))
		if !ok || !slices.Equal(got, conv) {
			t.Fatalf("turn %d: %v %v", turn, ok, got)
		}
		kept = append(kept, got)
		arrays[&got[0]] = true
	}
	// 1000 ids grow by 80: within the first array's room (half again).
	if len(arrays) != 1 || !arrays[&first[0]] {
		t.Fatalf("20 extensions used %d arrays (first shared: %v), want the first one", len(arrays), arrays[&first[0]])
	}
	edited := slices.Clone(conv)
	edited[500] = 9999
	got, ok := memo.scan(list(edited))
	if !ok || !slices.Equal(got, edited) || &got[0] == &first[0] {
		t.Fatalf("edited render: ok %v, same array %v", ok, &got[0] == &first[0])
	}
	for k, ids := range kept {
		if ids[500] != int32(500%251) {
			t.Fatalf("kept render %d changed by a later edited render", k)
		}
	}
}

// TestMemoKeepsLongest: a render of fewer messages does not replace the
// remembered conversation, and a malformed reply neither replaces it nor
// borrows from it.
func TestMemoKeepsLongest(t *testing.T) {
	var memo Memo
	scan := func(s string) ([]int32, bool) {
		ids, ok := memo.scan([]byte(s))
		return ids, ok
	}
	if _, ok := scan(`[10,20,30,40]`); !ok {
		t.Fatal("first list refused")
	}
	if ids, ok := scan(`[10,20]`); !ok || !slices.Equal(ids, []int32{10, 20}) {
		t.Fatalf("prefix: %v %v", ids, ok)
	}
	if string(memo.raw) != `[10,20,30,40]` {
		t.Fatalf("a prefix replaced the memo: %s", memo.raw)
	}
	if ids, ok := scan(`[]`); !ok || ids == nil || len(ids) != 0 {
		t.Fatalf("empty list: %#v %v", ids, ok)
	}
	for _, bad := range []string{`[10,20,30,4x]`, `[10,20,30,-4]`, `[10,20,30,]`, `[10,20,30,40`} {
		if ids, ok := scan(bad); ok {
			t.Errorf("%s: accepted as %v", bad, ids)
		}
	}
	if string(memo.raw) != `[10,20,30,40]` {
		t.Fatalf("a malformed list replaced the memo: %s", memo.raw)
	}
	if ids, ok := scan(`[10,20,30,400,5]`); !ok || !slices.Equal(ids, []int32{10, 20, 30, 400, 5}) {
		t.Fatalf("extension with a longer last id: %v %v", ids, ok)
	}
}

// TestMemoPrompt: a generate body written through a memo says the ids it
// was given: from the reply's bytes when they are the remembered render's
// own array, formatted otherwise.
func TestMemoPrompt(t *testing.T) {
	var memo Memo
	reply := []byte(`{"count":4,"tokens":[7, 80,  9,1000],"max_model_len":64}`)
	render, _, err := readTokenize(reply, &memo)
	if err != nil {
		t.Fatalf("reply refused: %v", err)
	}
	decode := func(body []byte) []int32 {
		var ids []int32
		if err := json.Unmarshal(body, &ids); err != nil {
			t.Fatalf("%s: %v", body, err)
		}
		return ids
	}
	for _, c := range []struct {
		name     string
		ids      []int32
		verbatim bool
	}{
		{"the render itself", render, true},
		{"a copy of it", slices.Clone(render), false},
		{"a prefix of it", render[:2], false},
		{"another prompt", []int32{1, 2, 3}, false},
	} {
		body := memo.appendPrompt(nil, c.ids)
		if got := decode(body); !slices.Equal(got, c.ids) {
			t.Errorf("%s: body %s says %v", c.name, body, got)
		}
		if verbatim := string(body) == `[7, 80,  9,1000]`; verbatim != c.verbatim {
			t.Errorf("%s: body %s, written from the reply: %v, want %v", c.name, body, verbatim, c.verbatim)
		}
	}
}
