package assembly

import (
	"fmt"
	"math"
	"strings"
	"testing"

	"github.com/kilnrl/kiln/formats/records"
)

// replayCfg is one V-REPLAY capture configuration (docs/assembly.md §5, item 2).
type replayCfg struct {
	topP float64
	sc   bool
	r3   bool
}

func (c replayCfg) String() string { return fmt.Sprintf("top_p=%g,sc=%t,r3=%t", c.topP, c.sc, c.r3) }

// tv24Turn is the fake engine's reply for prompt: tokens [101,102] with
// logprobs ln .7, ln .6, nucleus rows [101,201]/[102,202] with probs
// (.7,.3)/(.6,.4), routes [len(prompt)+1, 2, 2].
func tv24Turn(c replayCfg, prompt []int32, resp, msgs string) Turn {
	t := Turn{PromptIDs: prompt, OutputIDs: ints(101, 102), OutputLogProbs: lps(lnf(.7), lnf(.6)), FinishReason: "stop",
		ResponseMessage: msgJSON("a:"+resp, false)}
	for _, ms := range strings.Split(msgs, ",") {
		t.PromptMessages = append(t.PromptMessages, msgJSON(ms, true))
	}
	ids, lp := ints(101, 201, 102, 202), lps(lnf(.7), lnf(.3), lnf(.6), lnf(.4))
	if c.topP < 1 {
		t.TopPTokenIDs, t.TopPTokenOffsets = ids, ints(0, 2, 4)
		if c.sc {
			t.TopPLogProbs = lp
		}
	} else if c.sc {
		t.TopKTokenIDs, t.TopKLogProbs, t.TopK = ids, lp, 2
	}
	if c.r3 {
		rows := len(prompt) + 1
		t.RoutedExpertsShape = ints(int32(rows), 2, 2)
		for i := 0; i < rows*4; i++ {
			t.RoutedExperts = append(t.RoutedExperts, int32(i%7))
		}
	}
	return t
}

