package adapter

import "testing"

// Deep-equal messages hash alike whatever their key order; any other
// difference changes the hash.
func TestCanonicalHash(t *testing.T) {
	same := [][2]string{
		{`{"role":"user","content":"hi"}`, `{"content":"hi","role":"user"}`},
		{`{"a":{"y":1,"x":[{"q":2,"p":3}]},"b":null}`, `{"b":null,"a":{"x":[{"p":3,"q":2}],"y":1}}`},
		{`{"role":"assistant","content":"","tool_calls":[{"type":"function","function":{"name":"w","arguments":{"z":1,"a":2}}}]}`,
			`{"tool_calls":[{"function":{"arguments":{"a":2,"z":1},"name":"w"},"type":"function"}],"content":"","role":"assistant"}`},
		{`{}`, ` { } `},
		{`[]`, `[ ]`},
	}
	for _, p := range same {
		if canonicalHash([]byte(p[0])) != canonicalHash([]byte(p[1])) {
			t.Errorf("%s and %s hash differently", p[0], p[1])
		}
	}
	differ := [][2]string{
		{`{"role":"user","content":"hi"}`, `{"role":"user","content":"hi "}`},
		{`{"a":[1,2]}`, `{"a":[2,1]}`},
		{`{"a":1}`, `{"a":1.0}`},
		{`{"a":"1"}`, `{"a":1}`},
		{`{"a":{"b":1}}`, `{"a":{"b":1},"c":null}`},
		{`{"ab":1}`, `{"a":1,"b":1}`},
		{`["a,b"]`, `["a","b"]`},
		{`{"a":"x"}`, `{"a":"x"`}, // not JSON: hashed as bytes
		{`"k"`, `"k" extra`},
	}
	for _, p := range differ {
		if canonicalHash([]byte(p[0])) == canonicalHash([]byte(p[1])) {
			t.Errorf("%s and %s hash alike", p[0], p[1])
		}
	}
}
