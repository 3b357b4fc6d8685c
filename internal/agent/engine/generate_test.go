package engine

import (
	"bytes"
	"context"
	"encoding/base64"
	"encoding/binary"
	"errors"
	"fmt"
	"io"
	"net/http"
	"net/http/httptest"
	"slices"
	"strings"
	"testing"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
)

func TestNewRejectsBadOptions(t *testing.T) {
	for _, tc := range []struct {
		name string
		o    Options
		want string
	}{
		{"empty url", Options{}, "Options.BaseURL is empty"},
		{"scheme", Options{BaseURL: "ftp://x"}, "scheme must be http or https"},
		{"no host", Options{BaseURL: "http://"}, "has no host"},
		{"query", Options{BaseURL: "http://h:1/?a=b"}, "query or fragment"},
		{"mode", Options{BaseURL: "http://h:1", Mode: Mode(7)}, "Options.Mode 7"},
		{"context", Options{BaseURL: "http://h:1", ContextLength: -1}, "Options.ContextLength -1"},
		{"timeout", Options{BaseURL: "http://h:1", RequestTimeout: -time.Second}, "Options.RequestTimeout"},
		{"api key", Options{BaseURL: "http://h:1", APIKey: "a\nb"}, "Options.APIKey"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			_, err := New(tc.o)
			require.Error(t, err)
			assert.Contains(t, err.Error(), tc.want)
		})
	}
	c, err := New(Options{BaseURL: "http://h:1/"})
	require.NoError(t, err)
	assert.Equal(t, "http://h:1", c.base)
	m, err := ParseMode("Completions")
	require.NoError(t, err)
	assert.Equal(t, ModeCompletions, m)
	_, err = ParseMode("chat")
	assert.ErrorContains(t, err, "unknown mode")
}

func TestGenerateRequestBody(t *testing.T) {
	for _, tc := range []struct {
		name    string
		opts    Options
		req     GenerateRequest
		want    string
		session string // expected x-session-id ("" = absent)
	}{
		{
			name: "minimal: max_tokens and logprobs always sent",
			opts: Options{Mode: ModeGenerate, ContextLength: 100},
			req:  GenerateRequest{PromptIDs: []int32{1, 2, 3}, Sampling: SamplingParams{MaxTokens: 8}, SessionID: "default"},
			want: `{"token_ids":[1,2,3],"sampling_params":{"max_tokens":8,"logprobs":1,"skip_special_tokens":false,"spaces_between_special_tokens":false,"detokenize":false}}`,
		},
		{
			name: "full sampling, stop strings unescaped, clamp to context",
			opts: Options{Mode: ModeGenerate, ContextLength: 10, Model: "qwen3"},
			req: GenerateRequest{
				PromptIDs: []int32{151644, 872, 198},
				Sampling: SamplingParams{MaxTokens: 100, Temperature: ptr(0.7), TopP: ptr(0.9), TopK: ptr(-1), MinP: ptr(0.0),
					Seed: ptr(int64(7)), Stop: []string{"</tool_call>", "a&b"}, IncludeStopStrInOutput: true, StopTokenIDs: []int32{151645, 151643},
					IgnoreEOS: true, MinTokens: 2, Logprobs: 3, PresencePenalty: ptr(0.5), FrequencyPenalty: ptr(-0.5), RepetitionPenalty: ptr(1.2),
					LogitBias: map[int32]float64{5: -100, 2: 1.5}},
				SessionID: "cagent-7-0-1", RequestID: "r-1", CacheSalt: "salt",
				ReturnSamplingMask: true, ReturnRoutedExperts: true,
			},
			want: `{"token_ids":[151644,872,198],"sampling_params":{"max_tokens":7,"temperature":0.7,"top_p":0.9,"top_k":-1,"min_p":0,"seed":7,` +
				`"stop":["</tool_call>","a&b"],"include_stop_str_in_output":true,"stop_token_ids":[151645,151643],"ignore_eos":true,"min_tokens":2,"logprobs":3,` +
				`"presence_penalty":0.5,"frequency_penalty":-0.5,"repetition_penalty":1.2,"logit_bias":{"2":1.5,"5":-100},"skip_special_tokens":false,` +
				`"spaces_between_special_tokens":false,"detokenize":true,"return_sampling_mask":true,"routed_experts_prompt_start":0},` +
				`"model":"qwen3","request_id":"r-1","cache_salt":"salt"}`,
			session: "cagent-7-0-1",
		},
	} {
		t.Run(tc.name, func(t *testing.T) {
			f := newFake(t, map[string]reply{"POST /inference/v1/generate": {body: golden(t, "generate_a.json")}})
			c := newClient(t, f.URL, tc.opts)
			_, _ = c.Generate(bg, tc.req) // reply validity is not the point here
			got := f.last(t, "/inference/v1/generate")
			assert.Equal(t, tc.want, string(got.Body))
			assert.Equal(t, tc.session, got.Header.Get("x-session-id"))
			assert.Equal(t, "application/json", got.Header.Get("Content-Type"))
			assert.Equal(t, 0, f.count("/v1/models"), "no probe when Mode and ContextLength are given")
		})
	}
}

