package assembly

import (
	"encoding/json"
	"testing"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
)

// splitText is Split of a string.
func splitText(s *Splitter, text string) ([]json.RawMessage, error) {
	return s.Split([]byte(text))
}

func TestSplitArray(t *testing.T) {
	for _, c := range []string{
		`[]`, ` [ ] `, `[{"a":1}]`, `[{"a":"x,]}"} , {"b":[1,{"c":"\"]"}]}]`, `[1,"two",[3],{"4":null}]`,
		`[{"role":"user","content":"é \u00e9 \\"}]`,
	} {
		got, ok := splitArray([]byte(c))
		require.True(t, ok, c)
		var want []json.RawMessage
		require.NoError(t, json.Unmarshal([]byte(c), &want))
		require.Len(t, got, len(want), c)
		for i := range want {
			assert.JSONEq(t, string(want[i]), string(got[i]), c)
		}
	}
	for _, bad := range []string{``, `{}`, `[`, `[1,`, `[1,]`, `[,1]`, `["x]`, `[1] x`, `[{]`} {
		_, ok := splitArray([]byte(bad))
		assert.False(t, ok, bad)
	}
}

func TestMessageSplitterReusesPrefix(t *testing.T) {
	var s Splitter
	a, err := splitText(&s, `[{"role":"user","content":"u"}]`)
	require.NoError(t, err)
	require.Len(t, a, 1)
	b, err := splitText(&s, `[{"role":"user","content":"u"},{"role":"assistant","content":"x"},{"role":"tool","content":"t"}]`)
	require.NoError(t, err)
	require.Len(t, b, 3)
	assert.Equal(t, `{"role":"tool","content":"t"}`, string(b[2]))
	// A rewritten history is split from scratch.
	c, err := splitText(&s, `[{"role":"user","content":"summary"}]`)
	require.NoError(t, err)
	require.Len(t, c, 1)
	assert.Equal(t, `{"role":"user","content":"summary"}`, string(c[0]))
	assert.Len(t, b, 3, "earlier results are not clobbered")
	_, err = splitText(&s, `[{"role":`)
	assert.ErrorContains(t, err, "prompt_messages")
}

// TestNewSplitter: a splitter's lists have the capacity asked for.
func TestNewSplitter(t *testing.T) {
	s := NewSplitter(16)
	msgs, err := s.Split([]byte(`[{"role":"user","content":"u"},{"role":"tool","content":"t"}]`))
	require.NoError(t, err)
	require.Len(t, msgs, 2)
	assert.GreaterOrEqual(t, cap(msgs), 16)
}
