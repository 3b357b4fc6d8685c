// Package gitdiff reads what a unified diff touches: kiln-grade resets a
// test patch's files before applying it (docs/data-and-grading.md §5.5),
// and kiln export writes the same reset into a Harbor verifier (§7.5).
package gitdiff

import (
	"path"
	"regexp"
	"strconv"
	"strings"
)

var (
	diffGitHeader = regexp.MustCompile(`^diff --git (.+)$`)
	fileHeader    = regexp.MustCompile(`^(?:---|\+\+\+) (.+)$`)
	renameHeader  = regexp.MustCompile(`^(?:rename|copy) (?:from|to) (.+)$`)
)

// Paths returns the repository paths a unified diff touches, in first
// seen order: both sides of every file header (git's "diff --git", the
// "---"/"+++" lines with their first component stripped, rename and copy
// lines), git-quoted names unquoted. Paths that are absolute or climb out
// with ".." are left out: they are never reset (git apply and patch refuse
// them anyway).
func Paths(diff string) []string {
	var out []string
	seen := map[string]bool{}
	add := func(p string) {
		p = path.Clean(p)
		if p == "." || p == "/dev/null" || path.IsAbs(p) || p == ".." || strings.HasPrefix(p, "../") || seen[p] {
			return
		}
		seen[p] = true
		out = append(out, p)
	}
	strip := func(s string) (string, bool) {
		s = unquoteGitPath(s)
		if s == "/dev/null" {
			return "", false
		}
		_, rest, ok := strings.Cut(s, "/")
		return rest, ok && rest != ""
	}
	for _, line := range strings.Split(diff, "\n") {
		line = strings.TrimSuffix(line, "\r")
		switch {
		case strings.HasPrefix(line, "diff --git "):
			m := diffGitHeader.FindStringSubmatch(line)
			if a, b, ok := splitGitHeader(m[1]); ok {
				add(a)
				add(b)
			}
		case strings.HasPrefix(line, "--- ") || strings.HasPrefix(line, "+++ "):
			m := fileHeader.FindStringSubmatch(line)
			if m == nil {
				continue
			}
			name := m[1]
			if !strings.HasPrefix(name, `"`) {
				// A tab ends the name in diff(1) output ("--- a/x\t2024-...").
				name, _, _ = strings.Cut(name, "\t")
			}
			if p, ok := strip(name); ok {
				add(p)
			}
		case strings.HasPrefix(line, "rename ") || strings.HasPrefix(line, "copy "):
			if m := renameHeader.FindStringSubmatch(line); m != nil {
				add(unquoteGitPath(m[1]))
			}
		}
	}
	return out
}

// splitGitHeader splits the names of a "diff --git" header when that is
// unambiguous: both quoted, or unquoted with exactly one " b/".
func splitGitHeader(s string) (a, b string, ok bool) {
	if strings.HasPrefix(s, `"`) {
		end := closingQuote(s)
		if end < 0 {
			return "", "", false
		}
		a = unquoteGitPath(s[:end+1])
		b = unquoteGitPath(strings.TrimSpace(s[end+1:]))
	} else {
		if strings.Count(s, " b/") != 1 {
			return "", "", false
		}
		i := strings.Index(s, " b/")
		a, b = s[:i], s[i+1:]
	}
	a, aok := strings.CutPrefix(a, "a/")
	b, bok := strings.CutPrefix(b, "b/")
	return a, b, aok && bok
}

func closingQuote(s string) int {
	for i := 1; i < len(s); i++ {
		switch s[i] {
		case '\\':
			i++
		case '"':
			return i
		}
	}
	return -1
}

// unquoteGitPath undoes git's C-style quoting of unusual file names
// ("\"a/caf\\303\\251\"" is a/café); other names are returned as is.
func unquoteGitPath(s string) string {
	if len(s) >= 2 && s[0] == '"' && s[len(s)-1] == '"' {
		if u, err := strconv.Unquote(s); err == nil {
			return u
		}
	}
	return s
}