func TestCompletionsRequestBody(t *testing.T) {
	f := newFake(t, map[string]reply{"POST /v1/completions": {body: golden(t, "completions.json")}})
	c := newClient(t, f.URL, Options{Mode: ModeCompletions, ContextLength: 1000, Model: "qwen3", APIKey: "k"})
	g, err := c.Generate(bg, GenerateRequest{PromptIDs: []int32{151644, 872, 198}, Sampling: SamplingParams{MaxTokens: 16, TopP: ptr(0.95)}, SessionID: "s1"})
	require.NoError(t, err)
	got := f.last(t, "/v1/completions")
	assert.Equal(t, `{"model":"qwen3","prompt":[151644,872,198],"max_tokens":16,"temperature":1,"top_p":0.95,"top_k":0,"min_p":0,"logprobs":1,`+
		`"repetition_penalty":1,"skip_special_tokens":false,"spaces_between_special_tokens":false,"return_tokens_as_token_ids":true,"return_token_ids":true}`, string(got.Body))
	assert.Equal(t, "s1", got.Header.Get("x-session-id"))
	assert.Equal(t, "Bearer k", got.Header.Get("Authorization"))
	assert.Equal(t, []int32{9707, 11, 151645}, g.OutputIDs)

	_, err = c.Generate(bg, GenerateRequest{PromptIDs: []int32{1}, Sampling: SamplingParams{MaxTokens: 1}, ReturnSamplingMask: true})
	assert.ErrorContains(t, err, "cannot return a sampling mask")
}

