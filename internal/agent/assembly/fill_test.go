package assembly

import (
	"bytes"
	"encoding/json"
	"testing"
)

// TestFillOnes holds fillOnes to the byte loop it replaces, at every
// length and offset around its eight-byte stores, touching nothing outside
// the slice.
func TestFillOnes(t *testing.T) {
	for n := 0; n <= 40; n++ {
		for off := 0; off < 8; off++ {
			buf := bytes.Repeat([]byte{7}, n+16)
			fillOnes(buf[off : off+n])
			want := bytes.Repeat([]byte{7}, n+16)
			for i := off; i < off+n; i++ {
				want[i] = 1
			}
			if !bytes.Equal(buf, want) {
				t.Fatalf("n=%d off=%d: %v, want %v", n, off, buf, want)
			}
		}
	}
}

// TestTruthy holds truthy's reading of an opened container to the
// definition it replaces: non-empty unless the first byte after white
// space (bytes.TrimLeft with " \t\r\n") closes it.
func TestTruthy(t *testing.T) {
	def := func(raw []byte) bool {
		rest := bytes.TrimLeft(bytes.TrimSpace(raw)[1:], " \t\r\n")
		return len(rest) > 0 && rest[0] != ']' && rest[0] != '}'
	}
	for _, s := range []string{`[]`, `{}`, `[ ]`, "[\t\r\n]", `[ 1]`, `[{"id":"c"}]`, `{ "a":1}`, "{\n}", `[`, `{`, "[ \t", ` [] `, "\v[]", `[ [] ]`} {
		if got, want := truthy(json.RawMessage(s)), def([]byte(s)); got != want {
			t.Errorf("truthy(%q) = %v, want %v", s, got, want)
		}
	}
}

// TestMessageLists: a session hands out its recycled lists once, cleared
// and with the capacity asked for; later pairs are its caller's own.
func TestMessageLists(t *testing.T) {
	arena := &Arena{}
	var first *json.RawMessage
	for round := 0; round < 3; round++ {
		s := NewSession(Options{Arena: arena})
		msgs, heads := s.MessageLists(8)
		if len(msgs) != 0 || len(heads) != 0 || cap(msgs) < 8 || cap(heads) < 8 {
			t.Fatalf("round %d: lists len %d/%d cap %d/%d", round, len(msgs), len(heads), cap(msgs), cap(heads))
		}
		for i, m := range msgs[:cap(msgs)] {
			if h := heads[:cap(heads)][i]; m != nil || h.raw != nil || h.role != "" || h.hasRole || h.tc != 0 {
				t.Fatalf("round %d: recycled list holds entry %d", round, i)
			}
		}
		if round == 0 {
			first = &msgs[:1][0]
		} else if &msgs[:1][0] != first {
			t.Fatalf("round %d: lists not recycled", round)
		}
		more, _ := s.MessageLists(8)
		if &more[:1][0] == &msgs[:1][0] {
			t.Fatal("a second pair shares the first's storage")
		}
		raw := json.RawMessage(`{"role":"user","content":"u"}`)
		msgs = append(msgs, raw)
		h, _, _ := ScanMessage(raw, 0)
		heads = append(heads, h)
		if err := s.Record(Turn{PromptMessages: msgs, PromptHeads: heads, OutputIDs: []int32{1}, ResponseMessage: json.RawMessage(`{"role":"assistant"}`)}); err != nil {
			t.Fatal(err)
		}
		if _, err := s.Segments(Base{}); err != nil {
			t.Fatal(err)
		}
	}
}
