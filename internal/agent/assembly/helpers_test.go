package assembly

import (
	"encoding/json"
	"fmt"
	"math"
	"strings"
	"testing"

	"github.com/kilnrl/kiln/formats/records"
)

// Token table of docs/assembly.md §6: a message renders [start, body, end], a prompt is
// its messages + [900], a response is [body, 909].
var roleTokens = map[string][2]int32{
	"system": {100, 109}, "user": {200, 209}, "tool": {300, 309}, "assistant": {900, 909},
}

var roleNames = map[string]string{"s": "system", "u": "user", "t": "tool", "a": "assistant"}

var bodies = map[string]map[string]int32{
	"system": {"S": 101, "SA": 102, "SB": 103},
	"user":   {"u": 201, "A": 202, "B": 203},
	"tool": {"t": 311, "x": 312, "y": 313, "t1": 314, "t2": 315, "xx": 316, "A": 317, "B": 318,
		"p": 319, "q": 320, "r": 321, "t0": 322, "t3": 323, "t4": 324},
	"assistant": {"call": 911, "done": 912, "a": 913, "b": 914, "a1": 915, "a2": 916, "a3": 917,
		"ok": 918, "ok ": 919, "ax2": 922, "ax3": 923, "ay2": 924, "foreign": 925, "c": 926, "d": 927,
		"second": 928, "third": 929, "end-p": 930, "end-q": 931, "end-r": 932, "a0": 933, "a4": 934,
		"a5": 935, "ok2 ": 936, "ok3 ": 937, "ok5 ": 938},
}

const P = 900 // generation marker (assistant start)

var P0 = []int32{100, 101, 109, 200, 201, 209, 900}

// split parses "r:label" (r = s, u, t, a).
func split(m string) (role, label string) {
	r, label, ok := strings.Cut(m, ":")
	if !ok || roleNames[r] == "" {
		panic("bad message spec " + m)
	}
	return roleNames[r], label
}

// msgJSON renders a message as the client would echo it. Assistant "call"
// carries a tool call. Prompt echoes put "content" first, while the adapter's
// response message puts "role" first, so routing must compare decoded values.
func msgJSON(m string, echo bool) json.RawMessage {
	role, label := split(m)
	tc := ""
	if role == "assistant" && (label == "call" || strings.HasPrefix(label, "call")) {
		tc = `,"tool_calls":[{"id":"c1","type":"function","function":{"name":"bash","arguments":"{}"}}]`
	}
	if echo {
		return json.RawMessage(fmt.Sprintf(`{"content": %q, "role": %q%s}`, label, role, tc))
	}
	return json.RawMessage(fmt.Sprintf(`{"role":%q,"content":%q%s}`, role, label, tc))
}

func body(m string) int32 {
	role, label := split(m)
	b, ok := bodies[role][label]
	if !ok {
		panic("no token for " + m)
	}
	return b
}

func render(msgs []string) []int32 {
	var out []int32
	for _, m := range msgs {
		role, _ := split(m)
		rt := roleTokens[role]
		out = append(out, rt[0], body(m), rt[1])
	}
	return append(out, P)
}

type turnOpt func(*Turn)

// ins inserts tok at index i of the prompt; rep replaces index i.
func ins(i int, tok int32) turnOpt {
	return func(t *Turn) {
		p := append([]int32{}, t.PromptIDs[:i]...)
		p = append(p, tok)
		t.PromptIDs = append(p, t.PromptIDs[i:]...)
	}
}

func rep(i int, tok int32) turnOpt {
	return func(t *Turn) {
		p := append([]int32{}, t.PromptIDs...)
		p[i] = tok
		t.PromptIDs = p
	}
}

func withLP(lp float32) turnOpt {
	return func(t *Turn) {
		t.OutputLogProbs = make([]float32, len(t.OutputIDs))
		for i := range t.OutputLogProbs {
			t.OutputLogProbs[i] = lp
		}
	}
}

func finish(r string) turnOpt { return func(t *Turn) { t.FinishReason = r } }