func TestParseShapes(t *testing.T) {
	for _, tc := range []struct {
		file      string
		route     Route
		k         int
		mask      bool
		wantShape Shape
		ids       []int32
		lps       []float32
		finish    string
		stop      StopReason
		prompt    int
		cached    int
		top       [][]TopLogProb
		maskIDs   []int32
		maskOffs  []int32
	}{
		{file: "generate_a.json", route: RouteGenerate, wantShape: ShapeDisagg, ids: []int32{9707, 11, 151645},
			lps: []float32{-0.3125, -1.5, -0.0001}, finish: "stop", prompt: -1, cached: -1},
		{file: "generate_b.json", route: RouteGenerate, k: 1, wantShape: ShapeScaleOut, ids: []int32{9707, 151645},
			lps: []float32{-0.3125, -0.0001}, finish: "stop", prompt: 12, cached: 8,
			top: [][]TopLogProb{{{9707, -0.3125}, {13, -2.25}}, {{151645, -0.0001}, {198, -9.5}}}},
		{file: "generate_c.json", route: RouteGenerate, k: 2, mask: true, wantShape: ShapeTokenIDs, ids: []int32{9707, 151658},
			lps: []float32{-0.3125, -0.5}, finish: "stop", stop: StopReason{TokenID: 151658, IsTokenID: true}, prompt: 3, cached: -1,
			top:     [][]TopLogProb{{{9707, -0.3125}, {13, -2.25}}, {{151658, -0.5}, {198, -1}}},
			maskIDs: []int32{9707, 13, 11, 151658}, maskOffs: []int32{0, 3, 4}},
		{file: "completions.json", route: RouteCompletions, k: 1, wantShape: ShapeCompletions, ids: []int32{9707, 11, 151645},
			lps: []float32{-0.3125, -1.5, -0.0001}, finish: "stop", prompt: 3, cached: -1,
			top: [][]TopLogProb{{{9707, -0.3125}, {13, -2.25}}, {{11, -1.5}}, {{151645, -0.0001}, {198, -9.5}}}},
		{file: "completions_labels_only.json", route: RouteCompletions, wantShape: ShapeCompletions, ids: []int32{9707},
			lps: []float32{-0.3125}, finish: "length", prompt: 3, cached: -1},
	} {
		t.Run(tc.file, func(t *testing.T) {
			mode := ModeGenerate
			if tc.route == RouteCompletions {
				mode = ModeCompletions
			}
			f := newFake(t, map[string]reply{"POST " + string(tc.route): {body: golden(t, tc.file)}})
			c := newClient(t, f.URL, Options{Mode: mode, ContextLength: 1 << 20})
			g, err := c.Generate(bg, GenerateRequest{PromptIDs: []int32{1, 2, 3}, Sampling: SamplingParams{MaxTokens: 4, Logprobs: tc.k}, ReturnSamplingMask: tc.mask})
			require.NoError(t, err)
			assert.Equal(t, tc.wantShape, g.Shape)
			assert.Equal(t, tc.route, g.Route)
			assert.Equal(t, tc.ids, g.OutputIDs)
			assert.Equal(t, tc.lps, g.LogProbs)
			assert.Equal(t, tc.finish, g.FinishReason)
			assert.Equal(t, tc.stop, g.StopReason)
			assert.Equal(t, tc.prompt, g.PromptTokens)
			assert.Equal(t, tc.cached, g.CachedTokens)
			assert.Equal(t, tc.top, g.TopLogProbs)
			assert.Equal(t, tc.maskIDs, g.TopPTokenIDs)
			assert.Equal(t, tc.maskOffs, g.TopPTokenOffsets)
			assert.Equal(t, 4, g.MaxTokens)
		})
	}
}

func TestTopK(t *testing.T) {
	g := Generation{OutputIDs: []int32{5, 6}, TopLogProbs: [][]TopLogProb{{{5, -3}, {1, -0.5}, {2, -1}}, {{6, -0.1}, {9, -4}}}}
	ids, lps, err := g.TopK(2)
	require.NoError(t, err)
	assert.Equal(t, []int32{1, 2, 6, 9}, ids)
	assert.Equal(t, []float32{-0.5, -1, -0.1, -4}, lps)
	_, _, err = g.TopK(3)
	assert.ErrorContains(t, err, "position 1 has 2 candidates")
	_, _, err = (&Generation{OutputIDs: []int32{1}}).TopK(1)
	assert.ErrorContains(t, err, "no top logprobs")
}

