// Package shlex quotes words for POSIX shells the way Python's shlex.quote
// does, byte for byte: the grading commands kiln builds are compared with
// the reference implementation's, which builds them with shlex.quote.
package shlex

import "strings"

// Quote returns s as one shell word: s itself when every byte is one of
// [A-Za-z0-9_@%+=:,./-] and s is not empty, else s in single quotes with
// each ' written as '"'"'.
func Quote(s string) string {
	if s == "" {
		return "''"
	}
	for i := 0; i < len(s); i++ {
		if !safe(s[i]) {
			return "'" + strings.ReplaceAll(s, "'", `'"'"'`) + "'"
		}
	}
	return s
}

func safe(c byte) bool {
	return c >= 'a' && c <= 'z' || c >= 'A' && c <= 'Z' || c >= '0' && c <= '9' || strings.IndexByte("_@%+=:,./-", c) >= 0
}
