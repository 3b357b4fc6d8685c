package engine

import (
	"encoding/json"
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"testing"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
)

// readTokenize reads what encoding/json reads as a list of non-negative
// int32 ids, with or without a memo that remembers a similar list, and
// refuses the rest.
func TestReadTokenize(t *testing.T) {
	cases := []string{
		`{"count":3,"max_model_len":4096,"tokens":[1,22,333],"token_strs":null}`,
		` { "tokens" : [ ] , "count" : 0 } `,
		`{"tokens":[5],"extra":{"a":["]",{"b":"}"}]},"max_model_len":null}`,
		`{"tokens":[2147483647]}`,
		`{"tokens":[2147483648]}`,
		`{"tokens":[-1]}`,
		`{"tokens":[1.0]}`,
		`{"tokens":[01]}`,
		`{"tokens":[1,]}`,
		`{"tokens":[1]`,
		`{"count":2}`,
		`{"tokens":null}`,
		`{"tokens":[1]} x`,
		`[1,2]`,
		`{"tokens":[0,9,10,99999999]}`,
		"{\"tokens\":[ 1 ,\n2\t, 3 ]}",
		`{"tokens":[1e3]}`,
		`{"tokens":[1,,2]}`,
		`{"tokens":[,1]}`,
		`{"tokens":[1 2]}`,
		`{"tokens":[1,"2"]}`,
		`{"TOKENS":[1,2]}`,
		`{"count":3,"tokens":[1,2]}`,
		// Against the memo's [1,22,333]: extensions, edits and breakage
		// after the shared bytes.
		`{"tokens":[1,22,333,4]}`,
		`{"tokens":[1,22,3334]}`,
		`{"tokens":[1,22,]}`,
		`{"tokens":[1,22,333,]}`,
		`{"tokens":[1,22,-333]}`,
		`{"tokens":[1,22,333,4x]}`,
		`{"tokens":[1,22]}`,
		`{"tokens":[1,22,333],"tokens":null}`,
		`{"tok\u0065ns":[1,2]}`,
		"{\"tokens\":[1],\"a\tb\":1}",
		`{"tokens":[1],"count":1,"count":null}`,
		`{"tokens":[1],"max_model_len":"5"}`,
		`{"tokens":[1],"max_model_len":5.5}`,
		`{"tokens":[1],"token_strs":[tru]}`,
		`{"tokens":[1],"token_strs":["\x"]}`,
		`{"tokens":[1],"x":01}`,
		`{"tokens":[1]}{}`,
		`{"tokens":[1],}`,
		`{"tokens":[null,5]}`,
	}
	for _, body := range cases {
		var want struct {
			Count       *int    `json:"count"`
			MaxModelLen int     `json:"max_model_len"`
			Tokens      []int32 `json:"tokens"`
		}
		ok := json.Unmarshal([]byte(body), &want) == nil && want.Tokens != nil &&
			!slices.ContainsFunc(want.Tokens, func(id int32) bool { return id < 0 }) &&
			(want.Count == nil || *want.Count == len(want.Tokens))
		var memo Memo
		_, _, err := readTokenize([]byte(`{"tokens":[1,22,333]}`), &memo)
		require.NoError(t, err)
		for _, m := range []*Memo{nil, &memo} {
			ids, maxLen, err := readTokenize([]byte(body), m)
			if !ok {
				var re *ReplyError
				assert.ErrorAs(t, err, &re, "%s (memo %v)", body, m != nil)
				continue
			}
			if assert.NoError(t, err, "%s (memo %v)", body, m != nil) {
				assert.Equal(t, want.Tokens, ids, body)
				assert.Equal(t, want.MaxModelLen, maxLen, body)
			}
		}
	}
}

// readDetokenize reads the prompt as encoding/json does.
func TestReadDetokenize(t *testing.T) {
	for _, body := range []string{
		`{"prompt":"hello <|im_end|>"}`,
		` {"prompt" : "a b" , "other": [1,{"x":"y"}]} `,
		`{"prompt":"caf\u00e9 \n"}`,
		"{\"prompt\":\"bad \xff utf8\"}",
		`{"prompt":"\u003cb\u003e caf\u00e9 \ud83d\ude00"}`,
		`{"prompt":"<think>\nx\n</think>\n\n<tool_call>\n{\"name\": \"f\"}\n</tool_call><|im_end|>"}`,
		`{"prompt":null}`,
		`{"prompt":1}`,
		`{"Prompt":"folded"}`,
		`{"prompt":"one","prompt":"two"}`,
		`{"prompt":"x"} trailing`,
		`{"prompt":"unterminated}`,
		`{}`,
		`[]`,
	} {
		var want struct {
			Prompt *string `json:"prompt"`
		}
		werr := json.Unmarshal([]byte(body), &want)
		got, err := readDetokenize([]byte(body))
		if werr != nil || want.Prompt == nil {
			assert.Error(t, err, body)
			continue
		}
		if assert.NoError(t, err, body) {
			assert.Equal(t, *want.Prompt, got, body)
		}
	}
}

