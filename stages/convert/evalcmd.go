package convert

import (
	"encoding/base64"
	"errors"
	"fmt"
	"regexp"
	"strings"
	"unicode/utf8"

	"github.com/kilnrl/kiln/internal/shlex"
)

// errEscapes is the reference's error text for a test patch naming a path
// outside the repository (docs/data-and-grading.md §1.4).
var errEscapes = errors.New("Test patch escapes repository")

// diffHeader matches a `diff --git a/<A> b/<B>` header the way the reference
// does: A is the shortest match, B the rest of the line. Git-quoted headers
// ("a/x y") do not match, so those paths are not reset (a reference quirk
// kept on purpose).
var diffHeader = regexp.MustCompile(`^diff --git a/(.+?) b/(.+)$`)

// touchedPaths lists the A and B paths of every diff --git header of a test
// patch, in order, each once. It fails with errEscapes when a path is
// absolute or has a ".." component. Lines are as Python's splitlines makes
// them; only lines starting "diff --git a/" are looked at, found directly
// rather than by splitting the whole patch (TestTouchedPathsMatchesSplitLines
// checks the two agree).
func touchedPaths(patch string) ([]string, error) {
	var paths []string
	seen := map[string]bool{}
	const prefix = "diff --git a/"
	for from := 0; ; {
		i := strings.Index(patch[from:], prefix)
		if i < 0 {
			return paths, nil
		}
		i += from
		from = i + len(prefix)
		if i > 0 && !endsWithLineBreak(patch[:i]) {
			continue
		}
		line := patch[i:]
		if end := lineBreak(line); end >= 0 {
			line = line[:end]
		}
		m := diffHeader.FindStringSubmatch(line)
		if m == nil {
			continue
		}
		for _, p := range m[1:] {
			if escapes(p) {
				return nil, fmt.Errorf("%w: path %q in a diff --git header is absolute or has a \"..\" component", errEscapes, p)
			}
			if !seen[p] {
				seen[p] = true
				paths = append(paths, p)
			}
		}
	}
}

// isBreak reports whether r ends a line for Python's splitlines.
func isBreak(r rune) bool {
	switch r {
	case '\n', '\r', '\v', '\f', 0x1c, 0x1d, 0x1e, 0x85, 0x2028, 0x2029:
		return true
	}
	return false
}

func endsWithLineBreak(s string) bool {
	r, _ := utf8.DecodeLastRuneInString(s)
	return isBreak(r)
}

// lineBreak is the index of the first line break in s, or -1.
func lineBreak(s string) int {
	for i := 0; i < len(s); {
		c := s[i]
		if c < utf8.RuneSelf {
			if c <= 0x1e && isBreak(rune(c)) {
				return i
			}
			i++
			continue
		}
		r, size := utf8.DecodeRuneInString(s[i:])
		if isBreak(r) {
			return i
		}
		i += size
	}
	return -1
}

// escapes reports whether a patch path leaves the repository: absolute, or
// with a component exactly "..". "a/./b" and "..foo" stay inside.
func escapes(p string) bool {
	if strings.HasPrefix(p, "/") {
		return true
	}
	for _, c := range strings.Split(p, "/") {
		if c == ".." {
			return true
		}
	}
	return false
}

// evalCmd builds the MiMo grading command (docs/data-and-grading.md §1.4): under a
// login bash with set -e, reset every path the test patch touches to HEAD
// (or delete it when HEAD lacks it), apply the test patch, run the test
// command. Its exit status is the verdict. The result is
// "bash -lc " + shlex.Quote(script), written in one pass: the script always
// needs quoting (it has spaces), so it goes between single quotes with each
// ' written as '"'"'.
func evalCmd(testPatch, testCommand string) (string, error) {
	paths, err := touchedPaths(testPatch)
	if err != nil {
		return "", err
	}
	b64 := base64.StdEncoding.EncodedLen(len(testPatch))
	var b strings.Builder
	b.Grow(b64 + len(testCommand) + 256*(len(paths)+1))
	b.WriteString("bash -lc '")
	q := quotedWriter{&b}
	q.WriteString("set -e\n")
	for _, p := range paths {
		qp := shlex.Quote(p)
		q.WriteString("if git cat-file -e HEAD:" + qp + " 2>/dev/null; then git checkout HEAD -- " + qp +
			"; else git rm -f --cached -- " + qp + " >/dev/null 2>&1 || true; rm -f -- " + qp + "; fi\n")
	}
	q.WriteString("printf %s ")
	if testPatch == "" {
		q.WriteString(shlex.Quote(""))
	} else {
		// The base64 alphabet is all shell-safe: unquoted, as shlex.quote
		// leaves it, and free of single quotes.
		buf := make([]byte, b64)
		base64.StdEncoding.Encode(buf, []byte(testPatch))
		b.Write(buf)
	}
	q.WriteString(" | base64 -d > /tmp/mimo-tests.patch\ngit apply --verbose /tmp/mimo-tests.patch\n")
	q.WriteString(testCommand)
	b.WriteByte('\'')
	return b.String(), nil
}

// quotedWriter writes text inside a single-quoted shell word.
type quotedWriter struct{ b *strings.Builder }

func (q quotedWriter) WriteString(s string) {
	for {
		i := strings.IndexByte(s, '\'')
		if i < 0 {
			q.b.WriteString(s)
			return
		}
		q.b.WriteString(s[:i])
		q.b.WriteString(`'"'"'`)
		s = s[i+1:]
	}
}
