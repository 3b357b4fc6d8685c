package assembly

import (
	"encoding/json"
	"fmt"
	"math/rand"
	"reflect"
	"testing"

	"github.com/kilnrl/kiln/formats/records"
)

// replayMode of a generated session.
type replayMode int

const (
	replayNone replayMode = iota
	replayTopP
	replayTopPLP
	replayTopK
	replayR3
	numReplayModes
)

// state is a point of a conversation the agent can prompt from: its
// messages and their token rendering (ending with the generation marker).
type state struct {
	msgs []json.RawMessage
	toks []int32
	// the turn that produced this state, for rewrites of its assistant message
	prevMsgs []json.RawMessage
	prevToks []int32
	tool     json.RawMessage
	toolToks []int32
}

type sessionGen struct {
	rng    *rand.Rand
	mode   replayMode
	labels int
}

func (g *sessionGen) label(prefix string) string {
	g.labels++
	return fmt.Sprintf("%s%d", prefix, g.labels)
}

func (g *sessionGen) randToks(n int) []int32 {
	out := make([]int32, n)
	for i := range out {
		out[i] = 1000 + g.rng.Int31n(500)
	}
	return out
}

func rawMsg(role, content string, toolCall bool) json.RawMessage {
	tc := ""
	if toolCall {
		tc = `,"tool_calls":[{"id":"x","type":"function","function":{"name":"f","arguments":"{}"}}]`
	}
	return json.RawMessage(fmt.Sprintf(`{"role":%q,"content":%q%s}`, role, content, tc))
}

func appendCopy(parts ...[]int32) []int32 {
	n := 0
	for _, p := range parts {
		n += len(p)
	}
	out := make([]int32, 0, n)
	for _, p := range parts {
		out = append(out, p...)
	}
	return out
}

func msgsCopy(parts ...[]json.RawMessage) []json.RawMessage {
	var out []json.RawMessage
	for _, p := range parts {
		out = append(out, p...)
	}
	return out
}

// fresh starts a conversation (a new sub-agent, or a compaction summary).
func (g *sessionGen) fresh(sys string) *state {
	user := g.label("user")
	msgs := []json.RawMessage{rawMsg("system", sys, false), rawMsg("user", user, false)}
	toks := appendCopy([]int32{100}, g.randToks(1+g.rng.Intn(4)), []int32{109, 200}, g.randToks(1+g.rng.Intn(6)), []int32{209, 900})
	return &state{msgs: msgs, toks: toks}
}

// turn samples a model call from prompt state st and returns it with the
// state after the agent's tool result.
func (g *sessionGen) turn(msgs []json.RawMessage, prompt []int32) (Turn, *state) {
	rng := g.rng
	t := Turn{PromptIDs: prompt, PromptMessages: msgs, FinishReason: "stop"}
	n := 1 + rng.Intn(6)
	if rng.Intn(20) == 0 {
		n = 0
		t.FinishReason = "length"
	}
	if n > 0 {
		t.OutputIDs = append(g.randToks(n-1), 909)
	}
	withLP := g.mode == replayTopPLP || rng.Intn(10) != 0
	if withLP {
		t.OutputLogProbs = make([]float32, n)
		for i := range t.OutputLogProbs {
			t.OutputLogProbs[i] = -rng.Float32() * 3
		}
	}
	switch g.mode {
	case replayTopP, replayTopPLP:
		t.TopPTokenOffsets = []int32{0}
		for i, tok := range t.OutputIDs {
			row := []int32{tok}
			for _, c := range rng.Perm(50)[:rng.Intn(4)] {
				row = append(row, 2000+int32(c))
			}
			rng.Shuffle(len(row), func(a, b int) { row[a], row[b] = row[b], row[a] })
			for _, id := range row {
				t.TopPTokenIDs = append(t.TopPTokenIDs, id)
				if g.mode == replayTopPLP {
					lp := -rng.Float32() * 5
					if id == tok {
						lp = t.OutputLogProbs[i]
					}
					t.TopPLogProbs = append(t.TopPLogProbs, lp)
				}
			}
			t.TopPTokenOffsets = append(t.TopPTokenOffsets, int32(len(t.TopPTokenIDs)))
		}
		if n == 0 {
			t.TopPTokenIDs = []int32{}
			if g.mode == replayTopPLP {
				t.TopPLogProbs = []float32{}
			}
		}
	case replayTopK:
		t.TopK = 3
		t.TopKTokenIDs = g.randToks(3 * n)
		t.TopKLogProbs = make([]float32, 3*n)
		for i := range t.TopKLogProbs {
			t.TopKLogProbs[i] = -rng.Float32()
		}
	case replayR3:
		rows := len(prompt) + n - 1
		t.RoutedExpertsShape = []int32{int32(rows), 2, 1}
		t.RoutedExperts = g.randToks(rows * 2)
	}
	if n == 0 {
		return t, nil
	}
	resp := g.label("resp")
	tool := rng.Intn(2) == 0
	t.ResponseMessage = rawMsg("assistant", resp, tool)
	if tool {
		t.FinishReason = "tool_calls"
	}
	toolMsg := rawMsg("tool", g.label("tool"), false)
	toolToks := appendCopy([]int32{300}, g.randToks(1+rng.Intn(5)), []int32{309, 900})
	// The client echoes the assistant message with its own key order.
	echo := json.RawMessage(fmt.Sprintf(`{"content":%q,"role":"assistant"%s}`, resp, map[bool]string{true: `,"tool_calls":[{"function":{"arguments":"{}","name":"f"},"id":"x","type":"function"}]`}[tool]))
	next := &state{
		msgs:     msgsCopy(msgs, []json.RawMessage{echo, toolMsg}),
		toks:     appendCopy(prompt, t.OutputIDs, toolToks),
		prevMsgs: msgs, prevToks: prompt, tool: toolMsg, toolToks: toolToks,
	}
	return t, next
}