// TV24: replay through exact-prefix extension, every capture configuration,
// untruncated and with max_sample_tokens = 7.
func TestTV24ReplayExactPrefix(t *testing.T) {
	one := 1.0
	half := lnf(.5)
	cfgs := []replayCfg{{.95, false, false}, {.95, true, false}, {1, true, false}, {.95, true, true}, {1, true, true}}
	for _, c := range cfgs {
		for _, maxTok := range []int{0, 7} {
			t.Run(fmt.Sprintf("%s/max=%d", c, maxTok), func(t *testing.T) {
				base := Base{RolloutID: 4, Index: 4, GroupIndex: 2, Reward: &one, MaxSampleTokens: maxTok}
				t1 := tv24Turn(c, ints(51, 52, 53), "inspect", "u:u")
				t2 := tv24Turn(c, ints(51, 52, 53, 101, 102, 9), "inspect2", "u:u,a:inspect,t:9")
				got, err := run(t, 1024, base, []Turn{t1, t2})
				if err != nil {
					t.Fatal(err)
				}
				var want []seg
				type rp struct {
					off, ids []int32
					nlp      []float32
					kids     []int32
					klp      []float32
					routes   []int32 // shape
				}
				var wantRP []rp
				n1 := []float32{lnf(.7), lnf(.3), lnf(.6), lnf(.4)}
				switch {
				case !c.r3 && maxTok == 0:
					want = []seg{{ints(51, 52, 53), ints(101, 102, 9, 101, 102), m(1, 1, 0, 1, 1), lps(lnf(.7), lnf(.6), 0, lnf(.7), lnf(.6))}}
					wantRP = []rp{{off: ints(0, 2, 4, 4, 6, 8), ids: ints(101, 201, 102, 202, 101, 201, 102, 202), nlp: append(append([]float32{}, n1...), n1...),
						kids: ints(101, 201, 102, 202, 0, 1, 101, 201, 102, 202), klp: append(append(append([]float32{}, n1...), half, half), n1...)}}
				case !c.r3:
					want = []seg{{ints(51, 52, 53), ints(101, 102, 9, 101), m(1, 1, 0, 1), lps(lnf(.7), lnf(.6), 0, lnf(.7))}}
					wantRP = []rp{{off: ints(0, 2, 4, 4, 6), ids: ints(101, 201, 102, 202, 101, 201), nlp: append(append([]float32{}, n1...), n1[:2]...),
						kids: ints(101, 201, 102, 202, 0, 1, 101, 201), klp: append(append(append([]float32{}, n1...), half, half), n1[:2]...)}}
				case maxTok == 0:
					want = []seg{{ints(51, 52, 53), ints(101, 102), m(1, 1), lps(lnf(.7), lnf(.6))},
						{ints(51, 52, 53, 101, 102, 9), ints(101, 102), m(1, 1), lps(lnf(.7), lnf(.6))}}
					r := rp{off: ints(0, 2, 4), ids: ints(101, 201, 102, 202), nlp: n1, kids: ints(101, 201, 102, 202), klp: n1}
					r1, r2 := r, r
					r1.routes, r2.routes = ints(4, 2, 2), ints(7, 2, 2)
					wantRP = []rp{r1, r2}
				default:
					want = []seg{{ints(51, 52, 53), ints(101, 102), m(1, 1), lps(lnf(.7), lnf(.6))},
						{ints(51, 52, 53, 101, 102, 9), ints(101), m(1), lps(lnf(.7))}}
					wantRP = []rp{{off: ints(0, 2, 4), ids: ints(101, 201, 102, 202), nlp: n1, kids: ints(101, 201, 102, 202), klp: n1, routes: ints(4, 2, 2)},
						{off: ints(0, 2), ids: ints(101, 201), nlp: n1[:2], kids: ints(101, 201), klp: n1[:2], routes: ints(6, 2, 2)}}
				}
				checkSegs(t, got, want, base)
				for i, g := range got {
					w := wantRP[i]
					if c.topP < 1 {
						if !i32eq(g.TopPTokenOffsets, w.off) || !i32eq(g.TopPTokenIDs, w.ids) {
							t.Errorf("S%d top-p offsets %v ids %v, want %v %v", i, g.TopPTokenOffsets, g.TopPTokenIDs, w.off, w.ids)
						}
						if c.sc && !f32eq(g.TopPLogProbs, w.nlp, 1e-6) {
							t.Errorf("S%d nucleus logprobs %v, want %v", i, g.TopPLogProbs, w.nlp)
						}
						if !c.sc && g.TopPLogProbs != nil {
							t.Errorf("S%d nucleus logprobs without SC", i)
						}
						if g.TopKTokenIDs != nil {
							t.Errorf("S%d has top-k heads", i)
						}
					} else {
						if g.TopPTokenOffsets != nil || g.TopPTokenIDs != nil {
							t.Errorf("S%d has top-p columns at top_p 1", i)
						}
						if g.TopK != 2 || !i32eq(g.TopKTokenIDs, w.kids) || !f32eq(g.TopKLogProbs, w.klp, 1e-6) {
							t.Errorf("S%d top-k k=%d ids %v lp %v, want %v %v", i, g.TopK, g.TopKTokenIDs, g.TopKLogProbs, w.kids, w.klp)
						}
					}
					if c.r3 {
						if !i32eq(g.RoutedExpertsShape, w.routes) || len(g.RoutedExperts) != int(w.routes[0]*4) {
							t.Errorf("S%d routes shape %v (%d values), want %v", i, g.RoutedExpertsShape, len(g.RoutedExperts), w.routes)
						}
						src := t1
						if i == 1 {
							src = t2
						}
						if !i32eq(g.RoutedExperts, src.RoutedExperts[:len(g.RoutedExperts)]) {
							t.Errorf("S%d routes are not the turn's route prefix", i)
						}
					} else if g.RoutedExperts != nil {
						t.Errorf("S%d has routes", i)
					}
					if err := ValidateSamplerTopP(&g); err != nil {
						t.Errorf("S%d: %v", i, err)
					}
				}
			})
		}
	}
}

