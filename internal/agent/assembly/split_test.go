package assembly

import (
	"encoding/json"
	"testing"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
)

// splitText is Split of a string, without the heads.
func splitText(s *Splitter, text string) ([]json.RawMessage, error) {
	msgs, _, err := s.Split([]byte(text))
	return msgs, err
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

// TestMessageSplitterSpare: the spare storage serves one list split from
// scratch, and only one.
func TestMessageSplitterSpare(t *testing.T) {
	spare, spareHeads := make([]json.RawMessage, 0, 4), make([]Head, 0, 4)
	s := Splitter{spare: spare, spareHeads: spareHeads}
	a, heads, err := s.Split([]byte(`[{"role":"user","content":"u"}]`))
	require.NoError(t, err)
	require.Len(t, a, 1)
	assert.True(t, &a[0] == &spare[:1][0] && &heads[0] == &spareHeads[:1][0], "the spare holds the first list")
	b, err := splitText(&s, `[{"role":"user","content":"summary"}]`)
	require.NoError(t, err)
	assert.False(t, &b[0] == &spare[:1][0], "a second list split from scratch has storage of its own")
	assert.Equal(t, `{"role":"user","content":"u"}`, string(a[0]))
}

// TestNewSplitter: a splitter's first list is the session's recycled pair.
func TestNewSplitter(t *testing.T) {
	sess := NewSession(Options{Arena: &Arena{}})
	s := NewSplitter(sess, 16)
	msgs, heads, err := s.Split([]byte(`[{"role":"user","content":"u"},{"role":"tool","content":"t"}]`))
	require.NoError(t, err)
	require.Len(t, msgs, 2)
	require.Len(t, heads, 2)
	assert.GreaterOrEqual(t, cap(msgs), 16)
	assert.True(t, heads[0].For(msgs[0]) && heads[1].For(msgs[1]), "the objects were read as they were cut")
	// The expected message is cut by comparison, with the same head.
	resp := []byte(`{"role":"assistant","content":"a"}`)
	h, _, ok := ScanMessage(resp, 0)
	require.True(t, ok)
	s.Expect(h)
	next, nextHeads, err := s.Split([]byte(`[{"role":"user","content":"u"},{"role":"tool","content":"t"},{"role":"assistant","content":"a"}]`))
	require.NoError(t, err)
	require.Len(t, next, 3)
	assert.True(t, nextHeads[2].For(next[2]))
	assert.Equal(t, string(resp), string(next[2]))
}