// mutate edits a golden body textually; every case must fail with its reason.
func TestReplyValidation(t *testing.T) {
	a := string(golden(t, "generate_a.json"))
	b := string(golden(t, "generate_b.json"))
	cc := string(golden(t, "generate_c.json"))
	comp := string(golden(t, "completions.json"))
	for _, tc := range []struct {
		name   string
		route  Route
		body   string
		k      int
		mask   bool
		reason Reason
		detail string
	}{
		{"not json", RouteGenerate, `<html>`, 0, false, ReasonBadJSON, "not a JSON object"},
		{"choices missing", RouteGenerate, `{"request_id":"x"}`, 0, false, ReasonNoChoices, "choices missing"},
		{"choices empty", RouteGenerate, `{"choices":[]}`, 0, false, ReasonNoChoices, "choices is empty"},
		{"two choices", RouteGenerate, `{"choices":[{},{}]}`, 0, false, ReasonExtraChoices, "2 choices"},
		{"token_ids missing", RouteGenerate, strings.Replace(a, `"token_ids":[9707,11,151645]`, `"x":1`, 1), 0, false, ReasonMissingTokenIDs, "token_ids missing"},
		{"token id negative", RouteGenerate, strings.Replace(a, `"token_ids":[9707,`, `"token_ids":[-1,`, 1), 0, false, ReasonBadTokenID, "token_ids[0] = -1"},
		{"token id float", RouteGenerate, strings.Replace(a, `"token_ids":[9707,`, `"token_ids":[9707.5,`, 1), 0, false, ReasonBadTokenID, "token_ids[0]"},
		{"logprobs null", RouteGenerate, strings.Replace(a, `"logprobs":{"content":`, `"logprobs":null,"x":{"content":`, 1), 0, false, ReasonMissingLogprobs, "choices[0].logprobs missing"},
		{"content null", RouteGenerate, `{"choices":[{"token_ids":[1],"logprobs":{"content":null}}]}`, 0, false, ReasonMissingLogprobs, "content missing"},
		{"entry logprob null", RouteGenerate, strings.Replace(a, `"logprob":-1.5,`, `"logprob":null,`, 1), 0, false, ReasonMissingLogprobs, "logprobs.content[1]: logprob missing"},
		{"NaN logprob", RouteGenerate, strings.Replace(a, `"logprob":-1.5,`, `"logprob":NaN,`, 1), 0, false, ReasonNonFiniteLogprob, "logprobs.content[1]"},
		{"-Infinity logprob", RouteGenerate, strings.Replace(b, `"logprob":-0.0001,"bytes":null,"top`, `"logprob":-Infinity,"bytes":null,"top`, 1), 0, false, ReasonNonFiniteLogprob, "logprobs.content[1]"},
		{"huge logprob", RouteGenerate, strings.Replace(a, `"logprob":-1.5,`, `"logprob":-1e300,`, 1), 0, false, ReasonNonFiniteLogprob, "not finite"},
		{"fewer logprobs", RouteGenerate, strings.Replace(a, `"token_ids":[9707,11,151645]`, `"token_ids":[9707,11,151645,2]`, 1), 0, false, ReasonLengthMismatch, "3 logprob entries for 4 output ids"},
		{"label mismatch", RouteGenerate, strings.Replace(a, `"token":"token_id:11"`, `"token":"token_id:12"`, 1), 0, false, ReasonTokenMismatch, "is for token 12 but token_ids[1] = 11"},
		{"int id mismatch", RouteGenerate, strings.Replace(cc, `{"token_id":151658,"logprob":-0.5,"rank":1,"top`, `{"token_id":151657,"logprob":-0.5,"rank":1,"top`, 1), 0, false, ReasonTokenMismatch, "is for token 151657"},
		{"int and label disagree", RouteGenerate, `{"choices":[{"token_ids":[1],"logprobs":{"content":[{"token_id":1,"token":"token_id:2","logprob":-1}]}}]}`, 0, false, ReasonTokenMismatch, "token_id 1 but token"},
		{"bad label", RouteGenerate, strings.Replace(a, `"token":"token_id:11"`, `"token":"token_id:x"`, 1), 0, false, ReasonBadTokenID, `"token_id:x"`},
		{"usage mismatch", RouteGenerate, strings.Replace(b, `"completion_tokens":2`, `"completion_tokens":3`, 1), 0, false, ReasonUsageMismatch, "completion_tokens = 3 but 2"},
		{"usage without completion_tokens", RouteGenerate, strings.Replace(b, `"completion_tokens":2,`, ``, 1), 0, false, ReasonUsageMismatch, "completion_tokens = 0"},
		{"finish unknown", RouteGenerate, strings.Replace(a, `"finish_reason":"stop"`, `"finish_reason":"tool_calls"`, 1), 0, false, ReasonBadFinishReason, `unknown finish_reason "tool_calls"`},
		{"finish not string", RouteGenerate, strings.Replace(a, `"finish_reason":"stop"`, `"finish_reason":3`, 1), 0, false, ReasonBadFinishReason, "not a string"},
		{"finish error", RouteGenerate, strings.Replace(a, `"finish_reason":"stop"`, `"finish_reason":"error"`, 1), 0, false, ReasonEngineError, "engine failed"},
		{"stop_reason object", RouteGenerate, strings.Replace(b, `"stop_reason":null`, `"stop_reason":{}`, 1), 0, false, ReasonBadFinishReason, "stop_reason"},
		{"top logprobs missing", RouteGenerate, `{"choices":[{"token_ids":[1],"logprobs":{"content":[{"token_id":1,"logprob":-1}]}}]}`, 1, false, ReasonBadTopLogprobs, "top_logprobs missing"},
		{"top logprobs disagg label bug", RouteGenerate, string(golden(t, "generate_a_top2_bug.json")), 2, false, ReasonBadTopLogprobs, "listed twice"},
		{"top logprobs lack sampled", RouteGenerate, strings.Replace(b, `"token":"token_id:9707","logprob":-0.3125,"bytes":null},{"token":"token_id:13"`, `"token":"token_id:8","logprob":-0.3125,"bytes":null},{"token":"token_id:13"`, 1), 1, false, ReasonBadTopLogprobs, "sampled token 9707 is not among"},
		{"top logprobs too many", RouteGenerate, b, 0, false, "", ""}, // k=0: top rows ignored
		{"sampling mask missing", RouteGenerate, strings.Replace(cc, `"sampling_mask":[[9707,13,11],[151658]],`, ``, 1), 0, true, ReasonMissingSamplingMask, "--return-sampling-mask"},
		{"sampling mask rows", RouteGenerate, strings.Replace(cc, `"sampling_mask":[[9707,13,11],[151658]]`, `"sampling_mask":[[9707,13,11]]`, 1), 0, true, ReasonBadSamplingMask, "1 rows for 2 output ids"},
		{"sampling mask lacks sampled", RouteGenerate, strings.Replace(cc, `[151658]]`, `[198]]`, 1), 0, true, ReasonBadSamplingMask, "lacks the sampled token 151658"},
		{"completions logprobs null", RouteCompletions, strings.Replace(comp, `"logprobs":{"text_offset"`, `"logprobs":null,"x":{"text_offset"`, 1), 0, false, ReasonMissingLogprobs, "choices[0].logprobs missing"},
		{"completions null token logprob", RouteCompletions, strings.Replace(comp, `[-0.3125,-1.5,-0.0001]`, `[null,-1.5,-0.0001]`, 1), 0, false, ReasonMissingLogprobs, "token_logprobs[0]"},
		{"completions label mismatch", RouteCompletions, strings.Replace(comp, `"tokens":["token_id:9707"`, `"tokens":["token_id:9708"`, 1), 0, false, ReasonTokenMismatch, "logprobs.tokens[0] is for token 9708"},
		{"completions count", RouteCompletions, strings.Replace(comp, `"token_ids":[9707,11,151645]`, `"token_ids":[9707,11]`, 1), 0, false, ReasonLengthMismatch, "3 logprob entries for 2 output ids"},
		{"completions text tokens, no ids", RouteCompletions, `{"choices":[{"logprobs":{"tokens":["Hello"],"token_logprobs":[-1]},"finish_reason":"length"}]}`, 0, false, ReasonMissingTokenIDs, "return_tokens_as_token_ids"},
		{"completions usage", RouteCompletions, strings.Replace(comp, `"completion_tokens":3`, `"completion_tokens":4`, 1), 0, false, ReasonUsageMismatch, "completion_tokens = 4"},
		{"completions empty choices", RouteCompletions, `{"choices":[],"usage":{}}`, 0, false, ReasonNoChoices, "empty"},
		{"completions top key", RouteCompletions, strings.Replace(comp, `{"token_id:11":-1.5}`, `{"Hello":-1.5}`, 1), 1, false, ReasonBadTopLogprobs, `key "Hello"`},
	} {
		t.Run(tc.name, func(t *testing.T) {
			mode := ModeGenerate
			if tc.route == RouteCompletions {
				mode = ModeCompletions
			}
			f := newFake(t, map[string]reply{"POST " + string(tc.route): {body: []byte(tc.body)}})
			c := newClient(t, f.URL, Options{Mode: mode, ContextLength: 1 << 20})
			g, err := c.Generate(bg, GenerateRequest{PromptIDs: []int32{1}, Sampling: SamplingParams{MaxTokens: 4, Logprobs: tc.k}, ReturnSamplingMask: tc.mask})
			if tc.reason == "" {
				require.NoError(t, err)
				return
			}
			var re *ReplyError
			require.ErrorAs(t, err, &re, "got %v", err)
			assert.Equal(t, tc.reason, re.Reason)
			assert.Contains(t, re.Error(), tc.detail)
			assert.Contains(t, re.Error(), string(tc.route))
			assert.Zero(t, g.OutputIDs, "nothing partially returned")
			assert.Zero(t, g.LogProbs)
		})
	}
}

