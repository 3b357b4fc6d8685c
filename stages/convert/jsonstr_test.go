package convert

import (
	"encoding/json"
	"testing"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
)

// TestUnquoteJSONMatchesEncodingJSON: unquoteJSON decodes exactly as
// encoding/json does.
func TestUnquoteJSONMatchesEncodingJSON(t *testing.T) {
	cases := []string{
		`""`, `"plain"`, `"a\nb\tc\\d\"e\/f\b\f\r"`, `"\u00e9\u007f<>"`, `"\ud83d\ude00"`, `"\ud83d"`, `"\ude00x"`,
		`"\ud83dx"`, `"\ud83d\u0041"`, "\"caf\xc3\xa9\"", "\"bad\xffutf8\"", `"\u0000"`, "\"\xed\xa0\x80\"",
	}
	for _, c := range cases {
		var want string
		require.NoError(t, json.Unmarshal([]byte(c), &want), c)
		got, err := unquoteJSON([]byte(c))
		require.NoError(t, err, c)
		assert.Equal(t, want, got, c)
	}
}

func FuzzUnquoteJSON(f *testing.F) {
	for _, s := range []string{"a", "é", "\n\"\\", "\U0001F600", "\xff"} {
		b, _ := json.Marshal(s)
		f.Add(string(b))
	}
	f.Fuzz(func(t *testing.T, raw string) {
		var want string
		// Raw values as a decoder hands them over: no surrounding space.
		if json.Unmarshal([]byte(raw), &want) != nil || len(raw) < 2 || raw[0] != '"' || raw[len(raw)-1] != '"' {
			return
		}
		got, err := unquoteJSON([]byte(raw))
		require.NoError(t, err)
		assert.Equal(t, want, got)
	})
}
