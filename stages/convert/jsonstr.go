package convert

import (
	"errors"
	"strconv"
	"strings"
	"unicode/utf16"
	"unicode/utf8"
)

// unquoteJSON decodes a JSON string literal that a JSON decoder has already
// validated (a json.RawMessage beginning with '"'), as encoding/json does:
// escapes resolved, invalid UTF-8 and lone surrogates become U+FFFD. It
// saves a second validating pass over large strings (test patches).
func unquoteJSON(raw []byte) (string, error) {
	if len(raw) < 2 || raw[0] != '"' || raw[len(raw)-1] != '"' {
		return "", errors.New("not a JSON string")
	}
	s := raw[1 : len(raw)-1]
	// Fast path: no escapes and valid UTF-8.
	plain := true
	for _, c := range s {
		if c == '\\' || c < 0x20 {
			plain = false
			break
		}
	}
	if plain && utf8.Valid(s) {
		return string(s), nil
	}
	var out strings.Builder
	out.Grow(len(s))
	for i := 0; i < len(s); {
		c := s[i]
		switch {
		case c == '\\':
			if i+1 >= len(s) {
				return "", errors.New("truncated escape")
			}
			switch e := s[i+1]; e {
			case '"', '\\', '/':
				out.WriteByte(e)
			case 'b':
				out.WriteByte('\b')
			case 'f':
				out.WriteByte('\f')
			case 'n':
				out.WriteByte('\n')
			case 'r':
				out.WriteByte('\r')
			case 't':
				out.WriteByte('\t')
			case 'u':
				r, ok := hex4(s, i+2)
				if !ok {
					return "", errors.New("bad \\u escape")
				}
				i += 6
				if utf16.IsSurrogate(r) {
					if r2, ok := hex4(s, i+2); ok && i+1 < len(s) && s[i] == '\\' && s[i+1] == 'u' {
						if dec := utf16.DecodeRune(r, r2); dec != utf8.RuneError {
							out.WriteRune(dec)
							i += 6
							continue
						}
					}
					r = utf8.RuneError
				}
				out.WriteRune(r)
				continue
			default:
				return "", errors.New("bad escape")
			}
			i += 2
		case c < utf8.RuneSelf:
			if c < 0x20 {
				return "", errors.New("control character in string")
			}
			out.WriteByte(c)
			i++
		default:
			r, size := utf8.DecodeRune(s[i:])
			if r == utf8.RuneError && size == 1 {
				out.WriteRune(utf8.RuneError)
			} else {
				out.Write(s[i : i+size])
			}
			i += size
		}
	}
	return out.String(), nil
}

func hex4(s []byte, at int) (rune, bool) {
	if at+4 > len(s) {
		return 0, false
	}
	v, err := strconv.ParseUint(string(s[at:at+4]), 16, 32)
	if err != nil {
		return 0, false
	}
	return rune(v), true
}