func TestEmptyOutputIsValid(t *testing.T) {
	f := newFake(t, map[string]reply{"POST /inference/v1/generate": {body: []byte(`{"choices":[{"index":0,"token_ids":[],"logprobs":{"content":[]},"finish_reason":"abort"}]}`)}})
	c := newClient(t, f.URL, Options{Mode: ModeGenerate, ContextLength: 8})
	g, err := c.Generate(bg, GenerateRequest{PromptIDs: []int32{1}, Sampling: SamplingParams{MaxTokens: 4}, ReturnSamplingMask: true, ReturnRoutedExperts: true})
	require.NoError(t, err)
	assert.Empty(t, g.OutputIDs)
	assert.Equal(t, "abort", g.FinishReason)
	assert.Equal(t, []int32{0}, g.TopPTokenOffsets)
}

// npy builds a version-1 .npy of little-endian int32 with the given shape.
func npy(shape []int, vals []int32) string {
	dims := make([]string, len(shape))
	for i, d := range shape {
		dims[i] = fmt.Sprint(d)
	}
	hdr := fmt.Sprintf("{'descr': '<i4', 'fortran_order': False, 'shape': (%s), }", strings.Join(dims, ", "))
	for (10+len(hdr)+1)%64 != 0 {
		hdr += " "
	}
	hdr += "\n"
	var b bytes.Buffer
	b.WriteString("\x93NUMPY\x01\x00")
	_ = binary.Write(&b, binary.LittleEndian, uint16(len(hdr)))
	b.WriteString(hdr)
	_ = binary.Write(&b, binary.LittleEndian, vals)
	return base64.StdEncoding.EncodeToString(b.Bytes())
}

