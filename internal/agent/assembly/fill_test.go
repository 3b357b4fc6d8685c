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
