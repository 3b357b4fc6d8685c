package rollout

import (
	"encoding/json"
	"strings"
	"testing"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/kilnrl/kiln/internal/agent/assembly"
)

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
	var s messageSplitter
	a, err := s.split(`[{"role":"user","content":"u"}]`)
	require.NoError(t, err)
	require.Len(t, a, 1)
	b, err := s.split(`[{"role":"user","content":"u"},{"role":"assistant","content":"x"},{"role":"tool","content":"t"}]`)
	require.NoError(t, err)
	require.Len(t, b, 3)
	assert.Equal(t, `{"role":"tool","content":"t"}`, string(b[2]))
	// A rewritten history is split from scratch.
	c, err := s.split(`[{"role":"user","content":"summary"}]`)
	require.NoError(t, err)
	require.Len(t, c, 1)
	assert.Equal(t, `{"role":"user","content":"summary"}`, string(c[0]))
	assert.Len(t, b, 3, "earlier results are not clobbered")
	_, err = s.split(`[{"role":`)
	assert.ErrorContains(t, err, "prompt_messages")
}

// TestIsNullText holds isNullText to its definition, strings.TrimSpace(s)
// == "null", including Unicode white space, which only the fallback reads.
func TestIsNullText(t *testing.T) {
	for _, s := range []string{"", "null", " null\n", "\u00a0null\u2003", "\vnull\f", "nul", "nulls", "{}", `{"role":"assistant"}`,
		" {}", "{ null", `"null"`, "Null", "null null"} {
		assert.Equal(t, strings.TrimSpace(s) == "null", isNullText(s), "%q", s)
	}
}

// TestMessageSplitterSpare: the spare storage serves one list split from
// scratch, and only one.
func TestMessageSplitterSpare(t *testing.T) {
	spare, spareHeads := make([]json.RawMessage, 0, 4), make([]assembly.Head, 0, 4)
	s := messageSplitter{spare: spare, spareHeads: spareHeads}
	a, heads, err := s.splitHeads(`[{"role":"user","content":"u"}]`)
	require.NoError(t, err)
	require.Len(t, a, 1)
	assert.True(t, &a[0] == &spare[:1][0] && &heads[0] == &spareHeads[:1][0], "the spare holds the first list")
	b, err := s.split(`[{"role":"user","content":"summary"}]`)
	require.NoError(t, err)
	assert.False(t, &b[0] == &spare[:1][0], "a second list split from scratch has storage of its own")
	assert.Equal(t, `{"role":"user","content":"u"}`, string(a[0]))
}
