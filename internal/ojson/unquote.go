package ojson

import (
	"unicode/utf16"
	"unicode/utf8"
)

// Unquote decodes the string literal b (its quotes included) to the text
// encoding/json gives for it: escapes decoded, a \u escape of a lone or
// mismatched surrogate and every byte of invalid UTF-8 replaced by U+FFFD.
// ok is false for a literal encoding/json refuses (a control byte, an
// unknown escape, a short \u escape, a missing quote) — the caller's
// encoding/json fallback words that error. Text without escapes or bytes
// to replace is one conversion.
func Unquote(b []byte) (s string, ok bool) { return unquote(b, false) }

// unquote is Unquote; lenient takes raw control characters as they are
// (Python's json.loads(strict=False)).
func unquote(b []byte, lenient bool) (s string, ok bool) {
	if len(b) < 2 || b[0] != '"' || b[len(b)-1] != '"' {
		return "", false
	}
	in := b[1 : len(b)-1]
	i := 0
	for i < len(in) {
		c := in[i]
		if c == '\\' || c == '"' || c < 0x20 || c >= utf8.RuneSelf {
			break
		}
		i++
	}
	if i == len(in) {
		return string(in), true
	}
	out := make([]byte, 0, len(in)+8)
	out = append(out, in[:i]...)
	for i < len(in) {
		c := in[i]
		switch {
		case c == '"' || (c < 0x20 && !lenient):
			return "", false
		case c == '\\':
			if i+1 >= len(in) {
				return "", false
			}
			switch e := in[i+1]; e {
			case '"', '\\', '/':
				out, i = append(out, e), i+2
			case 'b':
				out, i = append(out, '\b'), i+2
			case 'f':
				out, i = append(out, '\f'), i+2
			case 'n':
				out, i = append(out, '\n'), i+2
			case 'r':
				out, i = append(out, '\r'), i+2
			case 't':
				out, i = append(out, '\t'), i+2
			case 'u':
				r, ok := hex4(in, i+2)
				if !ok {
					return "", false
				}
				i += 6
				if utf16.IsSurrogate(r) {
					r2, ok := rune(-1), false
					if i+1 < len(in) && in[i] == '\\' && in[i+1] == 'u' {
						r2, ok = hex4(in, i+2)
					}
					if dec := utf16.DecodeRune(r, r2); ok && dec != utf8.RuneError {
						r, i = dec, i+6
					} else {
						r = utf8.RuneError
					}
				}
				out = utf8.AppendRune(out, r)
			default:
				return "", false
			}
		case c < utf8.RuneSelf:
			// A run of plain bytes at once.
			j := i + 1
			for j < len(in) && in[j] >= 0x20 && in[j] < utf8.RuneSelf && in[j] != '\\' && in[j] != '"' {
				j++
			}
			out, i = append(out, in[i:j]...), j
		default:
			r, size := utf8.DecodeRune(in[i:])
			if r == utf8.RuneError && size == 1 {
				out = utf8.AppendRune(out, utf8.RuneError)
			} else {
				out = append(out, in[i:i+size]...)
			}
			i += size
		}
	}
	return string(out), true
}

// hex4 reads the four hex digits of a \u escape at b[i:].
func hex4(b []byte, i int) (rune, bool) {
	if i+4 > len(b) {
		return 0, false
	}
	var r rune
	for _, c := range b[i : i+4] {
		switch {
		case '0' <= c && c <= '9':
			c -= '0'
		case 'a' <= c && c <= 'f':
			c = c - 'a' + 10
		case 'A' <= c && c <= 'F':
			c = c - 'A' + 10
		default:
			return 0, false
		}
		r = r*16 + rune(c)
	}
	return r, true
}
