package shlex

import (
	"os/exec"
	"strings"
	"testing"
)

// TestQuote: the cases of the reference's grading commands, without
// Python at hand.
func TestQuote(t *testing.T) {
	cases := map[string]string{
		"":                   "''",
		"tests/test_x.py":    "tests/test_x.py",
		"a-b_c@d%e+f=g:h,i.": "a-b_c@d%e+f=g:h,i.",
		"x y":                "'x y'",
		"echo 'hi'":          `'echo '"'"'hi'"'"''`,
		"é":                  "'é'",
		"$HOME":              "'$HOME'",
	}
	for in, want := range cases {
		if got := Quote(in); got != want {
			t.Errorf("Quote(%q) = %q, want %q", in, got, want)
		}
	}
}

// TestQuoteMatchesPython holds Quote to Python's shlex.quote on the same
// words: the safe set's edges, quotes, non-ASCII and control bytes.
func TestQuoteMatchesPython(t *testing.T) {
	words := []string{"", "a", "A-Z_0.9/x", "@%+=:,./-", "a b", "it's", "'", "$HOME", "*", "~x", "é", "tab\there", "new\nline", "\x7f", "a\"b", "!", "x;y"}
	py, err := exec.LookPath("python3")
	if err != nil {
		t.Skip("python3 is not installed")
	}
	// Words in and quoted words out, each ended by a NUL byte.
	cmd := exec.Command(py, "-c", `import shlex, sys
for w in sys.stdin.buffer.read().split(b"\0")[:-1]:
    sys.stdout.buffer.write(shlex.quote(w.decode()).encode() + b"\0")`)
	cmd.Stdin = strings.NewReader(strings.Join(words, "\x00") + "\x00")
	out, err := cmd.Output()
	if err != nil {
		t.Fatal(err)
	}
	want := strings.Split(string(out), "\x00")
	if len(want) != len(words)+1 {
		t.Fatalf("python3 quoted %d words of %d", len(want)-1, len(words))
	}
	for i, w := range words {
		if got := Quote(w); got != want[i] {
			t.Errorf("Quote(%q) = %q, shlex.quote gives %q", w, got, want[i])
		}
	}
}
