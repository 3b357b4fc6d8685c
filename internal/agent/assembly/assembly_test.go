package assembly

import (
	"encoding/json"
	"strings"
	"testing"
)

// TV22 contracts and the fail-closed replay checks of Record.
func TestRecordContracts(t *testing.T) {
	good := func() Turn { return vt(h, "ok") }
	cases := []struct {
		name    string
		mutate  func(*Turn)
		wantErr string // "" = accepted
	}{
		{"TV22 logprob length mismatch", func(t *Turn) {
			t.OutputIDs = ints(918, 909, 1)
			t.OutputLogProbs = lps(-.1, -.2)
		}, "output_log_probs"},
		{"top-p offsets too short", func(t *Turn) { t.TopPTokenIDs, t.TopPTokenOffsets = ints(918, 909), ints(0, 1) }, "rollout_top_p_token_offsets"},
		{"top-p offsets do not start at 0", func(t *Turn) { t.TopPTokenIDs, t.TopPTokenOffsets = ints(918, 909), ints(1, 1, 2) }, "rollout_top_p_token_offsets"},
		{"top-p offsets do not end at len(ids)", func(t *Turn) { t.TopPTokenIDs, t.TopPTokenOffsets = ints(918, 909), ints(0, 1, 3) }, "rollout_top_p_token_offsets"},
		{"top-p offsets decrease", func(t *Turn) { t.TopPTokenIDs, t.TopPTokenOffsets = ints(918), ints(0, 2, 1) }, "rollout_top_p_token_offsets decrease"},
		{"top-p ids missing", func(t *Turn) { t.TopPTokenOffsets = ints(0, 1, 2) }, "rollout_top_p_token_offsets"},
		{"top-p logprobs misaligned", func(t *Turn) {
			t.TopPTokenIDs, t.TopPTokenOffsets, t.TopPLogProbs = ints(918, 909), ints(0, 1, 2), lps(0)
		}, "rollout_top_p_log_probs"},
		{"top-k wrong shape", func(t *Turn) { t.TopKTokenIDs, t.TopKLogProbs, t.TopK = ints(1, 2, 3), lps(0, 0, 0), 2 }, "top-k"},
		{"top-k without k", func(t *Turn) { t.TopKTokenIDs, t.TopKLogProbs = ints(1, 2), lps(0, 0) }, "top-k"},
		{"top-k logprobs missing", func(t *Turn) { t.TopKTokenIDs, t.TopK = ints(1, 2), 1 }, "top-k"},
		{"routes wrong rows", func(t *Turn) {
			t.RoutedExperts, t.RoutedExpertsShape = make([]int32, 7*2), ints(7, 2, 1)
		}, "rollout_routed_experts"},
		{"routes wrong size", func(t *Turn) {
			t.RoutedExperts, t.RoutedExpertsShape = make([]int32, 5), ints(8, 2, 1)
		}, "rollout_routed_experts"},
		{"routes without shape", func(t *Turn) { t.RoutedExperts = make([]int32, 16) }, "rollout_routed_experts"},
		{"routes ok", func(t *Turn) { t.RoutedExperts, t.RoutedExpertsShape = make([]int32, 16), ints(8, 2, 1) }, ""},
		{"prompt message not JSON", func(t *Turn) { t.PromptMessages = raws(json.RawMessage(`{"role":`)) }, "prompt_messages[0]"},
		{"prompt message not an object", func(t *Turn) { t.PromptMessages = raws(json.RawMessage(`["user"]`)) }, "prompt_messages[0]"},
		{"response message not an object", func(t *Turn) { t.ResponseMessage = json.RawMessage(`"hi"`) }, "response_message"},
		{"response message null", func(t *Turn) { t.ResponseMessage = json.RawMessage(`null`) }, ""},
	}
	for _, c := range cases {
		t.Run(c.name, func(t *testing.T) {
			tr := good()
			c.mutate(&tr)
			s := NewSession(Options{})
			err := s.Record(tr)
			switch {
			case c.wantErr == "" && err != nil:
				t.Fatalf("unexpected error %v", err)
			case c.wantErr != "" && (err == nil || !strings.Contains(err.Error(), c.wantErr)):
				t.Fatalf("err = %v, want one mentioning %q", err, c.wantErr)
			case c.wantErr != "" && s.Turns() != 0:
				t.Fatalf("rejected turn counted")
			}
		})
	}

	t.Run("TV22 empty prompt messages are ignored", func(t *testing.T) {
		s := NewSession(Options{})
		tr := good()
		tr.PromptMessages = nil
		tr.OutputLogProbs = lps(-1) // not even validated
		if err := s.Record(tr); err != nil || s.Turns() != 0 {
			t.Fatalf("err %v turns %d", err, s.Turns())
		}
		if segs, err := s.Segments(Base{}); segs != nil || err != nil {
			t.Fatalf("segments %v, %v", segs, err)
		}
	})
	t.Run("replay columns must agree across turns", func(t *testing.T) {
		s := NewSession(Options{})
		a := good()
		a.TopPTokenIDs, a.TopPTokenOffsets = ints(918, 909), ints(0, 1, 2)
		if err := s.Record(a); err != nil {
			t.Fatal(err)
		}
		b := vt(h+",a:ok,t:t", "done")
		if err := s.Record(b); err == nil || !strings.Contains(err.Error(), "replay columns") {
			t.Fatalf("err = %v", err)
		}
		// An empty output carries no rows and needs no replay data.
		c := vt(h+",a:ok,t:t", "", finish("length"))
		if err := s.Record(c); err != nil {
			t.Fatal(err)
		}
	})
}

