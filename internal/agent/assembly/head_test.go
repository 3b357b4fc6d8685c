package assembly

import (
	"bytes"
	"encoding/json"
	"testing"

	"github.com/stretchr/testify/assert"
)

// scanHead agrees with encoding/json wherever it answers, and declines
// (ok = false) for input encoding/json rejects.
func TestScanHead(t *testing.T) {
	cases := []string{
		`{}`, ` { } `, `{"role":"user","content":"x"}`, `{"content":"a,}\"]","role":"tool"}`,
		`{"role":"assistant","tool_calls":[{"id":"c1","function":{"arguments":"{\"a\":1}"}}],"n":1.5e3,"b":true,"z":null}`,
		`{"role":"\u0061ssistant"}`, `{"tool_calls":[]}`, `{"tool_calls":null,"role":"assistant"}`,
		`{"role":`, `{"role":"user"`, `{"role" "user"}`, `{"role":"user",}`, `{"role":"user"} x`, `[1]`, `"s"`,
		`{"role":5}`, `{role:"user"}`, `{"a":{"b":[}]}}`, `{"a":[{]}],"role":"x"}`,
	}
	for _, c := range cases {
		role, hasRole, tc, ok := scanHead([]byte(c))
		var h head
		err := json.Unmarshal([]byte(c), &h)
		if !ok {
			continue // falls back to encoding/json
		}
		if !assert.NoError(t, err, "scanHead accepted %s", c) {
			continue
		}
		assert.Equal(t, h.Role != nil, hasRole, c)
		if h.Role != nil {
			assert.Equal(t, *h.Role, role, c)
		}
		assert.Equal(t, string(h.ToolCalls), string(tc), c)
	}
	for _, c := range []string{`{"role":"user","content":"x"}`, `{"tool_calls":[1],"role":"a"}`} {
		_, _, _, ok := scanHead([]byte(c))
		assert.True(t, ok, c)
	}
}

// TestScanMessage: where ScanMessage vouches for an object, scanHead reads
// the same head from it, a splitter counting brackets outside strings cuts
// exactly that element, and Head.At reads the same from a copy.
func TestScanMessage(t *testing.T) {
	// cut is the element a bracket-counting splitter (rollout's
	// splitElements) cuts at b[0]: up to the first ',', '}' or ']' outside
	// strings where the brackets balance.
	cut := func(b []byte) int {
		depth := 0
		for i := 0; i < len(b); i++ {
			switch b[i] {
			case '"':
				i++
				for i < len(b) && b[i] != '"' {
					if b[i] == '\\' {
						i++
					}
					i++
				}
			case '{', '[':
				depth++
			case '}', ']', ',':
				if depth == 0 {
					return i
				}
				if b[i] != ',' {
					depth--
				}
			}
		}
		return -1
	}
	cases := []string{
		`{}`, `{ }`, `{"role":"user","content":"x"}`, `{"content":"a,}\"]","role":"tool"}`,
		`{"role":"assistant","tool_calls":[{"id":"c1","function":{"arguments":"{\"a\":1}"}}],"n":1.5e3,"b":true,"z":null}`,
		`{"role":"\u0061ssistant"}`, `{"tool_calls":[]}`, `{"tool_calls":null,"role":"assistant"}`,
		`{"role":"user","x":a"b}`, `{"role":"user","x":a{b}`, `{"role":"user","x":a[b]}`, `{"a":x{y}`,
		`{"role":"user","x":[1,{"y":"]"}]}`, `{"role":"x"} `, `{"a":"\\"}`, `{"a":"\\\"}"}`,
	}
	for _, c := range cases {
		for _, sep := range []string{",", "]", " ,", "}"} {
			b := []byte("  " + c + sep + `{"role":"tool"}]`)
			h, end, ok := ScanMessage(b, 2)
			if !ok {
				continue
			}
			obj := b[2:end]
			role, hasRole, tc, ok := scanHead(obj)
			if !assert.True(t, ok, c) {
				continue
			}
			assert.Equal(t, role, h.role, c)
			assert.Equal(t, hasRole, h.hasRole, c)
			if h.tc > 0 {
				assert.Equal(t, string(tc), string(obj[h.tc0:h.tc]), c)
			} else {
				assert.Nil(t, tc, c)
			}
			if k := cut(b[2:]); assert.GreaterOrEqual(t, k, 0, c) {
				assert.Equal(t, string(obj), string(bytes.TrimSpace(b[2:2+k])), "cut of %s", c)
			}
			assert.True(t, h.For(obj), c)
			cp := []byte("xx" + string(b[2:]))
			h2, end2, ok := h.At(cp, 2)
			assert.True(t, ok, c)
			assert.Equal(t, end, end2, c)
			assert.True(t, h2.For(cp[2:end2]), c)
			h3, end3, ok := ScanMessage(cp, 2)
			assert.True(t, ok, c)
			assert.Equal(t, end3, end2, c)
			assert.Equal(t, h3.role, h2.role, c)
			assert.Equal(t, [2]int{h3.tc0, h3.tc}, [2]int{h2.tc0, h2.tc}, c)
		}
	}
	_, _, ok := (&Head{}).At([]byte(`{}`), 0)
	assert.False(t, ok, "the zero Head matches nothing")
	for _, c := range []string{`{"role":"user","x":a"b}`, `{"role":"user","x":a{b}`, `{"a":x{y}`, `[1]`, ` {}`} {
		_, _, ok := ScanMessage([]byte(c), 0)
		assert.False(t, ok, c)
	}
}
