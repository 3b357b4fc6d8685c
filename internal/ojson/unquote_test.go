package ojson

import (
	"encoding/json"
	"math/rand/v2"
	"strings"
	"testing"
)

// unquoteAgrees checks Unquote against encoding/json on one literal:
// the same text where encoding/json reads one, ok false where it refuses.
func unquoteAgrees(t *testing.T, lit []byte) {
	t.Helper()
	if len(lit) < 2 || lit[0] != '"' || lit[len(lit)-1] != '"' {
		if _, ok := Unquote(lit); ok {
			t.Fatalf("Unquote(%q) took what is not one string literal", lit)
		}
		return
	}
	var want string
	err := json.Unmarshal(lit, &want)
	got, ok := Unquote(lit)
	switch {
	case err == nil && !ok:
		t.Fatalf("Unquote(%q) refused what encoding/json reads as %q", lit, want)
	case err == nil && got != want:
		t.Fatalf("Unquote(%q) = %q, encoding/json %q", lit, got, want)
	case err != nil && ok:
		t.Fatalf("Unquote(%q) = %q, encoding/json refuses it: %v", lit, got, err)
	}
}

func TestUnquote(t *testing.T) {
	for _, lit := range []string{
		`""`, `"plain"`, `"a\nb\tc\r\"q\"\\ \/ \b\f"`, `"<think>\n</think>"`,
		`"\u003ctool_call\u003e"`, `"\u00e9\u4e2d"`, `"\ud83d\ude00"`, `"\uD83D\uDE00"`,
		`"\ud83d"`, `"\ude00"`, `"\ud83d\u0041"`, `"\ud83dx"`, `"\ud83d\ud83d\ude00"`,
		`"é中😀"`, "\"\xff\xfe\"", "\"a\xc3\"", "\"\xed\xa0\x80\"", `"\u12"`, `"\u12g4"`,
		`"\x"`, `"\'"`, "\"\x01\"", "\"tab\there\"", `"\"`, `"abc\"`, `"a"b"`, `"`, ``, `x`,
		`"\u0000"`, `"\u001f\u007f"`, "\"\x7f\"",
	} {
		unquoteAgrees(t, []byte(lit))
	}
}

// Random literals over the pieces that matter, against encoding/json.
func TestUnquoteRandom(t *testing.T) {
	pieces := []string{"a", "Z", " ", "<", "é", "中", "😀", `\n`, `\t`, `\"`, `\\`, `\/`, `\b`, `\f`, `\r`,
		`\u0041`, `\u00e9`, `\ud83d`, `\ude00`, `\uD83D\uDE00`, `\u12`, `\x`, `\'`, "\x01", "\x1f", "\x7f",
		"\xff", "\xc3", "\xed\xa0\x80", `"`, `\`}
	rng := rand.New(rand.NewPCG(7, 11))
	for range 20000 {
		var sb strings.Builder
		sb.WriteByte('"')
		for n := rng.IntN(12); n > 0; n-- {
			sb.WriteString(pieces[rng.IntN(len(pieces))])
		}
		sb.WriteByte('"')
		unquoteAgrees(t, []byte(sb.String()))
	}
}

func FuzzUnquote(f *testing.F) {
	for _, s := range []string{`"a\nb"`, `"\ud83d\ude00"`, `"\ud83d"`, "\"\xff\"", `"\u12"`} {
		f.Add([]byte(s))
	}
	f.Fuzz(func(t *testing.T, b []byte) {
		unquoteAgrees(t, b)
	})
}