// FuzzParseGenerate: wherever parseGenerate reads a valid JSON reply, its
// ids, logprobs and finish reason are what a plain encoding/json decode of
// the reply says.
func FuzzParseGenerate(f *testing.F) {
	for _, name := range []string{"generate_a.json", "generate_b.json", "generate_c.json"} {
		b, err := os.ReadFile(filepath.Join("testdata", name))
		if err != nil {
			f.Fatal(err)
		}
		f.Add(b)
	}
	f.Add([]byte(`{"choices":[{"token_ids":[],"logprobs":{"content":[]}}]}`))
	f.Add([]byte(`{"choices":[{"index":0,"finish_reason":"stop","token_ids":[5,6,7],"logprobs":{"content":[` +
		`{"token_id":5,"logprob":-0.10000000149011612,"rank":1,"top_logprobs":[{"token_id":5,"logprob":-0.10000000149011612,"rank":1}]},` +
		`{"token_id":6,"logprob":-2.5e-05,"rank":null,"top_logprobs":[]},` +
		`{"token_id":7,"logprob":-0.0,"rank":2,"top_logprobs":[{"token_id":9,"logprob":-1,"rank":1},{"token_id":7,"logprob":-0.0,"rank":2}]}]}}]}`))
	f.Add([]byte(`{"choices":[{"token_ids":[5],"logprobs":{"content":[{"token":"token_id:5","logprob":-1}]},"finish_reason":"length","stop_reason":7}],"usage":{"prompt_tokens":2,"completion_tokens":1,"total_tokens":3}}`))
	f.Add(benchGenerateReply(3))
	// Repeated and case-folded keys, which the typed reading must not
	// merge (TestTypedGenerate).
	f.Add([]byte(`{"choices":[{"token_ids":[5],"logprobs":{"content":[{"token_id":5,"logprob":-1,"top_logprobs":[{"token_id":5,"logprob":-1}]}]},"sampling_mask":[[5]]}],"Choices":[{"token_ids":[5],"logprobs":{"content":[{"token":"token_id:5","logprob":-1}]}}],"usage":{"completion_tokens":1}}`))
	f.Add([]byte(`{"choices":[{"token_ids":[5],"logprobs":{"content":[{"token_id":5,"logprob":-1,"top_logprobs":[{"token_id":5,"logprob":-1}]}],"content":[{"logprob":-1}]},"logprobs":{"content":[{"logprob":-2}]}}]}`))
	// Per-token weight versions (TestWeightVersions): read, or ignored.
	f.Add([]byte(weightsReply(`,"weight_versions":[7,"8"]`)))
	f.Add([]byte(weightsReply(`,"weight_versions":[7,7.5],"Weight_Versions":[1,1]`)))
	for _, body := range generateEdgeCases(f) {
		f.Add([]byte(body))
	}
	f.Fuzz(func(t *testing.T, body []byte) {
		g, err := parseGenerate(body, &GenerateRequest{PromptIDs: []int32{1, 2}})
		if err != nil || !json.Valid(body) {
			return
		}
		var ref struct {
			Choices []struct {
				TokenIDs []int64 `json:"token_ids"`
				Logprobs struct {
					Content []struct {
						Logprob float64 `json:"logprob"`
					} `json:"content"`
				} `json:"logprobs"`
				FinishReason *string `json:"finish_reason"`
			} `json:"choices"`
		}
		if err := json.Unmarshal(body, &ref); err != nil {
			// On valid JSON only a type error is possible: a field met
			// twice, the earlier of a type ref cannot take, where the
			// reading of a reply keeps the last (as json.RawMessage
			// fields do).
			var te *json.UnmarshalTypeError
			if errors.As(err, &te) {
				return
			}
			t.Fatalf("parseGenerate read a reply encoding/json refuses: %v", err)
		}
		if len(ref.Choices) != 1 {
			t.Fatalf("parseGenerate read %d choices", len(ref.Choices))
		}
		ch := ref.Choices[0]
		if len(ch.TokenIDs) != len(g.OutputIDs) || len(ch.Logprobs.Content) != len(g.LogProbs) {
			t.Fatalf("%d ids and %d logprobs, encoding/json %d and %d", len(g.OutputIDs), len(g.LogProbs), len(ch.TokenIDs), len(ch.Logprobs.Content))
		}
		for i, id := range ch.TokenIDs {
			if int64(g.OutputIDs[i]) != id || g.LogProbs[i] != float32(ch.Logprobs.Content[i].Logprob) {
				t.Fatalf("position %d: %d %v, encoding/json %d %v", i, g.OutputIDs[i], g.LogProbs[i], id, ch.Logprobs.Content[i].Logprob)
			}
		}
		want := "stop"
		if ch.FinishReason != nil && *ch.FinishReason != "" {
			want = *ch.FinishReason
		}
		if g.FinishReason != want {
			t.Fatalf("finish reason %q, encoding/json %q", g.FinishReason, want)
		}
	})
}

