package ojson

import (
	"encoding/json"
	"math/rand/v2"
	"strings"
	"testing"
)

func TestValueEnd(t *testing.T) {
	for _, c := range []struct {
		in   string
		want int // index after the first value, -1 for none
	}{
		{`"a\"b",`, 6},
		{`"a\\"x`, 5},
		{`"open`, -1},
		{`{"a":[1,{"b":"}]"}]} tail`, 20},
		{`[1,2,3],`, 7},
		{`[[1],[2]]`, 9},
		{`{"a":1]`, -1},
		{`[1,2}`, -1},
		{`[{"a":1}`, -1},
		{`123.5e3}`, 7},
		{`true `, 4},
		{`,`, -1},
		{strings.Repeat("[", 100) + strings.Repeat("]", 100), 200},
	} {
		if got := ValueEnd([]byte(c.in), 0); got != c.want {
			t.Errorf("ValueEnd(%q) = %d, want %d", c.in, got, c.want)
		}
	}
}

// plainString is String's definition, a byte at a time: the index after the
// first quote not escaped by a backslash, or -1.
func plainString(b []byte, i int) int {
	for j := i + 1; j < len(b); j++ {
		switch b[j] {
		case '\\':
			j++
		case '"':
			return j + 1
		}
	}
	return -1
}

// String and Value agree with their plain definitions on random text:
// quotes and backslashes at every distance from the start (String looks at
// the first bytes one by one, then searches), and random nested values.
func TestStringEndAndValueEndRandom(t *testing.T) {
	rng := rand.New(rand.NewPCG(3, 5))
	alphabet := []byte(`ab"\\ {}[],:1`)
	for range 20000 {
		n := rng.IntN(48)
		b := make([]byte, 1, n+1)
		b[0] = '"'
		for range n {
			b = append(b, alphabet[rng.IntN(len(alphabet))])
		}
		if got, want := StringEnd(b, 0), plainString(b, 0); got != want {
			t.Fatalf("StringEnd(%q) = %d, want %d", b, got, want)
		}
	}
	var gen func(depth int) any
	gen = func(depth int) any {
		switch k := rng.IntN(6); {
		case k == 0 || depth > 4:
			s := make([]byte, rng.IntN(40))
			for i := range s {
				s[i] = alphabet[rng.IntN(len(alphabet))]
			}
			return string(s)
		case k == 1:
			return rng.IntN(100000)
		case k == 2:
			arr := make([]any, rng.IntN(5))
			for i := range arr {
				arr[i] = gen(depth + 1)
			}
			return arr
		default:
			obj := map[string]any{}
			for range rng.IntN(5) {
				obj[string(alphabet[rng.IntN(len(alphabet))])+"k"] = gen(depth + 1)
			}
			return obj
		}
	}
	for range 3000 {
		v, err := json.Marshal(gen(0))
		if err != nil {
			t.Fatal(err)
		}
		b := append(v, `, "tail"]`...)
		if got := ValueEnd(b, 0); got != len(v) {
			t.Fatalf("ValueEnd(%s) = %d, want %d", b, got, len(v))
		}
	}
}