// Segment-time sampler contract (docs/assembly.md §2.3 validate_sampler_top_p).
func TestSegmentsTopPContract(t *testing.T) {
	cases := []struct {
		name    string
		ids     []int32
		off     []int32
		lp      []float32
		wantErr string
	}{
		{"ok", ints(918, 5, 909), ints(0, 2, 3), lps(-.1, -3, 0), ""},
		{"duplicate id in a row", ints(918, 918, 909), ints(0, 2, 3), nil, "repeats"},
		{"trained row with empty span", ints(909), ints(0, 0, 1), nil, "trained but its sampler span is empty"},
		{"sampled token missing", ints(5, 909), ints(0, 1, 2), nil, "sampler distribution must include the sampled token"},
		{"positive logprob", ints(918, 909), ints(0, 1, 2), lps(-.1, .5), "not a finite logprob"},
		{"NaN logprob", ints(918, 909), ints(0, 1, 2), lps(-.1, float32NaN()), "not a finite logprob"},
		{"negative id", ints(918, -1, 909), ints(0, 2, 3), nil, "negative"},
		{"logprob mismatch", ints(918, 909), ints(0, 1, 2), lps(-.2, 0), "sampler distribution must include the sampled token"},
	}
	for _, c := range cases {
		t.Run(c.name, func(t *testing.T) {
			tr := vt(h, "ok", withLP(-.1))
			tr.OutputLogProbs[1] = 0
			tr.TopPTokenIDs, tr.TopPTokenOffsets, tr.TopPLogProbs = c.ids, c.off, c.lp
			s := NewSession(Options{})
			if err := s.Record(tr); err != nil {
				t.Fatal(err)
			}
			segs, err := s.Segments(Base{})
			if c.wantErr == "" {
				if err != nil || len(segs) != 1 {
					t.Fatalf("segs %d err %v", len(segs), err)
				}
				return
			}
			if err == nil || !strings.Contains(err.Error(), c.wantErr) {
				t.Fatalf("err = %v, want %q", err, c.wantErr)
			}
			if again, err := s.Segments(Base{}); again != nil || err != nil {
				t.Fatalf("session not drained after an error")
			}
		})
	}
	t.Run("long row duplicate", func(t *testing.T) {
		tr := vt(h, "ok")
		ids := []int32{918}
		for i := int32(0); i < 40; i++ {
			ids = append(ids, 2000+i)
		}
		ids = append(ids, 2005, 909)
		tr.TopPTokenIDs, tr.TopPTokenOffsets = ids, ints(0, int32(len(ids)-1), int32(len(ids)))
		s := NewSession(Options{})
		if err := s.Record(tr); err != nil {
			t.Fatal(err)
		}
		if _, err := s.Segments(Base{}); err == nil || !strings.Contains(err.Error(), "repeats") {
			t.Fatalf("err = %v", err)
		}
	})
}