// genSession produces the turns of one random session: branching,
// token drift, compaction-like rewrites and two interleaved sub-agents.
func genSession(seed int64) ([]Turn, replayMode) {
	rng := rand.New(rand.NewSource(seed))
	g := &sessionGen{rng: rng, mode: replayMode(seed % int64(numReplayModes))}
	chains := [2][]*state{{g.fresh("main")}, nil}
	cur := 0
	var turns []Turn
	for len(turns) < 5+rng.Intn(26) {
		if chains[1] == nil && rng.Intn(8) == 0 {
			chains[1] = []*state{g.fresh("subagent")}
		}
		if chains[1] != nil && rng.Intn(3) == 0 {
			cur = 1 - cur // interleave the sub-agent with the main chain
		}
		hist := chains[cur]
		st := hist[len(hist)-1]
		msgs, prompt := st.msgs, st.toks
		switch op := rng.Intn(20); {
		case op < 3 && len(hist) > 1: // branch: re-ask from an earlier history
			st = hist[rng.Intn(len(hist)-1)]
			msgs, prompt = st.msgs, st.toks
		case op < 5: // token drift: re-rendered history, same messages
			p := append([]int32{}, prompt...)
			i := rng.Intn(len(p))
			if rng.Intn(2) == 0 {
				p = append(p[:i], append([]int32{701}, p[i:]...)...)
			} else {
				p[i] = 702
			}
			prompt = p
		case op < 6: // compaction: history replaced by a summary
			st = g.fresh(map[int]string{0: "main", 1: "subagent"}[cur])
			msgs, prompt = st.msgs, st.toks
		case op < 8 && st.prevMsgs != nil: // the client rewrote the last assistant message
			rw := rawMsg("assistant", g.label("rewrite"), false)
			msgs = msgsCopy(st.prevMsgs, []json.RawMessage{rw, st.tool})
			prompt = appendCopy(st.prevToks, g.randToks(1+rng.Intn(3)), []int32{909}, st.toolToks)
		}
		t, next := g.turn(msgs, appendCopy(prompt))
		turns = append(turns, t)
		if next != nil {
			chains[cur] = append(chains[cur], next)
		}
	}
	return turns, g.mode
}

// audit checks that every trained token is a sampled output token at the
// position it was sampled with its recorded logprob, that no sampled token
// is trained twice, and returns the number of trained tokens.
func audit(t *testing.T, turns []Turn, segs []records.Trajectory, mode replayMode) int {
	t.Helper()
	used := make([]bool, len(turns))
	trained := 0
	for si := range segs {
		g := &segs[si]
		if err := g.Validate(); err != nil {
			t.Fatalf("S%d: %v", si, err)
		}
		if err := ValidateSamplerTopP(g); err != nil {
			t.Fatalf("S%d: %v", si, err)
		}
		if g.Segment != int32(si) {
			t.Fatalf("S%d numbered %d", si, g.Segment)
		}
		rl := int(g.ResponseLength)
		lead := len(g.Tokens) - rl
		runs := 0
		for r := 0; r < rl; {
			if g.LossMask[r] == 0 {
				r++
				continue
			}
			pos := lead + r
			found := -1
			for ti, tr := range turns {
				n := len(tr.OutputIDs)
				if used[ti] || n == 0 || pos+n > len(g.Tokens) || !i32eq(tr.PromptIDs, g.Tokens[:pos]) || !i32eq(tr.OutputIDs, g.Tokens[pos:pos+n]) {
					continue
				}
				ok := true
				for i := 0; i < n; i++ {
					lp := float32(0)
					if len(tr.OutputLogProbs) > 0 {
						lp = tr.OutputLogProbs[i]
					}
					if g.LossMask[r+i] != 1 || g.RolloutLogProbs[r+i] != lp {
						ok = false
						break
					}
				}
				if ok {
					found = ti
					break
				}
			}
			if found < 0 {
				t.Fatalf("S%d: trained run at response row %d matches no unused sampled turn", si, r)
			}
			used[found] = true
			tr := turns[found]
			n := len(tr.OutputIDs)
			switch mode {
			case replayTopP, replayTopPLP:
				a, b := tr.TopPTokenOffsets[0], tr.TopPTokenOffsets[n]
				ga, gb := g.TopPTokenOffsets[r], g.TopPTokenOffsets[r+n]
				if !i32eq(g.TopPTokenIDs[ga:gb], tr.TopPTokenIDs[a:b]) {
					t.Fatalf("S%d: top-p ids of turn %d not carried", si, found)
				}
			case replayTopK:
				if !i32eq(g.TopKTokenIDs[r*3:(r+n)*3], tr.TopKTokenIDs) {
					t.Fatalf("S%d: top-k heads of turn %d not carried", si, found)
				}
			case replayR3:
				if lead != len(tr.PromptIDs) || rl != n {
					t.Fatalf("S%d: R3 segment is not exactly turn %d", si, found)
				}
				if !i32eq(g.RoutedExperts, tr.RoutedExperts[:2*(len(g.Tokens)-1)]) || g.RoutedExpertsShape[0] != int32(len(g.Tokens)-1) {
					t.Fatalf("S%d: routes of turn %d not carried", si, found)
				}
			}
			trained += n
			r += n
			runs++
		}
		if runs == 0 {
			t.Fatalf("S%d trains nothing", si)
		}
	}
	return trained
}