func TestRoutedExperts(t *testing.T) {
	// prompt 3 + output 2 − 1 = 4 positions, 2 layers, top-1 experts.
	body := func(re string) []byte {
		return []byte(`{"choices":[{"token_ids":[7,8],"logprobs":{"content":[{"token_id":7,"logprob":-1},{"token_id":8,"logprob":-2}]},"finish_reason":"length","routed_experts":` + re + `}],"model":"m","usage":{"prompt_tokens":3,"completion_tokens":2,"total_tokens":5}}`)
	}
	for _, tc := range []struct {
		name, re string
		reason   Reason
	}{
		{"ok", `"` + npy([]int{4, 2, 1}, []int32{0, 1, 2, 3, 4, 5, 6, 7}) + `"`, ""},
		{"missing", `null`, ReasonMissingRoutedExperts},
		{"wrong positions", `"` + npy([]int{5, 2, 1}, make([]int32, 10)) + `"`, ReasonBadRoutedExperts},
		{"not npy", `"aGVsbG8="`, ReasonBadRoutedExperts},
	} {
		t.Run(tc.name, func(t *testing.T) {
			f := newFake(t, map[string]reply{"POST /inference/v1/generate": {body: body(tc.re)}})
			c := newClient(t, f.URL, Options{Mode: ModeGenerate, ContextLength: 64})
			g, err := c.Generate(bg, GenerateRequest{PromptIDs: []int32{1, 2, 3}, Sampling: SamplingParams{MaxTokens: 2}, ReturnRoutedExperts: true})
			if tc.reason == "" {
				require.NoError(t, err)
				assert.Equal(t, []int32{4, 2, 1}, g.RoutedExpertsShape)
				assert.Equal(t, []int32{0, 1, 2, 3, 4, 5, 6, 7}, g.RoutedExperts)
				assert.Equal(t, ShapeTokenIDs, g.Shape)
				return
			}
			var re *ReplyError
			require.ErrorAs(t, err, &re)
			assert.Equal(t, tc.reason, re.Reason)
		})
	}
}

