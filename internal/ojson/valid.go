package ojson

// Valid reports whether data is one JSON value, white space around it
// aside, exactly as encoding/json's Valid does: the RFC 8259 grammar,
// containers nested at most MaxDepth deep, string bytes taken as they are
// (invalid UTF-8 included; control bytes refused). FuzzValid holds it to
// encoding/json's answers.
//
// Its one reader is kiln-rollout's turns reader (stages/rollout/turnjson.go,
// kept by measurement), which checks the values it does not decode with
// ValidValue and ValidArrayTail. Why not json.Valid there: kiln-rollout
// assemble --turns-jsonl on the 198 MB file of BenchmarkAssembleJSONL, 15
// alternating rounds of the built binaries, 2026-12-03, load ~3.3 on 2
// cores: median 0.41 s wall (0.39-0.71), 0.39 s CPU with these; 0.46 s
// wall (0.41-0.62), 0.43 s CPU with ojson.ValueEnd + json.Valid and a
// json.Valid check of each number: 12% of the stage. Command (the binary
// timed with /usr/bin/time on the benchmark's file):
//
//	KILN_BENCH_TURNS_SESSIONS=20 go test ./stages/rollout -run '^$' -bench AssembleJSONL -benchtime 1x -timeout 30m
func Valid(data []byte) bool {
	i := validValue(data, Space(data, 0), 0)
	return i >= 0 && Space(data, i) == len(data)
}

// ValidValue returns the index after the JSON value at b[i] as Valid
// checks it, nested inside depth containers (which count towards
// MaxDepth), or -1. Readers that walk an object themselves (WalkObject)
// check its values with it, and may leave out one they check otherwise.
func ValidValue(b []byte, i, depth int) int { return validValue(b, i, depth) }

// ValidArrayTail checks the rest of an array from just after one of its
// elements (b[i]: white space, then ',' and an element, again, or the
// closing ']') and returns the index after the array, or -1; depth is
// that of its elements. A reader that has already checked an array's
// first elements (kiln-rollout's turns reader, whose prompt_messages
// extend the previous line's) checks only the rest with it.
func ValidArrayTail(b []byte, i, depth int) int {
	for {
		if i = Space(b, i); i >= len(b) {
			return -1
		}
		switch b[i] {
		case ']':
			return i + 1
		case ',':
			if i = validValue(b, Space(b, i+1), depth); i < 0 {
				return -1
			}
		default:
			return -1
		}
	}
}

// NumberEnd returns the index after the JSON number at b[i]
// (-?(0|[1-9][0-9]*)(\.[0-9]+)?([eE][+-]?[0-9]+)?), or -1.
func NumberEnd(b []byte, i int) int {
	if i >= len(b) {
		return -1
	}
	return validNumber(b, i)
}

// validValue returns the index after the value at data[i], or -1. depth
// is how many containers enclose it.
func validValue(b []byte, i, depth int) int {
	if i >= len(b) {
		return -1
	}
	switch c := b[i]; {
	case c == '{':
		if depth >= MaxDepth {
			return -1
		}
		i = Space(b, i+1)
		if i < len(b) && b[i] == '}' {
			return i + 1
		}
		for {
			if i >= len(b) || b[i] != '"' {
				return -1
			}
			if i = validString(b, i); i < 0 {
				return -1
			}
			if i = Space(b, i); i >= len(b) || b[i] != ':' {
				return -1
			}
			if i = validValue(b, Space(b, i+1), depth+1); i < 0 {
				return -1
			}
			if i = Space(b, i); i >= len(b) {
				return -1
			}
			switch b[i] {
			case ',':
				i = Space(b, i+1)
			case '}':
				return i + 1
			default:
				return -1
			}
		}
	case c == '[':
		if depth >= MaxDepth {
			return -1
		}
		i = Space(b, i+1)
		if i < len(b) && b[i] == ']' {
			return i + 1
		}
		if i = validValue(b, i, depth+1); i < 0 {
			return -1
		}
		return ValidArrayTail(b, i, depth+1)
	case c == '"':
		return validString(b, i)
	case c == 't':
		return validWord(b, i, "true")
	case c == 'f':
		return validWord(b, i, "false")
	case c == 'n':
		return validWord(b, i, "null")
	case c == '-' || (c >= '0' && c <= '9'):
		return validNumber(b, i)
	}
	return -1
}

func validWord(b []byte, i int, w string) int {
	if len(b)-i < len(w) || string(b[i:i+len(w)]) != w {
		return -1
	}
	return i + len(w)
}

// validString returns the index after the string literal at b[i] (a '"'),
// or -1: no control byte, escapes among \" \\ \/ \b \f \n \r \t \uXXXX.
func validString(b []byte, i int) int {
	for i++; i < len(b); i++ {
		// Message text is most of the bytes a turns file holds: run over
		// the plain ones before looking at one (AssembleJSONL).
		for i < len(b) && strPlain[b[i]] {
			i++
		}
		if i >= len(b) {
			break
		}
		switch c := b[i]; {
		case c == '"':
			return i + 1
		case c < 0x20:
			return -1
		case c == '\\':
			if i++; i >= len(b) {
				return -1
			}
			switch b[i] {
			case '"', '\\', '/', 'b', 'f', 'n', 'r', 't':
			case 'u':
				if len(b)-i <= 4 {
					return -1
				}
				for _, h := range b[i+1 : i+5] {
					if !(h >= '0' && h <= '9' || h >= 'a' && h <= 'f' || h >= 'A' && h <= 'F') {
						return -1
					}
				}
				i += 4
			default:
				return -1
			}
		}
	}
	return -1
}

// strPlain marks the bytes a JSON string holds as they are: not a quote,
// a backslash or a control byte (UTF-8 is not checked, as encoding/json's
// Valid does not). Read only.
var strPlain = func() (t [256]bool) {
	for c := 0x20; c < 256; c++ {
		t[c] = c != '"' && c != '\\'
	}
	return t
}()

// validNumber returns the index after the number at b[i], or -1:
// -?(0|[1-9][0-9]*)(\.[0-9]+)?([eE][+-]?[0-9]+)?
func validNumber(b []byte, i int) int {
	digits := func(i int) int { // one or more
		j := i
		for j < len(b) && b[j] >= '0' && b[j] <= '9' {
			j++
		}
		if j == i {
			return -1
		}
		return j
	}
	if b[i] == '-' {
		i++
	}
	switch {
	case i < len(b) && b[i] == '0':
		i++
	case i < len(b) && b[i] >= '1' && b[i] <= '9':
		i = digits(i)
	default:
		return -1
	}
	if i < len(b) && b[i] == '.' {
		if i = digits(i + 1); i < 0 {
			return -1
		}
	}
	if i < len(b) && (b[i] == 'e' || b[i] == 'E') {
		i++
		if i < len(b) && (b[i] == '+' || b[i] == '-') {
			i++
		}
		if i = digits(i); i < 0 {
			return -1
		}
	}
	return i
}