// generateEdgeCases are replies at the edges of every field parseGenerate
// reads: repeated and case-folded keys, nulls where numbers go, non-finite
// values, trailing bytes (FuzzParseGenerate's seeds).
func generateEdgeCases(f *testing.F) []string {
	read := func(name string) string {
		b, err := os.ReadFile(filepath.Join("testdata", name))
		if err != nil {
			f.Fatal(err)
		}
		return string(b)
	}
	a, b, c := read("generate_a.json"), read("generate_b.json"), read("generate_c.json")
	e := func(body string) string {
		return `{"choices":[{"token_ids":[5],"logprobs":{"content":[` + body + `]},"sampling_mask":[[5]]}],"output_mode":"tokens"}`
	}
	return []string{
		e(`{"token_id":5,"logprob":-1}`),
		e(`{"token_id":5,"logprob":-1,"top_logprobs":[{"token_id":5,"logprob":-1}]}`),
		e(`{"token_id":5,"token_id":null,"logprob":-1}`),
		e(`{"token_id":null,"token_id":5,"logprob":-1}`),
		e(`{"token_id":6,"token_id":5,"logprob":-1}`),
		e(`{"TOKEN_ID":5,"logprob":-1}`),
		e(`{"token_id":5,"logprob":-1,"logprob":null}`),
		e(`{"token_id":5,"logprob":null,"logprob":-2}`),
		e(`{"token_id":5,"logprob":"-1"}`),
		e(`{"token_id":5,"logprob":-1e300}`),
		e(`{"token_id":5,"logprob":-1e400}`),
		e(`{"token_id":5,"logprob":-0}`),
		e(`{"token_id":5,"logprob":NaN}`),
		e(`{"token_id":5,"logprob":-Infinity}`),
		e(`{"token_id":5.0,"logprob":-1}`),
		e(`{"token_id":-0,"logprob":-1}`),
		e(`{"token_id":"5","logprob":-1}`),
		e(`{"token":"token_id:5","logprob":-1}`),
		e(`{"token":"token_id:6","logprob":-1}`),
		e(`{"token":"token_id:x","logprob":-1}`),
		e(`{"token":"token\u005fid:6","logprob":-1}`),
		e(`{"token":"hello","logprob":-1}`),
		e(`{"token":7,"logprob":-1}`),
		e(`{"token":null,"token_id":5,"logprob":-1}`),
		e(`{"token":"token_id:5","token_id":6,"logprob":-1}`),
		e(`{"logprob":-1}`),
		e(`null`),
		e(`5`),
		e(`{"token_id":5,"logprob":-1,"top_logprobs":[{"token_id":5,"logprob":-1}],"top_logprobs":[{"token":"x","logprob":-1}]}`),
		e(`{"token_id":5,"logprob":-1,"top_logprobs":[{"token_id":6,"logprob":-1}],"top_logprobs":[{"token_id":5,"logprob":-1}]}`),
		e(`{"token_id":5,"logprob":-1,"top_logprobs":[{"token_id":5,"logprob":-1},{"token_id":5,"logprob":-2}]}`),
		e(`{"token_id":5,"logprob":-1,"top_logprobs":[{"token_id":5,"logprob":-1},{"token_id":7,"logprob":-2},{"token_id":8,"logprob":-2}]}`),
		e(`{"token_id":5,"logprob":-1,"top_logprobs":null}`),
		e(`{"token_id":5,"logprob":-1,"top_logprobs":[null]}`),
		`{"choices":[{"token_ids":[5],"logprobs":{"content":[{"token_id":5,"logprob":-1}]}}],"choices":[{"token_ids":[5],"logprobs":{"content":[{"logprob":-1}]}}]}`,
		`{"choices":[{"token_ids":[5],"logprobs":{"content":[{"token_id":5,"logprob":-1}]}}],"Choices":[{"token_ids":[5],"logprobs":{"content":[{"token":"a","logprob":-1}]}}]}`,
		`{"choices":[{"token_ids":[5],"logprobs":{"content":[{"token_id":5,"logprob":-1}]},"logprobs":{"content":[{"logprob":-1}]}}]}`,
		`{"choices":[{"token_ids":[5],"logprobs":{"content":[{"token_id":5,"logprob":-1}],"content":[{"logprob":-1}]}}]}`,
		`{"choices":[{"token_ids":[5],"logprobs":{"content":[{"token_id":5,"logprob":-1}]},"logprobs":null}]}`,
		`{"choices":[{"token_ids":[6],"token_ids":[5],"logprobs":{"content":[{"token_id":5,"logprob":-1}]}}]}`,
		`{"choices":[{"token_ids":[5],"token_ids":null,"logprobs":{"content":[{"token_id":5,"logprob":-1}]}}]}`,
		`{"choices":[{"TOKEN_IDS":[5],"Logprobs":{"CONTENT":[{"token_id":5,"logprob":-1}]}}],"USAGE":{"completion_tokens":1}}`,
		`{"choices":[{"token_ids":[null],"logprobs":{"content":[{"logprob":-1}]}}]}`,
		`{"choices":[{"token_ids":[2147483648],"logprobs":{"content":[{"logprob":-1}]}}]}`,
		`{"choices":[{"token_ids":[1e0],"logprobs":{"content":[{"logprob":-1}]}}]}`,
		`{"choices":[{"token_ids":[],"logprobs":{"content":[]}}]}`,
		`{"choices":[{"token_ids":[],"logprobs":{}}]}`,
		`{"choices":[{"token_ids":[],"logprobs":{"content":null}}]}`,
		`{"choices":[{"token_ids":[],"logprobs":{"content":[]},"sampling_mask":[]}]}`,
		`{"choices":[{"token_ids":[5],"logprobs":{"content":[{"logprob":-1}]},"sampling_mask":[[5,null]]}]}`,
		`{"choices":[{"token_ids":[5],"logprobs":{"content":[{"logprob":-1}]},"sampling_mask":[null]}]}`,
		`{"choices":[{"token_ids":[5],"logprobs":{"content":[{"logprob":-1}]},"sampling_mask":[[6]],"sampling_mask":[[5]]}]}`,
		`{"choices":[{"token_ids":[5],"logprobs":{"content":[{"logprob":-1}]},"sampling_mask":"x"}]}`,
		`{"choices":[{"token_ids":[5],"logprobs":{"content":[{"logprob":-1}]}}],"usage":{"completion_tokens":1},"usage":{}}`,
		`{"choices":[{"token_ids":[5],"logprobs":{"content":[{"logprob":-1}]}}],"usage":{"x":1}}`,
		`{"choices":[{"token_ids":[5],"logprobs":{"content":[{"logprob":-1}]}}],"usage":{"completion_tokens":1,"prompt_tokens":"7"}}`,
		`{"choices":[{"token_ids":[5],"logprobs":{"content":[{"logprob":-1}]},"finish_reason":"length","finish_reason":null,"stop_reason":"x"}],"model":null,"created":1}`,
		`{"choices":[{"token_ids":[5],"logprobs":{"content":[{"logprob":-1}]}}],"created":NaN}`,
		`{"choices":[{"token_ids":[5],"logprobs":{"content":[{"logprob":-1}]}}]} `,
		`{"choices":[{"token_ids":[5],"logprobs":{"content":[{"logprob":-1}]}}]} x`,
		`{"choices":[{"token_ids":[5],"logprobs":{"content":[{"logprob":-1}]}}]}{}`,
		`{"choices":[{"token_ids":[5],"logprobs":{"content":[{"logprob":-1}]},}]}`,
		`{"choices":[{"token_ids":[5],"logprobs":{"content":[{"logprob":-1}]}},]}`,
		`{"choices":[null]}`,
		`{"choices":[{"token_ids":[5],"logprobs":{"content":[{"logprob":-1}]}},{}]}`,
		"\u00a0" + `{"choices":[{"token_ids":[5],"logprobs":{"content":[{"logprob":-1}]}}]}`,
		` ` + a + "\n",
		strings.Replace(b, `"completion_tokens":2`, `"completion_tokens":3`, 1),
		strings.Replace(c, `"sampling_mask":[[9707,13,11],[151658]]`, `"sampling_mask":[[9707,13,11],[151658]],"sampling_mask":null`, 1),
	}
}

