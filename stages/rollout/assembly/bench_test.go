package assembly

import (
	"encoding/json"
	"fmt"
	"math/rand"
	"strings"
	"testing"
)

// benchSession is a 40-turn session whose prompts grow to about 8k tokens,
// with a token drift in 5% of the turns. Messages carry about 4 bytes of
// text per token. With reordered, the client echoes each assistant message
// with other key order than the adapter's response message (routing then
// decodes both); otherwise the echo is byte-identical.
func benchSession(reordered bool) []Turn {
	rng := rand.New(rand.NewSource(1))
	toks := func(n int) []int32 {
		out := make([]int32, n)
		for i := range out {
			out[i] = rng.Int31n(150000)
		}
		return out
	}
	text := strings.Repeat("lorem ipsum dolor sit amet ", 15)
	msgs := []json.RawMessage{rawMsg("system", "sys "+text, false), rawMsg("user", "task "+text, false)}
	prompt := toks(200)
	var turns []Turn
	for i := 0; i < 40; i++ {
		if i > 0 && rng.Intn(20) == 0 {
			p := append([]int32{}, prompt...)
			p[rng.Intn(len(p))] = 7
			prompt = p
		}
		out := toks(80)
		lp := make([]float32, len(out))
		for j := range lp {
			lp[j] = -rng.Float32()
		}
		resp := fmt.Sprintf("resp %d %s", i, text)
		turns = append(turns, Turn{PromptIDs: prompt, OutputIDs: out, OutputLogProbs: lp, FinishReason: "tool_calls",
			PromptMessages: msgs, ResponseMessage: rawMsg("assistant", resp, true)})
		echo := rawMsg("assistant", resp, true)
		if reordered {
			echo = json.RawMessage(fmt.Sprintf(`{"content":%q,"role":"assistant","tool_calls":[{"id":"x","type":"function","function":{"name":"f","arguments":"{}"}}]}`, resp))
		}
		msgs = append(append([]json.RawMessage{}, msgs...), echo,
			rawMsg("tool", fmt.Sprintf("result %d %s %s", i, text, text), false))
		prompt = append(append(append([]int32{}, prompt...), out...), toks(120)...)
	}
	return turns
}

func BenchmarkAssemble40Turns(b *testing.B) {
	for _, c := range []struct {
		T         int
		reordered bool
	}{{0, false}, {1024, false}, {0, true}} {
		turns := benchSession(c.reordered)
		T := c.T
		b.Run(fmt.Sprintf("T=%d/reordered=%t", T, c.reordered), func(b *testing.B) {
			var segs int
			for b.Loop() {
				s := NewSession(Options{ForkMergeMaxResponseTokens: T})
				for _, t := range turns {
					if err := s.Record(t); err != nil {
						b.Fatal(err)
					}
				}
				out, err := s.Segments(Base{})
				if err != nil {
					b.Fatal(err)
				}
				segs = len(out)
			}
			b.ReportMetric(float64(segs), "segments")
		})
	}
}

// BenchmarkCopyTokens is the baseline: copying every turn's token arrays.
func BenchmarkCopyTokens(b *testing.B) {
	turns := benchSession(false)
	var sink int
	for b.Loop() {
		for _, t := range turns {
			p := append([]int32(nil), t.PromptIDs...)
			o := append([]int32(nil), t.OutputIDs...)
			l := append([]float32(nil), t.OutputLogProbs...)
			sink += len(p) + len(o) + len(l)
		}
	}
	_ = sink
}
