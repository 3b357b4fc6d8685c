package assembly

import (
	"encoding/json"
	"strconv"
	"testing"
)

// vector is one branching test vector of docs/assembly.md §6. It runs at threshold T
// (the vector's own) and, when T != 0, also at T = 0 expecting want0 (nil:
// the same as want).
type vector struct {
	name  string
	T     int
	turns []Turn
	want  []seg
	want0 []seg
	check func(t *testing.T, s *Session) // inspects the tree before linearization
}

const h = "s:S,u:u" // the [S,u] history

func m(v ...uint8) []uint8 { return v }

func lps(v ...float32) []float32 { return v }

// lpm is mask-shaped logprobs: v where the mask is 1.
func lpm(mask []uint8, v float32) []float32 {
	out := make([]float32, len(mask))
	for i, x := range mask {
		if x == 1 {
			out[i] = v
		}
	}
	return out
}

// lt is a literal-token turn (TV20, TV23): logprob of a token = -id/100 when
// lp is set.
func lt(prompt, out []int32, resp, msgs string, lp bool) Turn {
	t := Turn{PromptIDs: prompt, OutputIDs: out, FinishReason: "stop", ResponseMessage: msgJSON("a:"+resp, false)}
	for _, ms := range splitComma(msgs) {
		t.PromptMessages = append(t.PromptMessages, msgJSON(ms, true))
	}
	if lp {
		for _, id := range out {
			t.OutputLogProbs = append(t.OutputLogProbs, -float32(id)/100)
		}
	}
	return t
}

func splitComma(s string) []string {
	var out []string
	start := 0
	for i := 0; i <= len(s); i++ {
		if i == len(s) || s[i] == ',' {
			out = append(out, s[start:i])
			start = i + 1
		}
	}
	return out
}