// benchGenerateReply is a newest-shape generate reply of n sampled tokens,
// each with its sampled-token top entry (logprobs: 0): the reply the
// adapter reads every turn.
func benchGenerateReply(n int) []byte {
	var sb strings.Builder
	sb.WriteString(`{"request_id":"generate-tokens-r1","output_mode":"tokens","model":"m","created":1700000000,"choices":[{"index":0,"finish_reason":"stop","stop_reason":null,"token_ids":[`)
	ids := make([]int32, n)
	for i := range ids {
		ids[i] = int32((i * 7919) % 151643)
		if i > 0 {
			sb.WriteByte(',')
		}
		fmt.Fprint(&sb, ids[i])
	}
	sb.WriteString(`],"logprobs":{"content":[`)
	for i, id := range ids {
		if i > 0 {
			sb.WriteByte(',')
		}
		lp := -float64(i%17)*0.0731234567891 - 0.000012338161468505859
		fmt.Fprintf(&sb, `{"token_id":%d,"logprob":%v,"rank":1,"top_logprobs":[{"token_id":%d,"logprob":%v,"rank":1}]}`, id, lp, id, lp)
	}
	fmt.Fprintf(&sb, `]},"routed_experts":null,"sampling_mask":null,"weight_versions":null}],"usage":{"prompt_tokens":4000,"total_tokens":%d,"completion_tokens":%d,"prompt_tokens_details":null},"prompt_token_ids":null,"mm_placeholders":null,"metrics":null,"prompt_logprobs":null,"prompt_token_id_logprobs":null,"kv_transfer_params":null,"ec_transfer_params":null}`, 4000+n, n)
	return []byte(sb.String())
}