// tv25Turns: ragged distributions and a generated prefix shared by two
// branches (docs/assembly.md §6 TV25).
func tv25Turns() []Turn {
	t1 := Turn{PromptIDs: ints(51, 52, 53), OutputIDs: ints(101, 102), OutputLogProbs: lps(lnf(.7), lnf(.6)), FinishReason: "tool_calls",
		Replay:         records.Replay{TopPTokenIDs: ints(101, 201, 102, 202), TopPTokenOffsets: ints(0, 2, 4), TopPLogProbs: lps(lnf(.7), lnf(.3), lnf(.6), lnf(.4))},
		PromptMessages: raws(msgJSON("u:u", true)), ResponseMessage: msgJSON("a:call-inspect", false)}
	branch := func(prompt []int32, tool string) Turn {
		return Turn{PromptIDs: prompt, OutputIDs: ints(103, 104, 105), OutputLogProbs: lps(-.1, -.2, -.3), FinishReason: "stop",
			Replay:          records.Replay{TopPTokenIDs: ints(103, 104, 204, 105), TopPTokenOffsets: ints(0, 1, 3, 4), TopPLogProbs: lps(-.1, -.2, -1.0, -.3)},
			PromptMessages:  raws(msgJSON("u:u", true), msgJSON("a:call-inspect", true), msgJSON("t:"+tool, true)),
			ResponseMessage: msgJSON("a:done-"+tool, false)}
	}
	return []Turn{t1, branch(ints(51, 52, 53, 101, 102, 9, 8, 7), "left"), branch(ints(51, 52, 53, 101, 102, 6, 5), "right")}
}

func TestTV25RaggedSharedBranch(t *testing.T) {
	for _, T := range []int{0, 1024} {
		t.Run("T="+fmt.Sprint(T), func(t *testing.T) {
			base := Base{RolloutID: 9, Index: 9, GroupIndex: 1}
			got, err := run(t, T, base, tv25Turns())
			if err != nil {
				t.Fatal(err)
			}
			checkSegs(t, got, []seg{
				{ints(51, 52, 53), ints(101, 102, 9, 8, 7, 103, 104, 105), m(1, 1, 0, 0, 0, 1, 1, 1), lps(lnf(.7), lnf(.6), 0, 0, 0, -.1, -.2, -.3)},
				{ints(51, 52, 53), ints(101, 102, 6, 5, 103, 104, 105), m(0, 0, 0, 0, 1, 1, 1), lps(lnf(.7), lnf(.6), 0, 0, -.1, -.2, -.3)},
			}, base)
			if len(got) != 2 {
				return
			}
			if w := ints(0, 2, 4, 4, 4, 4, 5, 7, 8); !i32eq(got[0].TopPTokenOffsets, w) {
				t.Errorf("S0 offsets %v, want %v", got[0].TopPTokenOffsets, w)
			}
			if w := ints(0, 2, 4, 4, 4, 5, 7, 8); !i32eq(got[1].TopPTokenOffsets, w) {
				t.Errorf("S1 offsets %v, want %v", got[1].TopPTokenOffsets, w)
			}
			for i := range got {
				if w := ints(101, 201, 102, 202, 103, 104, 204, 105); !i32eq(got[i].TopPTokenIDs, w) {
					t.Errorf("S%d ids %v, want %v", i, got[i].TopPTokenIDs, w)
				}
				if w := lps(lnf(.7), lnf(.3), lnf(.6), lnf(.4), -.1, -.2, -1, -.3); !f32eq(got[i].TopPLogProbs, w, 1e-6) {
					t.Errorf("S%d nucleus logprobs %v, want %v", i, got[i].TopPLogProbs, w)
				}
			}
			// Audit: every sampled token trained exactly once.
			sum := 0
			for _, g := range got {
				for _, x := range g.LossMask {
					sum += int(x)
				}
			}
			if sum != 8 {
				t.Errorf("Σ loss_mask = %d, want 8 sampled tokens", sum)
			}
		})
	}
	t.Run("corrupt nucleus logprob", func(t *testing.T) {
		turns := tv25Turns()
		turns[1].TopPLogProbs = lps(-.1, -.2, -1.0, -.8)
		_, err := run(t, 0, Base{}, turns)
		if err == nil || !strings.Contains(err.Error(), "sampler distribution must include the sampled token") {
			t.Fatalf("err = %v", err)
		}
	})
	t.Run("sampled token missing", func(t *testing.T) {
		turns := tv25Turns()
		turns[1].TopPTokenIDs = ints(103, 104, 204, 999)
		_, err := run(t, 0, Base{}, turns)
		if err == nil || !strings.Contains(err.Error(), "sampler distribution must include the sampled token") {
			t.Fatalf("err = %v", err)
		}
	})
}

