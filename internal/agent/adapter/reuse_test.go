package adapter

import (
	"encoding/json"
	"fmt"
	"slices"
	"testing"
	"unsafe"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/kilnrl/kiln/formats/records"
	"github.com/kilnrl/kiln/internal/agent/parse"
)

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

// The memo answers exactly what hashing every message afresh answers, turn
// after turn: unchanged messages, edited ones, a shorter history, new tools.
func TestHashMemo(t *testing.T) {
	raw := func(ss ...string) []json.RawMessage {
		out := make([]json.RawMessage, len(ss))
		for i, s := range ss {
			out[i] = json.RawMessage(s) // fresh bytes each call, as each request has
		}
		return out
	}
	turns := []struct{ msgs, tools []json.RawMessage }{
		{raw(`{"role":"user","content":"a"}`), nil},
		{raw(`{"role":"user","content":"a"}`, `{"role":"assistant","content":"b"}`, `{"role":"user","content":"c"}`), nil},
		{raw(`{"role":"user","content":"a"}`, `{"role":"assistant","content":"B"}`, `{"role":"user","content":"c"}`), raw(`{"type":"function","function":{"name":"t","parameters":{}}}`)},
		{raw(`{"content":"a","role":"user"}`), raw(`{"type":"function","function":{"name":"t","parameters":{}}}`)},
		{raw(`{"role":"user","content":"a"}`, `{"role":"assistant","content":"b"}`), raw(`{"type":"function","function":{"name":"u"}}`)},
		{raw(`{"role":"user","content":"a"}`, `{"role":"assistant","content":"b"}`), []json.RawMessage{}},
	}
	// The same slices again (as the decode History hands them back), one
	// of them re-sliced shorter at the same address.
	same := raw(`{"role":"user","content":"a"}`, `{"role":"assistant","content":"b"}`)
	turns = append(turns, struct{ msgs, tools []json.RawMessage }{same, nil},
		struct{ msgs, tools []json.RawMessage }{same, nil},
		struct{ msgs, tools []json.RawMessage }{[]json.RawMessage{same[0], same[1][:len(same[1])-2]}, nil})
	var m hashMemo
	for i, tc := range turns {
		got := m.messages(tc.msgs)
		want := make([]digest, len(tc.msgs))
		for j, r := range tc.msgs {
			want[j] = canonicalHash(r)
		}
		assert.Equal(t, want, got, "turn %d messages", i)
		assert.Equal(t, hashTools(tc.tools), m.tools(tc.tools), "turn %d tools", i)
		assert.Equal(t, parse.NewToolSet(parseTools(tc.tools)), m.toolSet(), "turn %d parsed tools", i)
	}
}

// extendPrompt appends in place to the last prompt it built when that
// prompt is extended again, never writes what a recorded prompt covers, and
// moves the recorded prompts into a new array when it makes one.
func TestExtendPrompt(t *testing.T) {
	same := func(a, b []int32) bool { return unsafe.SliceData(a) == unsafe.SliceData(b) }
	sess := &session{}
	render := []int32{1, 2, 3} // a turn's prompt that is a render, not built here
	sess.turns = []records.Turn{{PromptIDs: render}}

	p1 := sess.extendPrompt(render, []int32{4}, []int32{5, 6})
	assert.Equal(t, []int32{1, 2, 3, 4, 5, 6}, p1)
	assert.Equal(t, len(p1), cap(p1), "a prompt is cut to its length: no one appends to it")
	assert.True(t, same(sess.turns[0].PromptIDs, p1), "the recorded prompt moved to the new array")
	assert.Equal(t, render, sess.turns[0].PromptIDs)
	sess.turns = append(sess.turns, records.Turn{PromptIDs: p1})

	p2 := sess.extendPrompt(p1, []int32{7}, []int32{8})
	assert.Equal(t, []int32{1, 2, 3, 4, 5, 6, 7, 8}, p2)
	assert.True(t, same(p1, p2), "the next prompt is appended in place")
	assert.Equal(t, []int32{1, 2, 3, 4, 5, 6}, p1)
	sess.turns = append(sess.turns, records.Turn{PromptIDs: p2})

	// A sibling branch from turn 0: a new array; the longer prompts keep
	// theirs, the shorter one moves.
	sib := sess.extendPrompt(sess.turns[0].PromptIDs, []int32{9}, nil)
	assert.Equal(t, []int32{1, 2, 3, 9}, sib)
	assert.False(t, same(sib, p2))
	assert.Equal(t, []int32{1, 2, 3, 4, 5, 6, 7, 8}, sess.turns[2].PromptIDs)
	assert.True(t, same(sess.turns[1].PromptIDs, p2) && same(sess.turns[2].PromptIDs, p2))
	assert.True(t, same(sess.turns[0].PromptIDs, sib))

	// Growing past the array's room, many times over: every prompt keeps
	// its ids.
	want := [][]int32{sess.turns[0].PromptIDs, sess.turns[1].PromptIDs, sess.turns[2].PromptIDs}
	last := p2
	for i := range 200 {
		next := sess.extendPrompt(last, []int32{int32(100 + i)}, []int32{int32(1000 + i), int32(2000 + i)})
		require.Equal(t, last, next[:len(last)], "step %d", i)
		require.Equal(t, []int32{int32(100 + i), int32(1000 + i), int32(2000 + i)}, next[len(last):], "step %d", i)
		sess.turns = append(sess.turns, records.Turn{PromptIDs: next})
		want = append(want, slices.Clone(next))
		last = next
	}
	for i, tr := range sess.turns {
		require.Equal(t, want[i], tr.PromptIDs, "turn %d", i)
	}
}

// A session's prefixes keep their message hashes in one array while each
// request resends the last one's history; an edited history gets a list
// of its own, and no stored list ever changes.
func TestStoreHashes(t *testing.T) {
	d := func(k int) digest { return canonicalHash(fmt.Appendf(nil, `{"k":%d}`, k)) }
	sess := &session{}
	var want [][]digest
	record := func(msgs []digest, assistant digest) {
		got := sess.storeHashes(msgs, assistant)
		require.Equal(t, append(slices.Clone(msgs), assistant), got)
		require.Equal(t, len(got), cap(got))
		sess.prefixes = append(sess.prefixes, prefix{msgs: got})
		want = append(want, slices.Clone(got))
	}
	var hist []digest
	for turn := range 40 {
		hist = append(hist, d(2*turn)) // the new user message
		record(hist, d(2*turn+1))
		hist = append(hist, d(2*turn+1)) // the reply, echoed
	}
	arrays := map[*digest]bool{}
	for _, p := range sess.prefixes {
		arrays[unsafe.SliceData(p.msgs)] = true
	}
	assert.Len(t, arrays, 1, "a growing history's prefixes share one array")

	record([]digest{d(-1), d(1)}, d(-2))                 // an edited history
	record(append(slices.Clone(hist[:3]), d(-3)), d(-4)) // a branch after turn 1
	for i, p := range sess.prefixes {
		require.Equal(t, want[i], p.msgs, "prefix %d", i)
	}
}