// BenchmarkParseGenerate reads a 148-token reply (benchGenerateReply).
func BenchmarkParseGenerate(b *testing.B) {
	body := benchGenerateReply(148)
	req := &GenerateRequest{PromptIDs: make([]int32, 4000)}
	b.SetBytes(int64(len(body)))
	for b.Loop() {
		if g, err := parseGenerate(body, req); err != nil || len(g.OutputIDs) != 148 {
			b.Fatal(err)
		}
	}
}

// BenchmarkReadTokenize reads a /tokenize reply of 5,000 ids without a
// memo.
func BenchmarkReadTokenize(b *testing.B) {
	ids := make([]int32, 5000)
	for i := range ids {
		ids[i] = int32((i * 7919) % 151643)
	}
	body := append(append([]byte(`{"count":5000,"max_model_len":32768,"tokens":`), appendIDs(nil, ids)...), `,"token_strs":null}`...)
	b.SetBytes(int64(len(body)))
	for b.Loop() {
		if got, _, err := readTokenize(body, nil); err != nil || len(got) != len(ids) {
			b.Fatal(err)
		}
	}
}

// completionsBody writes what encoding/json writes of the whole body, with
// and without a model, request id and memo.
func TestCompletionsBodyIsMarshal(t *testing.T) {
	var memo Memo
	prompt, _, err := readTokenize([]byte(`{"tokens":[151644,872,198,0,7]}`), &memo)
	if err != nil {
		t.Fatal(err)
	}
	for _, model := range []string{"", "qwen3<&>"} {
		for _, req := range []GenerateRequest{
			{PromptIDs: []int32{1, 22, 333}, Sampling: SamplingParams{MaxTokens: 5, Stop: []string{"</x>"}, Logprobs: 2}},
			{PromptIDs: prompt, Memo: &memo, RequestID: "r1", CacheSalt: "s", Sampling: SamplingParams{MaxTokens: 1, TopK: ptr(-1)}},
		} {
			c := &Client{opts: Options{Model: model}}
			got, err := c.completionsBody(&req, 3)
			if err != nil {
				t.Fatal(err)
			}
			p := req.Sampling
			one, zero, zeroF := 1.0, 0, 0.0
			p.Temperature, p.TopP, p.MinP, p.RepetitionPenalty = &one, &one, &zeroF, &one
			if p.TopK == nil {
				p.TopK = &zero
			}
			want, err := marshal(struct {
				Model  string  `json:"model,omitempty"`
				Prompt []int32 `json:"prompt"`
				wireSampling
				ReturnTokensAsTokenIDs bool   `json:"return_tokens_as_token_ids"`
				ReturnTokenIDs         bool   `json:"return_token_ids"`
				RequestID              string `json:"request_id,omitempty"`
				CacheSalt              string `json:"cache_salt,omitempty"`
			}{model, req.PromptIDs, wireSamplingOf(&p, 3), true, true, req.RequestID, req.CacheSalt})
			if err != nil {
				t.Fatal(err)
			}
			assert.Equal(t, string(want), string(got))
		}
	}
}