func TestClampMaxTokens(t *testing.T) {
	for _, tc := range []struct {
		prompt, req, ctx, want int
		overflow               bool
	}{
		{6, 16, 16, 10, false},
		{6, 4, 16, 4, false},
		{12, 16, 16, 4, false},
		{13, 16, 16, 3, false},
		{1, 4, 4, 3, false},
		{15, 16, 16, 1, false}, // exact fit: room for one token
		{16, 16, 16, 0, true},  // prompt fills the context
		{17, 16, 16, 0, true},  // overflow by one
		{6, 16, 0, 16, false},  // unknown context: no clamp
	} {
		got, err := ClampMaxTokens(tc.prompt, tc.req, tc.ctx)
		if tc.overflow {
			var oe *ContextOverflowError
			require.ErrorAs(t, err, &oe, "%+v", tc)
			assert.Equal(t, ContextOverflowError{PromptTokens: tc.prompt, MaxContext: tc.ctx}, *oe)
			assert.Contains(t, err.Error(), fmt.Sprintf("prompt has %d tokens", tc.prompt))
			continue
		}
		require.NoError(t, err, "%+v", tc)
		assert.Equal(t, tc.want, got, "%+v", tc)
	}
	_, err := ClampMaxTokens(1, 0, 10)
	assert.ErrorContains(t, err, "at least 1")

	// Inside Generate: overflow never reaches the engine.
	f := newFake(t, map[string]reply{"POST /inference/v1/generate": {body: golden(t, "generate_a.json")}})
	c := newClient(t, f.URL, Options{Mode: ModeGenerate, ContextLength: 3})
	_, err = c.Generate(bg, GenerateRequest{PromptIDs: []int32{1, 2, 3}, Sampling: SamplingParams{MaxTokens: 5}})
	var oe *ContextOverflowError
	require.ErrorAs(t, err, &oe)
	assert.Equal(t, 0, f.count("/inference/v1/generate"))
}

func TestSamplingChecks(t *testing.T) {
	c := newClient(t, "http://127.0.0.1:1", Options{Mode: ModeGenerate, ContextLength: 10})
	for _, tc := range []struct {
		p    SamplingParams
		want string
	}{
		{SamplingParams{}, "MaxTokens 0"},
		{SamplingParams{MaxTokens: 1, Temperature: ptr(2.5)}, "Temperature"},
		{SamplingParams{MaxTokens: 1, TopP: ptr(0.0)}, "TopP"},
		{SamplingParams{MaxTokens: 1, TopK: ptr(-2)}, "TopK"},
		{SamplingParams{MaxTokens: 1, MinTokens: 2}, "MinTokens"},
		{SamplingParams{MaxTokens: 1, Logprobs: -1}, "Logprobs"},
		{SamplingParams{MaxTokens: 1, PresencePenalty: ptr(3.0)}, "PresencePenalty"},
		{SamplingParams{MaxTokens: 1, StopTokenIDs: []int32{-4}}, "StopTokenIDs"},
	} {
		_, err := c.Generate(bg, GenerateRequest{PromptIDs: []int32{1}, Sampling: tc.p})
		assert.ErrorContains(t, err, tc.want)
	}
	_, err := c.Generate(bg, GenerateRequest{Sampling: SamplingParams{MaxTokens: 1}})
	assert.ErrorContains(t, err, "empty prompt")
	// A negative prompt id is refused, memo or not: a memo vouches only
	// for the very ids it read.
	var memo Memo
	render, ok := memo.scan([]byte(`[5,6,7]`))
	require.True(t, ok)
	for _, m := range []*Memo{nil, &memo} {
		_, err = c.Generate(bg, GenerateRequest{PromptIDs: []int32{5, -6, 7}, Memo: m, Sampling: SamplingParams{MaxTokens: 1}})
		assert.ErrorContains(t, err, "PromptIDs[1] = -6 is negative")
	}
	assert.True(t, memo.holds(render) && memo.holds(render[:2]), "the memo's render and its prefixes")
	assert.False(t, memo.holds(slices.Clone(render)) || memo.holds(render[1:]) || memo.holds(nil), "copies, other offsets, nothing")
}

