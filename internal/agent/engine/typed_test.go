package engine

import (
	"reflect"
	"strings"
	"testing"

	"github.com/stretchr/testify/assert"
)

// typedRequests are the request settings the typed reading depends on.
func typedRequests() []GenerateRequest {
	return []GenerateRequest{
		{PromptIDs: []int32{1, 2, 3}},
		{PromptIDs: []int32{1, 2, 3}, Sampling: SamplingParams{Logprobs: 1}},
		{PromptIDs: []int32{1, 2, 3}, Sampling: SamplingParams{Logprobs: 2}, ReturnSamplingMask: true},
		{PromptIDs: []int32{1, 2, 3}, ReturnSamplingMask: true, ReturnRoutedExperts: true},
	}
}

// checkTyped: wherever readGenerate takes a body, parseGenerateSteps reads
// it too, to the same Generation.
func checkTyped(t *testing.T, body []byte) (took int) {
	t.Helper()
	reqs := typedRequests()
	for i := range reqs {
		req := &reqs[i]
		g, ok := readGenerate(body, req)
		if !ok {
			continue
		}
		took++
		want, err := parseGenerateSteps(body, req)
		if err != nil {
			t.Fatalf("request %d: readGenerate took a reply parseGenerateSteps refuses (%v): %s", i, err, body)
		}
		if !reflect.DeepEqual(g, want) {
			t.Fatalf("request %d: readGenerate read\n%+v\nparseGenerateSteps\n%+v\nfrom %s", i, g, want, body)
		}
	}
	return took
}

// The typed reading takes the replies engines write, and never reads a
// reply otherwise than the step-by-step reading: edge cases of every field
// it decodes, repeated and case-folded keys (which encoding/json would
// merge), nulls where numbers go, non-finite values.
func TestTypedGenerate(t *testing.T) {
	a := string(golden(t, "generate_a.json"))
	b := string(golden(t, "generate_b.json"))
	c := string(golden(t, "generate_c.json"))
	for _, body := range []string{a, b, c, string(benchGenerateReply(148))} {
		assert.Equal(t, 1, min(checkTyped(t, []byte(body)), 1), "the typed reading takes %.80s", body)
	}
	assert.Equal(t, len(typedRequests())-1, checkTyped(t, golden(t, "generate_c.json")), "all but routed experts (absent)")

	e := func(body string) string {
		return `{"choices":[{"token_ids":[5],"logprobs":{"content":[` + body + `]},"sampling_mask":[[5]]}],"output_mode":"tokens"}`
	}
	cases := []string{
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
	took := 0
	for _, body := range cases {
		if checkTyped(t, []byte(body)) > 0 {
			took++
		}
	}
	t.Logf("the typed reading took %d of %d cases", took, len(cases))
}

// readTokenizeTyped takes what readTokenizeSteps reads without a memo, to
// the same ids, and declines the rest.
func TestTypedTokenize(t *testing.T) {
	took := 0
	for _, body := range []string{
		`{"count":3,"max_model_len":4096,"tokens":[1,22,333],"token_strs":null}`,
		` { "tokens" : [ ] , "count" : 0 } `,
		`{"tokens":[1,2],"tokens":[3]}`,
		`{"tokens":"x","tokens":[3]}`,
		`{"tokens":[1,2],"tokens":[null,5]}`,
		`{"tokens":[null,5]}`,
		`{"tokens":[1,2],"tokens":null}`,
		`{"TOKENS":[1,2],"Count":2}`,
		`{"tokens":[1],"count":1,"count":null}`,
		`{"tokens":[1],"count":2,"count":1}`,
		`{"tokens":[1],"max_model_len":5,"max_model_len":null}`,
		`{"tokens":[1],"max_model_len":"5"}`,
		`{"tokens":[1],"count":"1"}`,
		`{"tokens":[-1]}`,
		`{"tokens":[2147483648]}`,
		`{"tokens":[1.0]}`,
		`{"tokens":[1]} x`,
		`{"tokens":[1]}{}`,
		`[1]`,
		`{"tokens":[1],}`,
	} {
		ids, maxLen, ok := readTokenizeTyped([]byte(body))
		if !ok {
			continue
		}
		took++
		want, wantLen, err := readTokenizeSteps([]byte(body), nil)
		if assert.NoError(t, err, body) {
			assert.Equal(t, want, ids, body)
			assert.Equal(t, wantLen, maxLen, body)
		}
	}
	assert.GreaterOrEqual(t, took, 5)
}

// FuzzTypedTokenize: wherever readTokenizeTyped takes a reply,
// readTokenizeSteps reads the same ids and max_model_len.
func FuzzTypedTokenize(f *testing.F) {
	f.Add([]byte(`{"count":3,"max_model_len":4096,"tokens":[1,22,333],"token_strs":null}`))
	f.Add([]byte(`{"tokens":[1,2],"tokens":[null,5],"count":2}`))
	f.Fuzz(func(t *testing.T, body []byte) {
		ids, maxLen, ok := readTokenizeTyped(body)
		if !ok {
			return
		}
		want, wantLen, err := readTokenizeSteps(body, nil)
		if err != nil || !reflect.DeepEqual(ids, want) || maxLen != wantLen {
			t.Fatalf("typed %v %d, steps %v %d %v: %s", ids, maxLen, want, wantLen, err, body)
		}
	})
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