func vectors() []vector {
	p13 := ints(100, 101, 109, 200, 201, 209, 900, 919, 909, 300, 311, 309, 900)
	tv20p := ints(100, 101, 109, 200, 201, 209, 900, 9001, 9002, 9003, 702, 300, 311, 309, 900)
	tv20 := []Turn{
		lt(P0, ints(9001, 9002, 9003, 9004), "r1", h, false),
		lt(tv20p, ints(9100, 9101), "r2", h+",a:r1,t:t", false),
	}
	tv20fork := []seg{
		{P0, ints(9001, 9002, 9003, 9004), m(1, 1, 1, 1), nil},
		{tv20p, ints(9100, 9101), m(1, 1), nil},
	}
	tv19mask0 := m(1, 1, 0, 0, 0, 0, 1, 1, 0, 0, 0, 0, 1, 1, 0, 0, 0, 0, 1, 1)
	tv19 := h + ",a:a0,t:t0,a:a1,t:t1,a:a2,t:t2"
	tv8fork := []seg{
		{P0, ints(911, 909), m(1, 1), lps(-.5, -.5)},
		{ints(100, 101, 109, 200, 201, 209, 900, 911, 702, 300, 311, 309, 900), ints(912, 909), m(1, 1), lps(-.4, -.4)},
	}
	tv16S := seg{ints(100, 101, 109, 200, 201, 209, 900, 938, 909, 300, 314, 309, 900),
		ints(928, 909, 300, 315, 309, 900, 929, 909), m(1, 1, 0, 0, 0, 0, 1, 1), lps(-.4, -.4, 0, 0, 0, 0, -.3, -.3)}
	tv23split := []seg{
		{ints(10), ints(11, 12, 13, 14), m(1, 1, 1, 1), lps(-.11, -.12, -.13, -.14)},
		{ints(10, 11, 12, 99, 14), ints(15), m(1), lps(-.15)},
	}
	tv23count := []seg{
		{ints(10), ints(11, 12, 13, 14), m(1, 1, 1, 1), lps(-.11, -.12, -.13, -.14)},
		{ints(10, 11, 12, 99, 100, 14), ints(15), m(1), lps(-.15)},
	}

	return []vector{
		{name: "TV1 single turn", T: 1024,
			turns: []Turn{vt(h, "ok")},
			want:  []seg{{P0, ints(918, 909), m(1, 1), nil}},
			check: func(t *testing.T, s *Session) {
				if got := dump(s.root); got != "system[S](user[u](assistant[ok]*1))" {
					t.Errorf("tree %s", got)
				}
			}},
		{name: "TV2 clean two turns with tool", T: 1024,
			turns: []Turn{vt(h, "call", withLP(-.5)), vt(h+",a:call,t:t", "done", withLP(-.4))},
			want: []seg{{P0, ints(911, 909, 300, 311, 309, 900, 912, 909), m(1, 1, 0, 0, 0, 0, 1, 1),
				lps(-.5, -.5, 0, 0, 0, 0, -.4, -.4)}}},
		{name: "TV3 system fork", T: 1024,
			turns: []Turn{vt("s:SA,u:u", "a"), vt("s:SB,u:u", "a")},
			want: []seg{
				{ints(100, 102, 109, 200, 201, 209, 900), ints(913, 909), m(1, 1), nil},
				{ints(100, 103, 109, 200, 201, 209, 900), ints(913, 909), m(1, 1), nil}},
			check: func(t *testing.T, s *Session) {
				if got := dump(s.root); got != "system[SA](user[u](assistant[a]*1)),system[SB](user[u](assistant[a]*2))" {
					t.Errorf("tree %s", got)
				}
			}},
		{name: "TV3 user fork (1.4)", T: 1024,
			turns: []Turn{vt("s:S,u:A", "a"), vt("s:S,u:B", "b")},
			want: []seg{
				{ints(100, 101, 109, 200, 202, 209, 900), ints(913, 909), m(1, 1), nil},
				{ints(100, 101, 109, 200, 203, 209, 900), ints(914, 909), m(1, 1), nil}},
			check: func(t *testing.T, s *Session) {
				if got := dump(s.root); got != "system[S](user[A](assistant[a]*1),user[B](assistant[b]*2))" {
					t.Errorf("tree %s", got)
				}
			}},
		{name: "TV3 same history twice (1.5)", T: 1024,
			turns: []Turn{vt(h, "a1"), vt(h, "a2")},
			want:  []seg{{P0, ints(915, 909), m(1, 1), nil}, {P0, ints(916, 909), m(1, 1), nil}}},
		{name: "TV4 token-only drift", T: 1024,
			turns: []Turn{vt(h, "a"), vt(h, "b", ins(1, 701))},
			want: []seg{{P0, ints(913, 909), m(1, 1), nil},
				{ints(100, 701, 101, 109, 200, 201, 209, 900), ints(914, 909), m(1, 1), nil}},
			check: func(t *testing.T, s *Session) {
				if got := dump(s.root); got != "system[S](user[u](assistant[a]*1,assistant[b]*2))" {
					t.Errorf("tree %s", got)
				}
			}},
		{name: "TV5 multi-tool turn", T: 1024,
			turns: []Turn{vt(h, "call"), vt(h+",a:call,t:A,t:B", "done")},
			want: []seg{{P0, ints(911, 909, 300, 317, 309, 300, 318, 309, 900, 912, 909),
				m(1, 1, 0, 0, 0, 0, 0, 0, 0, 1, 1), nil}},
			check: func(t *testing.T, s *Session) {
				if got := dump(s.root); got != "system[S](user[u](assistant[call]*1(tool[A](tool[B](assistant[done]*2)))))" {
					t.Errorf("tree %s", got)
				}
			}},
		{name: "TV6 empty response", T: 1024,
			turns: []Turn{vt(h, "", finish("length"))},
			want:  nil,
			check: func(t *testing.T, s *Session) {
				if got := dump(s.root); got != "system[S](user[u](assistant[<nil>]*1))" || s.Turns() != 1 {
					t.Errorf("tree %s turns %d", got, s.Turns())
				}
			}},
		{name: "TV7 drift in prompt region forks", T: 1024,
			turns: []Turn{vt(h, "call", withLP(-.5)), vt(h+",a:call,t:t", "done", ins(6, 701), withLP(-.4))},
			want: []seg{{P0, ints(911, 909), m(1, 1), lps(-.5, -.5)},
				{ints(100, 101, 109, 200, 201, 209, 701, 900, 911, 909, 300, 311, 309, 900), ints(912, 909), m(1, 1), lps(-.4, -.4)}}},
		{name: "TV8 realign", T: 1024,
			turns: []Turn{vt(h, "call", withLP(-.5)), vt(h+",a:call,t:t", "done", rep(8, 702), withLP(-.4))},
			want: []seg{{P0, ints(911, 702, 300, 311, 309, 900, 912, 909), m(0, 0, 0, 0, 0, 0, 1, 1),
				lps(0, 0, 0, 0, 0, 0, -.4, -.4)}},
			want0: tv8fork},
		{name: "TV9 realign prompts at T=1 fork", T: 1,
			turns: []Turn{vt(h, "call", withLP(-.5)), vt(h+",a:call,t:t", "done", rep(8, 702), withLP(-.4))},
			want:  tv8fork},
		{name: "TV10 drift in an earlier response forks", T: 1024,
			turns: []Turn{vt(h, "a1", withLP(-.5)), vt(h+",a:a1,t:t1", "a2", withLP(-.4)),
				vt(h+",a:a1,t:t1,a:a2,t:t2", "a3", rep(8, 702), withLP(-.3))},
			want: []seg{
				{P0, ints(915, 909, 300, 314, 309, 900, 916, 909), m(1, 1, 0, 0, 0, 0, 1, 1), lps(-.5, -.5, 0, 0, 0, 0, -.4, -.4)},
				{ints(100, 101, 109, 200, 201, 209, 900, 915, 702, 300, 314, 309, 900, 916, 909, 300, 315, 309, 900),
					ints(917, 909), m(1, 1), lps(-.3, -.3)}}},
		{name: "TV11 cross-leaf dedup", T: 1024,
			turns: []Turn{vt(h, "call", withLP(-.5)), vt(h+",a:call,t:x", "a2", withLP(-.4)), vt(h+",a:call,t:y", "a3", withLP(-.3))},
			want: []seg{
				{P0, ints(911, 909, 300, 312, 309, 900, 916, 909), m(1, 1, 0, 0, 0, 0, 1, 1), lps(-.5, -.5, 0, 0, 0, 0, -.4, -.4)},
				{P0, ints(911, 909, 300, 313, 309, 900, 917, 909), m(0, 0, 0, 0, 0, 0, 1, 1), lps(-.5, -.5, 0, 0, 0, 0, -.3, -.3)}}},
		{name: "TV12 foreign assistant is routing-only", T: 1024,
			turns: []Turn{vt(h, "a1"), vt(h+",a:a1,t:t1", "a2"), vt(h+",a:a1,t:t1,a:a2,a:foreign,t:t2", "a3")},
			want: []seg{{P0, ints(915, 909, 300, 314, 309, 900, 916, 909, 900, 925, 909, 300, 315, 309, 900, 917, 909),
				m(1, 1, 0, 0, 0, 0, 1, 1, 0, 0, 0, 0, 0, 0, 0, 1, 1), nil}}},
		{name: "TV13 rewrite-merge absorbs a short turn", T: 1024,
			turns: []Turn{vt(h, "ok", withLP(-.5)), vt(h+",a:ok ,t:t", "done", withLP(-.4))},
			want:  []seg{{p13, ints(912, 909), m(1, 1), lps(-.4, -.4)}},
			want0: []seg{{P0, ints(918, 909), m(1, 1), lps(-.5, -.5)}, {p13, ints(912, 909), m(1, 1), lps(-.4, -.4)}},
			check: func(t *testing.T, s *Session) {
				if s.opts.ForkMergeMaxResponseTokens == 0 {
					return
				}
				if got := dump(s.root); got != "system[S](user[u](assistant[ok ]~1(tool[t](assistant[done]*2))))" {
					t.Errorf("tree %s", got)
				}
				n := s.root.children[0].children[0].children[0]
				if n.merged == nil || n.merged.AbandonedTurnIndex != 1 || n.merged.AbandonedResponseTokens != 2 {
					t.Errorf("merged_rewrite %+v", n.merged)
				}
			}},
		{name: "TV14 rewrite with T=1 forks", T: 1,
			turns: []Turn{vt(h, "ok"), vt(h+",a:ok2 ,t:t", "done")},
			want: []seg{{P0, ints(918, 909), m(1, 1), nil},
				{ints(100, 101, 109, 200, 201, 209, 900, 936, 909, 300, 311, 309, 900), ints(912, 909), m(1, 1), nil}}},
		{name: "TV14 rewrite with T=0 forks", T: 0,
			turns: []Turn{vt(h, "ok"), vt(h+",a:ok3 ,t:t", "done")},
			want: []seg{{P0, ints(918, 909), m(1, 1), nil},
				{ints(100, 101, 109, 200, 201, 209, 900, 937, 909, 300, 311, 309, 900), ints(912, 909), m(1, 1), nil}}},
		{name: "TV15 ambiguous rewrite forks", T: 1024,
			turns: []Turn{vt(h, "a"), vt(h, "b"), vt(h+",a:c,t:t", "d")},
			want: []seg{{P0, ints(913, 909), m(1, 1), nil}, {P0, ints(914, 909), m(1, 1), nil},
				{ints(100, 101, 109, 200, 201, 209, 900, 926, 909, 300, 311, 309, 900), ints(927, 909), m(1, 1), nil}}},
		{name: "TV16 merged node keeps routing", T: 1024,
			turns: []Turn{vt(h, "ok"), vt(h+",a:ok5 ,t:t1", "second", withLP(-.4)),
				vt(h+",a:ok5 ,t:t1,a:second,t:t2", "third", withLP(-.3))},
			want:  []seg{tv16S},
			want0: []seg{{P0, ints(918, 909), m(1, 1), nil}, tv16S}},
		{name: "TV17 tree fork plus token drift", T: 1024,
			turns: []Turn{vt(h, "call", withLP(-.5)), vt(h+",a:call,t:x", "ax2", withLP(-.4)),
				vt(h+",a:call,t:x,a:ax2,t:xx", "ax3", ins(6, 701), withLP(-.2)), vt(h+",a:call,t:y", "ay2", withLP(-.1))},
			want: []seg{
				{P0, ints(911, 909, 300, 312, 309, 900, 922, 909), m(1, 1, 0, 0, 0, 0, 1, 1), lps(-.5, -.5, 0, 0, 0, 0, -.4, -.4)},
				{ints(100, 101, 109, 200, 201, 209, 701, 900, 911, 909, 300, 312, 309, 900, 922, 909, 300, 316, 309, 900),
					ints(923, 909), m(1, 1), lps(-.2, -.2)},
				{P0, ints(911, 909, 300, 313, 309, 900, 924, 909), m(0, 0, 0, 0, 0, 0, 1, 1), lps(-.5, -.5, 0, 0, 0, 0, -.1, -.1)}}},
		{name: "TV18 deep dedup", T: 1024,
			turns: []Turn{vt(h, "a1"), vt(h+",a:a1,t:t1", "a2"), vt(h+",a:a1,t:t1,a:a2,t:p", "end-p"),
				vt(h+",a:a1,t:t1,a:a2,t:q", "end-q"), vt(h+",a:a1,t:t1,a:a2,t:r", "end-r")},
			want: []seg{
				{P0, ints(915, 909, 300, 314, 309, 900, 916, 909, 300, 319, 309, 900, 930, 909), m(1, 1, 0, 0, 0, 0, 1, 1, 0, 0, 0, 0, 1, 1), nil},
				{P0, ints(915, 909, 300, 314, 309, 900, 916, 909, 300, 320, 309, 900, 931, 909), m(0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 1, 1), nil},
				{P0, ints(915, 909, 300, 314, 309, 900, 916, 909, 300, 321, 309, 900, 932, 909), m(0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 1, 1), nil}}},
		{name: "TV19 long mixed session", T: 1024,
			turns: []Turn{vt(h, "a0", withLP(-.5)), vt(h+",a:a0,t:t0", "a1", withLP(-.5)),
				vt(h+",a:a0,t:t0,a:a1,t:t1", "a2", withLP(-.5)), vt(tv19, "a3", rep(23, 702), withLP(-.5)),
				vt(tv19+",a:a3,t:t3", "a4", withLP(-.5)), vt(tv19+",a:a3,t:t3,a:a4,t:t4", "a5", ins(6, 701), withLP(-.5))},
			want: []seg{
				{P0, ints(933, 909, 300, 322, 309, 900, 915, 909, 300, 314, 309, 900, 916, 909, 300, 315, 702, 900, 917, 909),
					tv19mask0, lpm(tv19mask0, -.5)},
				{ints(100, 101, 109, 200, 201, 209, 900, 933, 909, 300, 322, 309, 900, 915, 909, 300, 314, 309, 900, 916, 909, 300, 315, 309, 900, 917, 909, 300, 323, 309, 900),
					ints(934, 909), m(1, 1), lps(-.5, -.5)},
				{ints(100, 101, 109, 200, 201, 209, 701, 900, 933, 909, 300, 322, 309, 900, 915, 909, 300, 314, 309, 900, 916, 909, 300, 315, 309, 900, 917, 909, 300, 323, 309, 900, 934, 909, 300, 324, 309, 900),
					ints(935, 909), m(1, 1), lps(-.5, -.5)}}},
		{name: "TV20 |out| == T forks", T: 2, turns: tv20, want: tv20fork},
		{name: "TV20 |out| < T realigns", T: 3, turns: tv20,
			want:  []seg{{P0, ints(9001, 9002, 9003, 702, 300, 311, 309, 900, 9100, 9101), m(0, 0, 0, 0, 0, 0, 0, 0, 1, 1), nil}},
			want0: tv20fork},
		{name: "TV21 mixed logprobs", T: 1024,
			turns: []Turn{vt(h, "call", withLP(-.5)), vt(h+",a:call,t:t", "done")},
			want:  []seg{{P0, ints(911, 909, 300, 311, 309, 900, 912, 909), m(1, 1, 0, 0, 0, 0, 1, 1), lps(-.5, -.5, 0, 0, 0, 0, 0, 0)}}},

		// TV23: the manager columns (T=0 and T=1024) of the legacy comparison.
		{name: "TV23 matched prefix", T: 1024,
			turns: []Turn{lt(ints(10), ints(11), "a11", "u:u", true), lt(ints(10, 11, 21), ints(12), "a12", "u:u,a:a11,t:21", true),
				lt(ints(10, 11, 21, 12, 31), ints(13), "a13", "u:u,a:a11,t:21,a:a12,t:31", true),
				lt(ints(10, 11, 21, 12, 22), ints(14), "a14", "u:u,a:a11,t:21,a:a12,t:22", true)},
			want: []seg{{ints(10), ints(11, 21, 12, 31, 13), m(1, 0, 1, 0, 1), lps(-.11, 0, -.12, 0, -.13)},
				{ints(10), ints(11, 21, 12, 22, 14), m(0, 0, 0, 0, 1), lps(-.11, 0, -.12, 0, -.14)}}},
		{name: "TV23 skipped turn", T: 1024,
			turns: []Turn{lt(ints(10), ints(11), "a11", "u:u", true), lt(ints(10, 11, 21), ints(12), "a12", "u:u,a:a11,t:21", true),
				lt(ints(10, 11, 22), ints(13), "a13", "u:u,a:a11,t:22", true),
				lt(ints(10, 11, 22, 13, 31), ints(14), "a14", "u:u,a:a11,t:22,a:a13,t:31", true)},
			want: []seg{{ints(10), ints(11, 21, 12), m(1, 0, 1), lps(-.11, 0, -.12)},
				{ints(10), ints(11, 22, 13, 31, 14), m(0, 0, 1, 0, 1), lps(-.11, 0, -.13, 0, -.14)}}},
		{name: "TV23 consecutive drifts", T: 1024,
			turns: []Turn{lt(ints(10), ints(11), "a11", "u:u", true), lt(ints(10, 11, 21), ints(12), "a12", "u:u,a:a11,t:21", true),
				lt(ints(10, 11, 22), ints(13), "a13", "u:u,a:a11,t:22", true),
				lt(ints(10, 11, 23), ints(14), "a14", "u:u,a:a11,t:23", true),
				lt(ints(10, 11, 23, 14, 31), ints(15), "a15", "u:u,a:a11,t:23,a:a14,t:31", true)},
			want: []seg{{ints(10), ints(11, 21, 12), m(1, 0, 1), lps(-.11, 0, -.12)},
				{ints(10), ints(11, 22, 13), m(0, 0, 1), lps(-.11, 0, -.13)},
				{ints(10), ints(11, 23, 14, 31, 15), m(0, 0, 1, 0, 1), lps(-.11, 0, -.14, 0, -.15)}}},
		{name: "TV23 split output", T: 1024,
			turns: []Turn{lt(ints(10), ints(11, 12, 13, 14), "a1", "u:u", true), lt(ints(10, 11, 12, 99, 14), ints(15), "a2", "u:u,a:a1", true)},
			want:  []seg{{ints(10), ints(11, 12, 99, 14, 15), m(0, 0, 0, 0, 1), lps(0, 0, 0, 0, -.15)}},
			want0: tv23split},
		{name: "TV23 changed count", T: 1024,
			turns: []Turn{lt(ints(10), ints(11, 12, 13, 14), "a1", "u:u", true), lt(ints(10, 11, 12, 99, 100, 14), ints(15), "a2", "u:u,a:a1", true)},
			want:  []seg{{ints(10), ints(11, 12, 99, 100, 14, 15), m(0, 0, 0, 0, 0, 1), lps(0, 0, 0, 0, 0, -.15)}},
			want0: tv23count},
		{name: "TV23 prompt-base restart", T: 1024,
			turns: []Turn{lt(ints(10), ints(11), "a11", "u:u", true), lt(ints(20, 21), ints(22), "a22", "s:sys2,u:u2", true),
				lt(ints(20, 21, 22, 23), ints(24), "a24", "s:sys2,u:u2,a:a22,t:23", true)},
			want: []seg{{ints(10), ints(11), m(1), lps(-.11)},
				{ints(20, 21), ints(22, 23, 24), m(1, 0, 1), lps(-.22, 0, -.24)}}},
		{name: "TV23 oversized single segment", T: 1024,
			turns: []Turn{lt(ints(10, 11, 12), ints(13, 14), "a1", "u:u", true)},
			want:  []seg{{ints(10, 11, 12), ints(13, 14), m(1, 1), lps(-.13, -.14)}}},
	}
}