func TestGenerateHTTPErrors(t *testing.T) {
	for _, tc := range []struct {
		name   string
		status int
		body   string
		want   []string
	}{
		{"envelope", 400, string(golden(t, "error_envelope_400.json")), []string{"HTTP 400", "temperature must be in [0, 2]"}},
		{"unknown model", 404, string(golden(t, "error_unknown_model_404.json")), []string{"HTTP 404", "does not exist"}},
		{"detail", 500, `{"detail":"boom"}`, []string{"HTTP 500", "boom"}},
		{"error string", 401, `{"error":"Unauthorized"}`, []string{"HTTP 401", "Unauthorized"}},
		{"raw", 502, `bad gateway`, []string{"HTTP 502", "bad gateway"}},
	} {
		t.Run(tc.name, func(t *testing.T) {
			f := newFake(t, map[string]reply{"POST /inference/v1/generate": {status: tc.status, body: []byte(tc.body)}})
			c := newClient(t, f.URL, Options{Mode: ModeGenerate, ContextLength: 10})
			_, err := c.Generate(bg, GenerateRequest{PromptIDs: []int32{1}, Sampling: SamplingParams{MaxTokens: 1}})
			var he *HTTPError
			require.ErrorAs(t, err, &he)
			assert.Equal(t, tc.status, he.Status)
			for _, w := range tc.want {
				assert.Contains(t, err.Error(), w)
			}
			assert.Empty(t, he.Hint, "an error envelope 404 is not a missing route")
			assert.Equal(t, 1, f.count("/inference/v1/generate"), "no retries")
		})
	}
	f := newFake(t, nil) // route missing: {"detail":"Not Found"}
	c := newClient(t, f.URL, Options{Mode: ModeGenerate, ContextLength: 10})
	_, err := c.Generate(bg, GenerateRequest{PromptIDs: []int32{1}, Sampling: SamplingParams{MaxTokens: 1}})
	assert.ErrorContains(t, err, "token-in route is not enabled")
}

func TestCancelAbortsInflightRequest(t *testing.T) {
	entered := make(chan struct{})
	observed := make(chan struct{})
	srv := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		_, _ = io.ReadAll(r.Body) // as uvicorn does; net/http then watches the connection
		close(entered)
		select {
		case <-r.Context().Done(): // the client closed the connection
			close(observed)
		case <-time.After(5 * time.Second):
		}
	}))
	defer srv.Close()
	c := newClient(t, srv.URL, Options{Mode: ModeGenerate, ContextLength: 10})
	ctx, cancel := context.WithCancel(bg)
	errc := make(chan error, 1)
	go func() {
		_, err := c.Generate(ctx, GenerateRequest{PromptIDs: []int32{1}, Sampling: SamplingParams{MaxTokens: 1}})
		errc <- err
	}()
	<-entered
	cancel()
	select {
	case <-observed:
	case <-time.After(2 * time.Second):
		t.Fatal("server never saw the request context end")
	}
	err := <-errc
	assert.True(t, errors.Is(err, context.Canceled), "%v", err)
}

func TestRequestTimeout(t *testing.T) {
	srv := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		_, _ = io.ReadAll(r.Body)
		select {
		case <-r.Context().Done():
		case <-time.After(2 * time.Second):
		}
	}))
	defer srv.Close()
	c := newClient(t, srv.URL, Options{Mode: ModeGenerate, ContextLength: 10, RequestTimeout: 50 * time.Millisecond})
	_, err := c.Generate(bg, GenerateRequest{PromptIDs: []int32{1}, Sampling: SamplingParams{MaxTokens: 1}})
	assert.True(t, errors.Is(err, context.DeadlineExceeded), "%v", err)
}
