package convert

import (
	"errors"
	"fmt"
)

// member is one top-level key of a JSON object and its value's exact bytes.
type member struct {
	key string
	raw []byte
}

// scanObject validates data as one JSON object (optionally surrounded by
// whitespace) and returns its members in order, values as slices of data.
// It accepts exactly what encoding/json accepts for a map (FuzzScanObject
// checks this against encoding/json), in one pass and without copying the
// values: MiMo rows are tens of KB of JSON, and decoding them was the
// largest part of the conversion.
//
// Why a second reader beside encoding/json (measured 2026-12-03 with the
// built kiln-convert on 5,000 generated rows, 126 MB of Parquet,
// alternating runs at load 28-38): with decodeInstance on json.Unmarshal
// into a map (and each string unquoted by json.Unmarshal) the stage took
// 6.6-7.4 s CPU (user+sys) and 34-60 s wall against 4.5-4.8 s and 21-29 s
// with this; on json.Decoder's Token (strings decoded by Token, the rest
// raw) 6.2-6.8 s CPU and 36-39 s wall against 5.3-5.5 s and 27-31 s. Both
// cost well over 5% of the stage's wall time. Command:
//
//	KILN_BENCH_MIMO_ROWS=5000 go test ./stages/convert -run '^$' -bench ConvertMiMo -benchtime 1x -timeout 30m
//
// It stays beside internal/ojson rather than in it: ojson's decoder builds
// every value (what this scanner exists to avoid) and its skimmers take
// scalars by extent without validating them (what this scanner must do,
// since a row's JSON is untrusted input to convert). Keys are decoded by
// the one shared unquoter (unquoteJSON, ojson.Unquote).
func scanObject(data []byte) ([]member, error) {
	s := scanner{data: data}
	s.space()
	if s.i >= len(s.data) || s.data[s.i] != '{' {
		return nil, s.errorf("want a JSON object")
	}
	s.i++
	var members []member
	s.space()
	if s.peek() == '}' {
		s.i++
	} else {
		for {
			s.space()
			if s.peek() != '"' {
				return nil, s.errorf("want a string key")
			}
			kstart := s.i
			if err := s.str(); err != nil {
				return nil, err
			}
			key, err := unquoteJSON(s.data[kstart:s.i])
			if err != nil {
				return nil, s.errorf("%v", err)
			}
			s.space()
			if s.peek() != ':' {
				return nil, s.errorf("want ':' after object key")
			}
			s.i++
			s.space()
			vstart := s.i
			if err := s.value(0); err != nil {
				return nil, err
			}
			members = append(members, member{key, s.data[vstart:s.i]})
			s.space()
			switch s.peek() {
			case ',':
				s.i++
				continue
			case '}':
				s.i++
			default:
				return nil, s.errorf("want ',' or '}' after object value")
			}
			break
		}
	}
	s.space()
	if s.i != len(s.data) {
		return nil, s.errorf("data after the object")
	}
	return members, nil
}

type scanner struct {
	data []byte
	i    int
}

// maxDepth is encoding/json's nesting limit.
const maxDepth = 10000

func (s *scanner) errorf(format string, args ...any) error {
	return fmt.Errorf("invalid JSON at offset %d: %s", s.i, fmt.Sprintf(format, args...))
}

func (s *scanner) peek() byte {
	if s.i < len(s.data) {
		return s.data[s.i]
	}
	return 0
}

func (s *scanner) space() {
	for s.i < len(s.data) {
		switch s.data[s.i] {
		case ' ', '\t', '\n', '\r':
			s.i++
		default:
			return
		}
	}
}

var errDepth = errors.New("exceeded max depth")

func (s *scanner) value(depth int) error {
	if depth >= maxDepth {
		return errDepth
	}
	switch c := s.peek(); {
	case c == '"':
		return s.str()
	case c == '{':
		s.i++
		s.space()
		if s.peek() == '}' {
			s.i++
			return nil
		}
		for {
			s.space()
			if s.peek() != '"' {
				return s.errorf("want a string key")
			}
			if err := s.str(); err != nil {
				return err
			}
			s.space()
			if s.peek() != ':' {
				return s.errorf("want ':' after object key")
			}
			s.i++
			s.space()
			if err := s.value(depth + 1); err != nil {
				return err
			}
			s.space()
			switch s.peek() {
			case ',':
				s.i++
			case '}':
				s.i++
				return nil
			default:
				return s.errorf("want ',' or '}' after object value")
			}
		}
	case c == '[':
		s.i++
		s.space()
		if s.peek() == ']' {
			s.i++
			return nil
		}
		for {
			s.space()
			if err := s.value(depth + 1); err != nil {
				return err
			}
			s.space()
			switch s.peek() {
			case ',':
				s.i++
			case ']':
				s.i++
				return nil
			default:
				return s.errorf("want ',' or ']' after array element")
			}
		}
	case c == 't':
		return s.literal("true")
	case c == 'f':
		return s.literal("false")
	case c == 'n':
		return s.literal("null")
	case c == '-' || c >= '0' && c <= '9':
		return s.number()
	}
	return s.errorf("want a value")
}

func (s *scanner) literal(lit string) error {
	if len(s.data)-s.i < len(lit) || string(s.data[s.i:s.i+len(lit)]) != lit {
		return s.errorf("want %s", lit)
	}
	s.i += len(lit)
	return nil
}

func (s *scanner) digits() int {
	n := 0
	for s.i < len(s.data) && s.data[s.i] >= '0' && s.data[s.i] <= '9' {
		s.i++
		n++
	}
	return n
}

func (s *scanner) number() error {
	if s.peek() == '-' {
		s.i++
	}
	switch c := s.peek(); {
	case c == '0':
		s.i++
	case c >= '1' && c <= '9':
		s.digits()
	default:
		return s.errorf("bad number")
	}
	if s.peek() == '.' {
		s.i++
		if s.digits() == 0 {
			return s.errorf("bad number")
		}
	}
	if c := s.peek(); c == 'e' || c == 'E' {
		s.i++
		if c := s.peek(); c == '+' || c == '-' {
			s.i++
		}
		if s.digits() == 0 {
			return s.errorf("bad number")
		}
	}
	return nil
}

// str scans a string literal starting at its opening quote.
func (s *scanner) str() error {
	s.i++ // "
	d := s.data
	for i := s.i; i < len(d); i++ {
		switch c := d[i]; {
		case c == '"':
			s.i = i + 1
			return nil
		case c == '\\':
			i++
			if i >= len(d) {
				s.i = i
				return s.errorf("truncated escape")
			}
			switch d[i] {
			case '"', '\\', '/', 'b', 'f', 'n', 'r', 't':
			case 'u':
				if i+4 >= len(d) || !isHex(d[i+1]) || !isHex(d[i+2]) || !isHex(d[i+3]) || !isHex(d[i+4]) {
					s.i = i
					return s.errorf("bad \\u escape")
				}
				i += 4
			default:
				s.i = i
				return s.errorf("bad escape")
			}
		case c < 0x20:
			s.i = i
			return s.errorf("control character in string")
		}
	}
	s.i = len(d)
	return s.errorf("unterminated string")
}

func isHex(c byte) bool {
	return c >= '0' && c <= '9' || c >= 'a' && c <= 'f' || c >= 'A' && c <= 'F'
}
