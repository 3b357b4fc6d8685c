package convert

import (
	"testing"
	"unicode/utf8"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
)

func TestSplitLinesMatchesPython(t *testing.T) {
	cases := []struct {
		in   string
		want []string
	}{
		{"", nil},
		{"a\nb\n", []string{"a", "b"}},
		{"a\r\nb\rc", []string{"a", "b", "c"}},
		{"a\n\nb", []string{"a", "", "b"}},
		{"a\vb\fc\x1cd\x1de\x1ef\u0085g\u2028h\u2029i", []string{"a", "b", "c", "d", "e", "f", "g", "h", "i"}},
	}
	for _, c := range cases {
		assert.Equal(t, c.want, splitLines(c.in), "%q", c.in)
	}
}

// TestTouchedPaths is docs/data-and-grading.md §6 cases 4 and 5 at the parser.
func TestTouchedPaths(t *testing.T) {
	cases := []struct {
		name, patch string
		want        []string
		err         bool
	}{
		{"rename", "diff --git a/old.py b/new.py\n", []string{"old.py", "new.py"}, false},
		{"first b/ splits", "diff --git a/a b/c.py b/a b/c.py\n", []string{"a", "c.py b/a b/c.py"}, false},
		{"git-quoted header ignored", "diff --git \"a/x y\" \"b/x y\"\n", nil, false},
		{"same path once", "diff --git a/t.py b/t.py\ndiff --git a/t.py b/t.py\n", []string{"t.py"}, false},
		{"not at line start", " diff --git a/x b/x\n", nil, false},
		{"dot component fine", "diff --git a/a/./b b/a/./b\n", []string{"a/./b"}, false},
		{"dotdot prefix fine", "diff --git a/..foo b/..foo\n", []string{"..foo"}, false},
		{"absolute", "diff --git a//etc/passwd b//etc/passwd\n", nil, true},
		{"dotdot", "diff --git a/x/../../y b/x/../../y\n", nil, true},
		{"dotdot in b only", "diff --git a/x b/../y\n", nil, true},
		{"crlf", "diff --git a/x.py b/x.py\r\n", []string{"x.py"}, false},
	}
	for _, c := range cases {
		t.Run(c.name, func(t *testing.T) {
			got, err := touchedPaths(c.patch)
			if c.err {
				require.ErrorIs(t, err, errEscapes)
				assert.ErrorContains(t, err, "Test patch escapes repository")
				return
			}
			require.NoError(t, err)
			assert.Equal(t, c.want, got)
		})
	}
}

func TestEvalCmdQuotedPath(t *testing.T) {
	cmd, err := evalCmd("diff --git a/a b/c.py b/a b/c.py\n", "true")
	require.NoError(t, err)
	// The second path has spaces: quoted inside the script, whose own
	// quoting then escapes those quotes.
	assert.Contains(t, cmd, `if git cat-file -e HEAD:a 2>/dev/null; then git checkout HEAD -- a; else git rm -f --cached -- a >/dev/null 2>&1 || true; rm -f -- a; fi`)
	assert.Contains(t, cmd, `HEAD:'"'"'c.py b/a b/c.py'"'"' 2>/dev/null`)
}

// splitLines splits like Python's str.splitlines (the reference's test
// patch line splitting); the fast touchedPaths is checked against it.
func splitLines(s string) []string {
	var lines []string
	start := 0
	for i := 0; i < len(s); {
		r, size := rune(s[i]), 1
		if r >= 0x80 {
			r, size = utf8.DecodeRuneInString(s[i:])
		}
		switch r {
		case '\n', '\v', '\f', 0x1c, 0x1d, 0x1e, 0x85, 0x2028, 0x2029:
			lines = append(lines, s[start:i])
			i += size
			start = i
		case '\r':
			lines = append(lines, s[start:i])
			i++
			if i < len(s) && s[i] == '\n' {
				i++
			}
			start = i
		default:
			i += size
		}
	}
	if start < len(s) {
		lines = append(lines, s[start:])
	}
	return lines
}

// slowTouchedPaths is the reference algorithm literally: split into lines,
// match each.
func slowTouchedPaths(patch string) ([]string, error) {
	var paths []string
	seen := map[string]bool{}
	for _, line := range splitLines(patch) {
		m := diffHeader.FindStringSubmatch(line)
		if m == nil {
			continue
		}
		for _, p := range m[1:] {
			if escapes(p) {
				return nil, errEscapes
			}
			if !seen[p] {
				seen[p] = true
				paths = append(paths, p)
			}
		}
	}
	return paths, nil
}

func FuzzTouchedPathsMatchesSplitLines(f *testing.F) {
	for _, s := range []string{
		"diff --git a/x b/y\n", "x\rdiff --git a/a b/b\u2028diff --git a/c b/d", "diff --git a/../x b/x",
		"xdiff --git a/a b/a\n", "\u0085diff --git a/é b/é\x1c", "diff --git a/a b/\ndiff --git a/b b/c",
	} {
		f.Add(s)
	}
	f.Fuzz(func(t *testing.T, patch string) {
		want, wantErr := slowTouchedPaths(patch)
		got, err := touchedPaths(patch)
		require.Equal(t, wantErr != nil, err != nil, "%q", patch)
		if err == nil {
			assert.Equal(t, want, got, "%q", patch)
		}
	})
}
