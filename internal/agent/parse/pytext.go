package parse

import (
	"strings"
	"unicode"
	"unicode/utf8"
)

// isPySpace reports whether r is whitespace to Python's str.isspace / the
// re module's \s on str patterns (Unicode White_Space plus the ASCII
// separators U+001C..U+001F, which Python counts and Go does not).
func isPySpace(r rune) bool {
	return unicode.IsSpace(r) || (r >= 0x1c && r <= 0x1f)
}

// pyStrip is Python's str.strip().
func pyStrip(s string) string { return strings.TrimFunc(s, isPySpace) }

// pyLStrip is Python's str.lstrip().
func pyLStrip(s string) string { return strings.TrimLeftFunc(s, isPySpace) }

// skipPySpace returns the index of the first non-whitespace rune at or
// after i.
func skipPySpace(s string, i int) int {
	for i < len(s) {
		r, size := utf8.DecodeRuneInString(s[i:])
		if !isPySpace(r) {
			return i
		}
		i += size
	}
	return i
}

// trimPySpaceRight returns the end of s[:end] without trailing whitespace.
func trimPySpaceRight(s string, end int) int {
	for end > 0 {
		r, size := utf8.DecodeLastRuneInString(s[:end])
		if !isPySpace(r) {
			return end
		}
		end -= size
	}
	return end
}

// indexFrom is strings.Index starting at byte offset from (-1 if absent).
func indexFrom(s, sub string, from int) int {
	if from > len(s) {
		return -1
	}
	i := strings.Index(s[from:], sub)
	if i < 0 {
		return -1
	}
	return from + i
}

func hexVal(c byte) rune {
	switch {
	case c >= '0' && c <= '9':
		return rune(c - '0')
	case c >= 'a' && c <= 'f':
		return rune(c-'a') + 10
	case c >= 'A' && c <= 'F':
		return rune(c-'A') + 10
	}
	return -1
}

// hex4 decodes four hex digits at s[i:].
func hex4(s string, i int) (rune, bool) {
	if i+4 > len(s) {
		return 0, false
	}
	var r rune
	for j := 0; j < 4; j++ {
		h := hexVal(s[i+j])
		if h < 0 {
			return 0, false
		}
		r = r<<4 | h
	}
	return r, true
}