func TestVectors(t *testing.T) {
	one := 1.0
	base := Base{RolloutID: 7, Index: 7, GroupIndex: 3, Reward: &one}
	for _, v := range vectors() {
		Ts := []int{v.T}
		if v.T != 0 {
			Ts = append(Ts, 0)
		}
		for _, T := range Ts {
			want := v.want
			if T != v.T && v.want0 != nil {
				want = v.want0
			}
			t.Run(v.name+"/T="+strconv.Itoa(T), func(t *testing.T) {
				s := NewSession(Options{ForkMergeMaxResponseTokens: T})
				for i, tr := range v.turns {
					if err := s.Record(tr); err != nil {
						t.Fatalf("record turn %d: %v", i+1, err)
					}
				}
				if v.check != nil {
					v.check(t, s)
				}
				got, err := s.Segments(base)
				if err != nil {
					t.Fatal(err)
				}
				checkSegs(t, got, want, base)
				if again, err := s.Segments(base); again != nil || err != nil {
					t.Errorf("second Segments = %v, %v; want nil, nil", again, err)
				}
			})
		}
	}
}

// dump renders the routing tree: role[content], * = generated (turn index),
// ~ = demoted by rewrite-merge (abandoned turn index).
func dump(n *node) string {
	out := ""
	for i, c := range n.children {
		if i > 0 {
			out += ","
		}
		label := "<nil>"
		if !c.none {
			label = contentOf(c.msg.raw)
		}
		out += c.msg.role + "[" + label + "]"
		if c.turn != nil {
			out += "*" + strconv.Itoa(c.turnIndex)
		}
		if c.merged != nil {
			out += "~" + strconv.Itoa(c.merged.AbandonedTurnIndex)
		}
		if len(c.children) > 0 {
			out += "(" + dump(c) + ")"
		}
	}
	return out
}

func contentOf(raw []byte) string {
	var v struct{ Content string }
	_ = json.Unmarshal(raw, &v)
	return v.Content
}
