package assembly

import (
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