func TestPropertyRandomSessions(t *testing.T) {
	const sessions = 400
	forks := 0
	for seed := int64(1); seed <= sessions; seed++ {
		turns, mode := genSession(seed)
		sampled := 0
		for _, tr := range turns {
			sampled += len(tr.OutputIDs)
		}
		for _, T := range []int{0, 3, 1024} {
			s := NewSession(Options{ForkMergeMaxResponseTokens: T})
			for i, tr := range turns {
				if err := s.Record(tr); err != nil {
					t.Fatalf("seed %d T=%d turn %d: %v", seed, T, i, err)
				}
			}
			segs, err := s.Segments(Base{RolloutID: seed, Index: seed})
			if err != nil {
				t.Fatalf("seed %d T=%d: %v", seed, T, err)
			}
			var trained int
			t.Run("", func(t *testing.T) {
				trained = audit(t, turns, segs, mode)
			})
			if t.Failed() {
				t.Fatalf("seed %d T=%d mode %d failed", seed, T, mode)
			}
			if T == 0 {
				if trained != sampled {
					t.Fatalf("seed %d: T=0 trains %d tokens, sampled %d", seed, trained, sampled)
				}
				forks += len(segs)
			} else if trained > sampled {
				t.Fatalf("seed %d T=%d: trains %d > sampled %d", seed, T, trained, sampled)
			}
		}
	}
	t.Logf("%d sessions, %d segments at T=0", sessions, forks)
}

func TestDeterminism(t *testing.T) {
	for seed := int64(1); seed <= 50; seed++ {
		turns, _ := genSession(seed)
		var prev []records.Trajectory
		for rep := 0; rep < 3; rep++ {
			s := NewSession(Options{ForkMergeMaxResponseTokens: int(seed % 3)})
			for _, tr := range turns {
				if err := s.Record(tr); err != nil {
					t.Fatal(err)
				}
			}
			segs, err := s.Segments(Base{RolloutID: 1})
			if err != nil {
				t.Fatal(err)
			}
			if rep > 0 && !reflect.DeepEqual(prev, segs) {
				t.Fatalf("seed %d: run %d differs", seed, rep)
			}
			prev = segs
		}
	}
}

// TestSharedMessageMemory: a message that is the previous turn's very bytes
// mounts on the previous turn's path without comparison. That shortcut must
// give exactly what comparing bytes gives, so every session is assembled
// with its messages shared between turns (as the generator and kiln's JSON
// splitter produce them) and with every message copied to its own memory.
func TestSharedMessageMemory(t *testing.T) {
	shared := 0
	for seed := int64(1); seed <= 200; seed++ {
		turns, _ := genSession(seed)
		copied := make([]Turn, len(turns))
		for i, tr := range turns {
			copied[i] = tr
			copied[i].PromptMessages = make([]json.RawMessage, len(tr.PromptMessages))
			for j, m := range tr.PromptMessages {
				copied[i].PromptMessages[j] = append(json.RawMessage(nil), m...)
				if i > 0 && j < len(turns[i-1].PromptMessages) && sameMemory(m, turns[i-1].PromptMessages[j]) {
					shared++
				}
			}
		}
		for _, T := range []int{0, 1024} {
			var got [2][]records.Trajectory
			for k, ts := range [][]Turn{turns, copied} {
				s := NewSession(Options{ForkMergeMaxResponseTokens: T})
				for _, tr := range ts {
					if err := s.Record(tr); err != nil {
						t.Fatal(err)
					}
				}
				segs, err := s.Segments(Base{RolloutID: seed})
				if err != nil {
					t.Fatal(err)
				}
				got[k] = segs
			}
			if !reflect.DeepEqual(got[0], got[1]) {
				t.Fatalf("seed %d T=%d: shared and copied messages assemble differently", seed, T)
			}
		}
	}
	if shared == 0 {
		t.Fatal("no session shared message memory between turns: the shortcut went untested")
	}
	t.Logf("%d messages shared with the previous turn", shared)
}