// TV26 maps onto the manager as two turns: the untrainable environment
// tokens between outputs are the second prompt's tail; the manager never
// appends context after the last output, so the trailing [9] of the vector
// has no counterpart (and the leading [9] belongs to the first prompt).
func TestTV26IncrementalAppend(t *testing.T) {
	t.Run("top-p", func(t *testing.T) {
		mk := func(prompt []int32, resp string, msgs ...string) Turn {
			tr := Turn{PromptIDs: prompt, OutputIDs: ints(4, 2), OutputLogProbs: lps(lnf(.7), 0),
				Replay:          records.Replay{TopPTokenIDs: ints(1, 4, 2), TopPTokenOffsets: ints(0, 2, 3), TopPLogProbs: lps(lnf(.3), lnf(.7), 0)},
				ResponseMessage: msgJSON("a:"+resp, false)}
			for _, ms := range msgs {
				tr.PromptMessages = append(tr.PromptMessages, msgJSON(ms, true))
			}
			return tr
		}
		got, err := run(t, 0, Base{}, []Turn{mk(ints(8, 9), "r1", "u:u"), mk(ints(8, 9, 4, 2, 9), "r2", "u:u", "a:r1", "t:9")})
		if err != nil {
			t.Fatal(err)
		}
		checkSegs(t, got, []seg{{ints(8, 9), ints(4, 2, 9, 4, 2), m(1, 1, 0, 1, 1), lps(lnf(.7), 0, 0, lnf(.7), 0)}}, Base{})
		if len(got) == 1 {
			if w := ints(0, 2, 3, 3, 5, 6); !i32eq(got[0].TopPTokenOffsets, w) {
				t.Errorf("offsets %v, want %v", got[0].TopPTokenOffsets, w)
			}
			if got[0].TopKTokenIDs != nil || got[0].TopKLogProbs != nil {
				t.Error("top-k fields set")
			}
		}
	})
	t.Run("top-k", func(t *testing.T) {
		head, hlp := ints(3, 1, 4), lps(-.5, -2, -3)
		got, err := run(t, 0, Base{}, []Turn{
			{PromptIDs: ints(9), OutputIDs: ints(3), OutputLogProbs: lps(-.5), Replay: records.Replay{TopKTokenIDs: head, TopKLogProbs: hlp, TopK: 3},
				PromptMessages: raws(msgJSON("u:u", true)), ResponseMessage: msgJSON("a:r1", false)},
			{PromptIDs: ints(9, 3, 8, 9), OutputIDs: ints(1), OutputLogProbs: lps(-2), Replay: records.Replay{TopKTokenIDs: head, TopKLogProbs: hlp, TopK: 3},
				PromptMessages: raws(msgJSON("u:u", true), msgJSON("a:r1", true), msgJSON("t:89", true)), ResponseMessage: msgJSON("a:r2", false)},
		})
		if err != nil {
			t.Fatal(err)
		}
		checkSegs(t, got, []seg{{ints(9), ints(3, 8, 9, 1), m(1, 0, 0, 1), lps(-.5, 0, 0, -2)}}, Base{})
		if len(got) == 1 {
			d := float32(-math.Log(3))
			if w := ints(3, 1, 4, 0, 1, 2, 0, 1, 2, 3, 1, 4); !i32eq(got[0].TopKTokenIDs, w) || got[0].TopK != 3 {
				t.Errorf("head ids %v k %d, want %v", got[0].TopKTokenIDs, got[0].TopK, w)
			}
			if w := lps(-.5, -2, -3, d, d, d, d, d, d, -.5, -2, -3); !f32eq(got[0].TopKLogProbs, w, 1e-6) {
				t.Errorf("head logprobs %v, want %v", got[0].TopKLogProbs, w)
			}
			if got[0].TopPTokenIDs != nil {
				t.Error("top-p fields set")
			}
		}
	})
}
