package ojson

import "bytes"

// Skimming: walking JSON text by structure without decoding it — where a
// value starts and ends, an object's keys and raw values. The hot paths of the agent runtime read large JSON (request
// histories, engine replies, recorded messages) for a few fields each; these
// find them at memory speed and leave decoding (and the wording of errors)
// to Decode or the callers' encoding/json fallbacks.
//
// Contract: structure is checked — strings end, brackets match in kind,
// keys, colons and commas come in order — but scalars are taken by extent
// (up to the next delimiter), not validated. A function that returns -1 or
// false has found text it cannot vouch for.

// Space returns the index of the first non-white-space byte at or after i.
func Space(b []byte, i int) int {
	for i < len(b) && (b[i] == ' ' || b[i] == '\t' || b[i] == '\n' || b[i] == '\r') {
		i++
	}
	return i
}

// StringEnd returns the index after the string starting at b[i] (a '"'), or
// -1 if it does not end. It jumps from quote to quote with the vectorized
// bytes.IndexByte, so long texts cost memory bandwidth, not a loop per byte;
// the first bytes are looked at one by one, since most strings (keys, ids,
// labels) end there, sooner than a vectorized search starts.
func StringEnd(b []byte, i int) int {
	for j, end := i+1, min(len(b), i+1+shortString); j < end; j++ {
		if b[j] == '"' {
			return j + 1
		}
		if b[j] == '\\' {
			break // escapes: the general search counts backslashes
		}
	}
	for j := i + 1; ; {
		k := bytes.IndexByte(b[j:], '"')
		if k < 0 {
			return -1
		}
		q := j + k
		bs := 0 // backslashes right before the quote
		for p := q - 1; p > i && b[p] == '\\'; p-- {
			bs++
		}
		if bs%2 == 0 {
			return q + 1
		}
		j = q + 1
	}
}

// shortString is how many bytes StringEnd reads one by one before searching.
const shortString = 16

// class sorts the bytes ValueEnd stops at inside containers.
var class = [256]byte{'"': '"', '{': '{', '[': '[', '}': '}', ']': ']'}

// ValueEnd returns the index after the JSON value starting at b[i], or -1.
func ValueEnd(b []byte, i int) int {
	if i >= len(b) {
		return -1
	}
	switch b[i] {
	case '"':
		return StringEnd(b, i)
	case '{', '[':
		if b[i] == '[' {
			// A flat array of scalars (an id list: the large values of
			// engine replies) ends at its first ']' when nothing before it
			// opens a string or a container: vectorized searches find both.
			if k := bytes.IndexByte(b[i+1:], ']'); k >= 0 {
				seg := b[i+1 : i+1+k]
				if bytes.IndexByte(seg, '"') < 0 && bytes.IndexByte(seg, '[') < 0 &&
					bytes.IndexByte(seg, '{') < 0 && bytes.IndexByte(seg, '}') < 0 {
					return i + 2 + k
				}
			}
		}
		var small [64]byte
		stack := small[:0] // the closers expected
		for ; i < len(b); i++ {
			for i < len(b) && class[b[i]] == 0 {
				i++ // the bytes of scalars and separators, in a loop of their own
			}
			if i == len(b) {
				break
			}
			switch c := class[b[i]]; c {
			case '"':
				if i = StringEnd(b, i); i < 0 {
					return -1
				}
				i--
			case '{', '[':
				stack = append(stack, c+2) // '{'+2 = '}', '['+2 = ']'
			default: // '}', ']'
				if len(stack) == 0 || stack[len(stack)-1] != c {
					return -1
				}
				if stack = stack[:len(stack)-1]; len(stack) == 0 {
					return i + 1
				}
			}
		}
		return -1
	}
	start := i
	for i < len(b) && b[i] != ',' && b[i] != '}' && b[i] != ']' && b[i] != ' ' && b[i] != '\n' && b[i] != '\t' && b[i] != '\r' {
		i++
	}
	if i == start {
		return -1
	}
	return i
}

// WalkObject walks the JSON object that starts at b[i] (a '{'), calling fn with
// each key (the text between its quotes, escapes not undone) and the index
// where its value starts; fn reads the value where it stands — parsing it,
// or skipping it with ValueEnd — and returns the index after it, or -1 to stop.
// WalkObject returns the index after the object, or -1.
func WalkObject(b []byte, i int, fn func(key []byte, v int) int) int {
	if i >= len(b) || b[i] != '{' {
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
		ks := i
		if i = StringEnd(b, i); i < 0 {
			return -1
		}
		key := b[ks+1 : i-1]
		if i = Space(b, i); i >= len(b) || b[i] != ':' {
			return -1
		}
		if i = fn(key, Space(b, i+1)); i < 0 {
			return -1
		}
		var closed bool
		if i, closed = skimNext(b, i, '}'); i < 0 || closed {
			return i
		}
	}
}

// skimNext reads what follows a container's element at b[i]: a comma and the
// space after it (the index of the next element, closed false), or the
// closing byte (the index after it, closed true); -1 for anything else.
func skimNext(b []byte, i int, closing byte) (int, bool) {
	if i = Space(b, i); i >= len(b) {
		return -1, false
	}
	switch b[i] {
	case ',':
		return Space(b, i+1), false
	case closing:
		return i + 1, true
	}
	return -1, false
}