// vt is a vector turn: prompt messages (comma separated specs) -> assistant
// label.
func vt(msgs string, resp string, opts ...turnOpt) Turn {
	ms := strings.Split(msgs, ",")
	t := Turn{PromptIDs: render(ms), FinishReason: "stop"}
	for _, m := range ms {
		t.PromptMessages = append(t.PromptMessages, msgJSON(m, true))
	}
	if resp != "" {
		t.OutputIDs = []int32{body("a:" + resp), 909}
		t.ResponseMessage = msgJSON("a:"+resp, false)
	}
	for _, o := range opts {
		o(&t)
	}
	return t
}

func cat(parts ...[]int32) []int32 {
	var out []int32
	for _, p := range parts {
		out = append(out, p...)
	}
	return out
}

func ints(v ...int32) []int32 { return v }

// seg is an expected segment; lp nil means all zero.
type seg struct {
	prompt, resp []int32
	mask         []uint8
	lp           []float32
}

func run(t *testing.T, T int, base Base, turns []Turn) ([]records.Trajectory, error) {
	t.Helper()
	s := NewSession(Options{ForkMergeMaxResponseTokens: T})
	for i, tr := range turns {
		if err := s.Record(tr); err != nil {
			t.Fatalf("record turn %d: %v", i+1, err)
		}
	}
	return s.Segments(base)
}

func f32eq(a, b []float32, tol float64) bool {
	if len(a) != len(b) {
		return false
	}
	for i := range a {
		if math.Abs(float64(a[i])-float64(b[i])) > tol {
			return false
		}
	}
	return true
}

func i32eq(a, b []int32) bool {
	if len(a) != len(b) {
		return false
	}
	for i := range a {
		if a[i] != b[i] {
			return false
		}
	}
	return true
}

// checkSegs compares segments with the expectation and checks the ids,
// reward, numbering and invariants every segment must hold.
func checkSegs(t *testing.T, got []records.Trajectory, want []seg, base Base) {
	t.Helper()
	if len(got) != len(want) {
		for i := range got {
			t.Logf("got S%d: %v | %v ; %v ; %v", i, got[i].Tokens[:len(got[i].Tokens)-int(got[i].ResponseLength)],
				got[i].Tokens[len(got[i].Tokens)-int(got[i].ResponseLength):], got[i].LossMask, got[i].RolloutLogProbs)
		}
		t.Fatalf("got %d segments, want %d", len(got), len(want))
	}
	for i, w := range want {
		g := &got[i]
		rl := int(g.ResponseLength)
		gp, gr := g.Tokens[:len(g.Tokens)-rl], g.Tokens[len(g.Tokens)-rl:]
		if !i32eq(gp, w.prompt) || !i32eq(gr, w.resp) {
			t.Errorf("S%d tokens %v | %v, want %v | %v", i, gp, gr, w.prompt, w.resp)
		}
		if string(g.LossMask) != string(w.mask) {
			t.Errorf("S%d mask %v, want %v", i, g.LossMask, w.mask)
		}
		wlp := w.lp
		if wlp == nil {
			wlp = make([]float32, len(w.resp))
		}
		if !f32eq(g.RolloutLogProbs, wlp, 1e-6) {
			t.Errorf("S%d logprobs %v, want %v", i, g.RolloutLogProbs, wlp)
		}
		if g.Segment != int32(i) || g.RolloutID != base.RolloutID || g.Index != base.Index || g.GroupIndex != base.GroupIndex {
			t.Errorf("S%d ids segment=%d rollout=%d index=%d group=%d", i, g.Segment, g.RolloutID, g.Index, g.GroupIndex)
		}
		switch {
		case base.Reward == nil && g.Reward != nil:
			t.Errorf("S%d reward %v, want null", i, *g.Reward)
		case base.Reward != nil && (g.Reward == nil || *g.Reward != *base.Reward):
			t.Errorf("S%d reward %v, want full reward %v", i, g.Reward, *base.Reward)
		}
		if err := g.Validate(); err != nil {
			t.Errorf("S%d: %v", i, err)
		}
	}
}

func lnf(p float64) float32 { return float32(math.Log(p)) }

func raws(v ...json.RawMessage) []json.RawMessage { return v }