func TestMetadataAndTruncation(t *testing.T) {
	two := 2.5
	t.Run("flags per leaf", func(t *testing.T) {
		ill := vt(h+",a:call,t:x", "a2")
		ill.IllFormed = true
		got, err := run(t, 0, Base{Reward: &two}, []Turn{
			vt(h, "call"), ill, vt(h+",a:call,t:y", "a3", finish("length")),
			vt("s:SA,u:u", "a"),
		})
		if err != nil {
			t.Fatal(err)
		}
		type flags struct{ tr, tool, ill bool }
		want := []flags{{false, true, true}, {true, true, false}, {false, false, false}}
		if len(got) != len(want) {
			t.Fatalf("%d segments", len(got))
		}
		for i, w := range want {
			g := flags{got[i].Truncated, got[i].UseTool, got[i].IllFormed}
			if g != w {
				t.Errorf("S%d flags %+v, want %+v", i, g, w)
			}
			if got[i].Reward == nil || *got[i].Reward != 2.5 {
				t.Errorf("S%d reward %v", i, got[i].Reward)
			}
		}
		if got[0].Reward == got[1].Reward {
			t.Error("segments share one reward pointer")
		}
	})
	t.Run("null reward", func(t *testing.T) {
		got, err := run(t, 0, Base{}, []Turn{vt(h, "ok")})
		if err != nil || len(got) != 1 || got[0].Reward != nil {
			t.Fatalf("got %v err %v", got, err)
		}
	})
	turns := []Turn{vt(h, "call", withLP(-.5)), vt(h+",a:call,t:t", "done", withLP(-.4))}
	for _, c := range []struct {
		max  int
		want []seg
	}{
		{0, []seg{{P0, ints(911, 909, 300, 311, 309, 900, 912, 909), m(1, 1, 0, 0, 0, 0, 1, 1), lps(-.5, -.5, 0, 0, 0, 0, -.4, -.4)}}},
		{15, []seg{{P0, ints(911, 909, 300, 311, 309, 900, 912, 909), m(1, 1, 0, 0, 0, 0, 1, 1), lps(-.5, -.5, 0, 0, 0, 0, -.4, -.4)}}},
		{14, []seg{{P0, ints(911, 909, 300, 311, 309, 900, 912), m(1, 1, 0, 0, 0, 0, 1), lps(-.5, -.5, 0, 0, 0, 0, -.4)}}},
		{8, []seg{{P0, ints(911), m(1), lps(-.5)}}},
		{7, nil}, // response_length would be 0
		{3, nil}, // max_sample_tokens < leading_prompt_len
	} {
		t.Run("max_sample_tokens="+itoa(c.max), func(t *testing.T) {
			base := Base{MaxSampleTokens: c.max}
			got, err := run(t, 0, base, turns)
			if err != nil {
				t.Fatal(err)
			}
			checkSegs(t, got, c.want, base)
		})
	}
	t.Run("truncation drops a segment left with context only", func(t *testing.T) {
		// S1 trains only its tail (shared prefix); cutting the tail drops it.
		base := Base{MaxSampleTokens: 12}
		got, err := run(t, 0, base, []Turn{vt(h, "call", withLP(-.5)), vt(h+",a:call,t:x", "a2", withLP(-.4)), vt(h+",a:call,t:y", "a3", withLP(-.3))})
		if err != nil {
			t.Fatal(err)
		}
		checkSegs(t, got, []seg{{P0, ints(911, 909, 300, 312, 309), m(1, 1, 0, 0, 0), lps(-.5, -.5, 0, 0, 0)}}, base)
	})
}

func TestMessageEquality(t *testing.T) {
	// Key order and whitespace do not matter; values do.
	a := json.RawMessage(`{"role":"user","content":"hi","meta":{"x":1,"y":[1,2]}}`)
	b := json.RawMessage("{ \"meta\": {\"y\": [1, 2], \"x\": 1.0},\n \"content\": \"hi\", \"role\": \"user\" }")
	c := json.RawMessage(`{"role":"user","content":"hi","meta":{"x":1,"y":[2,1]}}`)
	mk := func(msg json.RawMessage, out int32) Turn {
		return Turn{PromptIDs: ints(1, 2), OutputIDs: ints(out), PromptMessages: raws(msg), ResponseMessage: json.RawMessage(`{"role":"assistant","content":"r"}`)}
	}
	s := NewSession(Options{})
	for i, msg := range []json.RawMessage{a, b, c, b} {
		if err := s.Record(mk(msg, int32(10+i))); err != nil {
			t.Fatal(err)
		}
	}
	if got := len(s.root.children); got != 2 {
		t.Fatalf("root has %d children, want 2 (a == b != c)", got)
	}
	if got := len(s.root.children[0].children); got != 3 {
		t.Fatalf("first user node has %d leaves, want 3", got)
	}
}

func itoa(i int) string {
	b, _ := json.Marshal(i)
	return string(b)
}

func float32NaN() float32 {
	var z float32
	return z / z
}
