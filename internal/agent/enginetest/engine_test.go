package enginetest

import (
	"bytes"
	"context"
	"encoding/json"
	"fmt"
	"io"
	"net/http"
	"net/http/httptest"
	"slices"
	"strings"
	"sync"
	"testing"
	"time"
)

func serve(t *testing.T, o Options) (*Engine, *httptest.Server) {
	t.Helper()
	e := New(o)
	s := httptest.NewServer(e)
	t.Cleanup(s.Close)
	return e, s
}

func call(t *testing.T, s *httptest.Server, method, path, body string, hdr ...string) (int, string) {
	t.Helper()
	req, err := http.NewRequest(method, s.URL+path, strings.NewReader(body))
	if err != nil {
		t.Fatal(err)
	}
	for i := 0; i+1 < len(hdr); i += 2 {
		req.Header.Set(hdr[i], hdr[i+1])
	}
	resp, err := s.Client().Do(req)
	if err != nil {
		t.Fatal(err)
	}
	defer resp.Body.Close()
	b, _ := io.ReadAll(resp.Body)
	return resp.StatusCode, string(b)
}

func post(t *testing.T, s *httptest.Server, path, body string, hdr ...string) (int, string) {
	t.Helper()
	return call(t, s, http.MethodPost, path, body, hdr...)
}

func expect(t *testing.T, status int, body string, wantStatus int, want string) {
	t.Helper()
	if status != wantStatus || body != want {
		t.Errorf("got %d %s\nwant %d %s", status, body, wantStatus, want)
	}
}

func TestTokenize(t *testing.T) {
	_, s := serve(t, Options{MaxModelLen: 64})
	st, b := post(t, s, "/tokenize", `{"prompt":"a <|im_end|>","return_token_strs":true}`)
	expect(t, st, b, 200, `{"count":3,"max_model_len":64,"tokens":[97,32,258],"token_strs":["a","Ġ","<|im_end|>"]}`)
	st, b = post(t, s, "/tokenize", `{"model":"kiln-test-model","prompt":"hi","add_special_tokens":true}`)
	expect(t, st, b, 200, `{"count":2,"max_model_len":64,"tokens":[104,105],"token_strs":null}`)

	msgs := `[{"role":"user","content":"hi"}]`
	st, b = post(t, s, "/tokenize", `{"messages":`+msgs+`}`)
	want, _ := ChatTemplate{}.Render([]byte(msgs), nil, RenderOptions{AddGenerationPrompt: true})
	var r struct {
		Count       int   `json:"count"`
		MaxModelLen int   `json:"max_model_len"`
		Tokens      []int `json:"tokens"`
	}
	if err := json.Unmarshal([]byte(b), &r); err != nil || st != 200 || !slices.Equal(r.Tokens, Encode(want)) || r.Count != len(r.Tokens) {
		t.Errorf("chat tokenize: %d %s", st, b)
	}
	// No length check on /tokenize (docs/engine-wire.md §2.2).
	if st, _ := post(t, s, "/tokenize", `{"prompt":"`+strings.Repeat("x", 100)+`"}`); st != 200 {
		t.Errorf("long prompt status %d", st)
	}
	st, b = post(t, s, "/tokenize", `{"messages":`+msgs+`,"add_generation_prompt":false,"chat_template_kwargs":{"enable_thinking":false}}`)
	if st != 200 || !strings.Contains(b, `"count":10,`) {
		t.Errorf("no gen prompt: %d %s", st, b)
	}
	st, b = post(t, s, "/tokenize", `{"messages":`+msgs+`,"continue_final_message":true}`)
	expect(t, st, b, 400, `{"error":{"message":"Cannot set both `+"`continue_final_message` and `add_generation_prompt`"+` to True.","type":"BadRequestError","param":null,"code":400}}`)
	st, b = post(t, s, "/tokenize", `{"messages":`+msgs+`,"chat_template":"{{ x }}"}`)
	expect(t, st, b, 400, `{"error":{"message":"`+untrustedTemplateMsg+`","type":"BadRequestError","param":null,"code":400}}`)
	st, b = post(t, s, "/tokenize", `{"model":"other","prompt":"x"}`)
	expect(t, st, b, 404, "{\"error\":{\"message\":\"The model `other` does not exist.\",\"type\":\"NotFoundError\",\"param\":null,\"code\":404}}")
	st, b = post(t, s, "/tokenize", `{"messages":`+msgs+`,"tools":[{"type":"function","function":{"name":"f"}}]}`)
	if st != 200 {
		t.Errorf("tools: %d %s", st, b)
	}
}

func TestDetokenize(t *testing.T) {
	_, s := serve(t, Options{})
	st, b := post(t, s, "/detokenize", `{"tokens":[257,104,105,258]}`)
	expect(t, st, b, 200, `{"prompt":"<|im_start|>hi<|im_end|>"}`)
	if st, _ := post(t, s, "/detokenize", `{"tokens":[-1]}`); st != 400 {
		t.Errorf("negative id: %d", st)
	}
	if st, _ := post(t, s, "/detokenize", `{"tokens":[9999]}`); st != 400 {
		t.Errorf("oov id: %d", st)
	}
}

func TestSimpleEndpoints(t *testing.T) {
	e, s := serve(t, Options{MaxModelLen: 128, ModelRoot: "/ckpt"})
	st, b := call(t, s, "GET", "/v1/models", "")
	expect(t, st, b, 200, `{"object":"list","data":[{"id":"kiln-test-model","object":"model","created":1700000000,"owned_by":"vllm","root":"/ckpt","parent":null,"max_model_len":128,"permission":[{"id":"modelperm-enginetest","object":"model_permission","created":1700000000,"allow_create_engine":false,"allow_sampling":true,"allow_logprobs":true,"allow_search_indices":false,"allow_view":true,"allow_fine_tuning":false,"organization":"*","group":null,"is_blocking":false}]}]}`)
	st, b = call(t, s, "GET", "/version", "")
	expect(t, st, b, 200, `{"version":"0.32.0"}`)
	st, b = call(t, s, "GET", "/health", "")
	expect(t, st, b, 200, "")
	e.SetHealthy(false)
	st, b = call(t, s, "GET", "/health", "")
	expect(t, st, b, 503, "")
	st, b = call(t, s, "GET", "/nope", "")
	expect(t, st, b, 404, `{"detail":"Not Found"}`)
	st, b = call(t, s, "GET", "/tokenize", "")
	expect(t, st, b, 405, `{"detail":"Method Not Allowed"}`)
	st, b = call(t, s, "GET", "/openapi.json", "")
	if st != 200 || !strings.Contains(b, `"/inference/v1/generate":{"post":{}}`) {
		t.Errorf("openapi: %s", b)
	}
	if st, _ := call(t, s, "GET", "/tokenizer_info", ""); st != 404 {
		t.Errorf("tokenizer_info should be opt-in, got %d", st)
	}
	_, s2 := serve(t, Options{EnableTokenizerInfo: true, APIKey: "k"})
	st, b = call(t, s2, "GET", "/tokenizer_info", "")
	if st != 200 || !strings.Contains(b, `"eos_token":"<|im_end|>"`) || !strings.Contains(b, `"258":"<|im_end|>"`) {
		t.Errorf("tokenizer_info: %d %s", st, b)
	}
	st, b = call(t, s2, "GET", "/v1/models", "")
	expect(t, st, b, 401, `{"error":"Unauthorized"}`)
	if st, _ := call(t, s2, "GET", "/v1/models", "", "Authorization", "Bearer k"); st != 200 {
		t.Errorf("authorized: %d", st)
	}
	if st, _ := post(t, s2, "/tokenize", `{"prompt":"x"}`); st != 200 {
		t.Errorf("/tokenize is not guarded: %d", st)
	}
}

const genBody = `{"token_ids":[104,105],"sampling_params":{"max_tokens":8,"temperature":0,"logprobs":1,"detokenize":false}}`

func okScript(Request) Output {
	return Output{IDs: []int{'o', 'k', IMEnd}, Logprobs: []float64{-0.1, -0.2, -0.3}}
}

// Shapes (A), (B), (C) of docs/engine-wire.md §5.4, byte for byte.
func TestGenerateShapes(t *testing.T) {
	_, s := serve(t, Options{Script: okScript})
	st, b := post(t, s, "/inference/v1/generate", `{"token_ids":[104,105],"request_id":"r1","sampling_params":{"max_tokens":8,"temperature":0,"logprobs":2,"detokenize":false}}`)
	expect(t, st, b, 200, `{"request_id":"generate-tokens-r1","output_mode":"tokens","model":"kiln-test-model","created":1700000000,"choices":[{"index":0,"finish_reason":"stop","stop_reason":null,"token_ids":[111,107,258],"logprobs":{"content":[{"token_id":111,"logprob":-0.1,"rank":1,"top_logprobs":[{"token_id":111,"logprob":-0.1,"rank":1},{"token_id":148,"logprob":-0.6,"rank":2}]},{"token_id":107,"logprob":-0.2,"rank":1,"top_logprobs":[{"token_id":107,"logprob":-0.2,"rank":1},{"token_id":144,"logprob":-0.7,"rank":2}]},{"token_id":258,"logprob":-0.3,"rank":1,"top_logprobs":[{"token_id":258,"logprob":-0.3,"rank":1},{"token_id":30,"logprob":-0.8,"rank":2}]}]},"routed_experts":null,"sampling_mask":null,"weight_versions":null}],"usage":{"prompt_tokens":2,"total_tokens":5,"completion_tokens":3,"prompt_tokens_details":null},"prompt_token_ids":null,"mm_placeholders":null,"metrics":null,"prompt_logprobs":null,"prompt_token_id_logprobs":null,"kv_transfer_params":null,"ec_transfer_params":null}`)

	_, s = serve(t, Options{Script: okScript, Shape: ShapeScaleOut})
	st, b = post(t, s, "/inference/v1/generate", genBody, "X-Request-Id", "h1")
	expect(t, st, b, 200, `{"request_id":"generate-tokens-h1","model":"kiln-test-model","created":1700000000,"choices":[{"index":0,"logprobs":{"content":[{"token":"token_id:111","logprob":-0.1,"bytes":null,"top_logprobs":[{"token":"token_id:111","logprob":-0.1,"bytes":null}]},{"token":"token_id:107","logprob":-0.2,"bytes":null,"top_logprobs":[{"token":"token_id:107","logprob":-0.2,"bytes":null}]},{"token":"token_id:258","logprob":-0.3,"bytes":null,"top_logprobs":[{"token":"token_id:258","logprob":-0.3,"bytes":null}]}]},"finish_reason":"stop","stop_reason":null,"token_ids":[111,107,258],"routed_experts":null}],"usage":{"prompt_tokens":2,"total_tokens":5,"completion_tokens":3,"prompt_tokens_details":null},"prompt_logprobs":null,"kv_transfer_params":null}`)
	if st, b := call(t, s, "GET", "/version", ""); b != `{"version":"0.28.0"}` {
		t.Errorf("version %d %s", st, b)
	}

	_, s = serve(t, Options{Script: okScript, Shape: ShapeDisagg})
	st, b = post(t, s, "/inference/v1/generate", strings.Replace(genBody, `"logprobs":1`, `"logprobs":2`, 1))
	var a struct {
		RequestID string `json:"request_id"`
		Choices   []struct {
			Logprobs struct {
				Content []struct {
					Token string `json:"token"`
					Top   []struct {
						Token   string  `json:"token"`
						Logprob float64 `json:"logprob"`
					} `json:"top_logprobs"`
				} `json:"content"`
			} `json:"logprobs"`
			TokenIDs []int `json:"token_ids"`
		} `json:"choices"`
	}
	if err := json.Unmarshal([]byte(b), &a); err != nil || st != 200 {
		t.Fatalf("%d %s", st, b)
	}
	c := a.Choices[0].Logprobs.Content[0]
	if c.Token != "token_id:111" || len(c.Top) != 2 || c.Top[1].Token != "token_id:111" || c.Top[1].Logprob != -0.6 {
		t.Errorf("disagg top_logprobs bug not mirrored: %s", b)
	}
	for _, k := range []string{`"usage"`, `"model"`, `"created"`, `"stop_reason"`} {
		if strings.Contains(b, k) {
			t.Errorf("shape A has %s: %s", k, b)
		}
	}
	if !strings.HasSuffix(b, `"prompt_logprobs":null,"kv_transfer_params":null}`) || a.RequestID == "" {
		t.Errorf("shape A: %s", b)
	}
}

func generateResp(t *testing.T, s *httptest.Server, body string, hdr ...string) (int, map[string]any, string) {
	t.Helper()
	st, b := post(t, s, "/inference/v1/generate", body, hdr...)
	var m map[string]any
	_ = json.Unmarshal([]byte(b), &m)
	return st, m, b
}

func choice0(m map[string]any) map[string]any {
	return m["choices"].([]any)[0].(map[string]any)
}

func ids(c map[string]any) []int {
	var out []int
	for _, v := range c["token_ids"].([]any) {
		out = append(out, int(v.(float64)))
	}
	return out
}

func TestGenerateStopsAndLimits(t *testing.T) {
	_, s := serve(t, Options{MaxModelLen: 10, Script: func(r Request) Output { return Output{Text: r.PromptText[len(r.PromptText)-1:] + "bcdef"} }})
	gen := func(prompt string, sp string) (int, map[string]any, string) {
		return generateResp(t, s, fmt.Sprintf(`{"token_ids":%s,"sampling_params":%s}`, prompt, sp))
	}
	// max_tokens honoured.
	_, m, _ := gen(`[97]`, `{"max_tokens":3}`)
	if c := choice0(m); !slices.Equal(ids(c), []int{'a', 'b', 'c'}) || c["finish_reason"] != "length" || c["stop_reason"] != nil {
		t.Errorf("max_tokens: %v", c)
	}
	// Absent max_tokens in the newest shape: max_model_len - prompt; eos ends it.
	_, m, _ = gen(`[97]`, `{}`)
	if c := choice0(m); !slices.Equal(ids(c), Encode("abcdef<|im_end|>")) || c["finish_reason"] != "stop" {
		t.Errorf("eos: %v", c)
	}
	// Context: a 6-token prompt leaves 4 tokens.
	_, m, _ = gen(`[97,97,97,97,97,97]`, `{"max_tokens":100}`)
	if c := choice0(m); len(ids(c)) != 4 || c["finish_reason"] != "length" {
		t.Errorf("context cap: %v", c)
	}
	// Prompt longer than max_model_len: 400.
	st, _, b := gen(`[1,2,3,4,5,6,7,8,9,10,11]`, `{"max_tokens":1}`)
	if st != 400 || !strings.Contains(b, "The decoder prompt (length 11) is longer than the maximum model length of 10") || !strings.Contains(b, `"type":"BadRequestError"`) {
		t.Errorf("long prompt: %d %s", st, b)
	}
	// stop_token_ids: stop after emitting, stop_reason = id.
	_, m, _ = gen(`[97]`, `{"max_tokens":8,"stop_token_ids":[99]}`)
	if c := choice0(m); !slices.Equal(ids(c), []int{'a', 'b', 'c'}) || c["stop_reason"] != float64(99) {
		t.Errorf("stop_token_ids: %v", c)
	}
	// Stop strings need detokenize.
	if st, _, _ := gen(`[97]`, `{"max_tokens":8,"stop":["cd"],"detokenize":false}`); st != 400 {
		t.Errorf("stop without detokenize: %d", st)
	}
	_, m, _ = gen(`[97]`, `{"max_tokens":8,"stop":"cd"}`)
	if c := choice0(m); !slices.Equal(ids(c), []int{'a', 'b', 'c', 'd'}) || c["stop_reason"] != "cd" {
		t.Errorf("stop string: %v", c)
	}
	// Validation.
	for _, sp := range []string{`{"max_tokens":0}`, `{"max_tokens":2,"temperature":3}`, `{"max_tokens":2,"top_p":0}`, `{"max_tokens":2,"top_k":-2}`, `{"max_tokens":2,"logprobs":-2}`, `{"max_tokens":"x"}`} {
		if st, _, b := gen(`[97]`, sp); st != 400 {
			t.Errorf("%s: %d %s", sp, st, b)
		}
	}
	for _, body := range []string{`{"token_ids":[],"sampling_params":{}}`, `{"token_ids":[-1],"sampling_params":{}}`, `{"token_ids":[1]}`, `not json`} {
		if st, _, _ := generateResp(t, s, body); st != 400 {
			t.Errorf("%s: %d", body, st)
		}
	}
}

func TestGenerateEOSAndDefaults(t *testing.T) {
	_, s := serve(t, Options{Shape: ShapeDisagg, Script: func(Request) Output {
		return Output{IDs: append(Encode(strings.Repeat("x", 20)), EndOfText)}
	}})
	// Shape A: absent max_tokens is 16.
	_, m, _ := generateResp(t, s, `{"token_ids":[1],"sampling_params":{}}`)
	if c := choice0(m); len(ids(c)) != 16 || c["finish_reason"] != "length" || c["logprobs"] != nil {
		t.Errorf("default 16: %v", c)
	}
	_, s = serve(t, Options{Script: func(Request) Output { return Output{IDs: []int{'x', EndOfText, 'y'}} }})
	_, m, _ = generateResp(t, s, `{"token_ids":[1],"sampling_params":{"max_tokens":5}}`)
	if c := choice0(m); !slices.Equal(ids(c), []int{'x', EndOfText}) || c["stop_reason"] != float64(EndOfText) {
		t.Errorf("generation_config eos: %v", c)
	}
	_, m, _ = generateResp(t, s, `{"token_ids":[1],"sampling_params":{"max_tokens":5,"ignore_eos":true}}`)
	if c := choice0(m); len(ids(c)) != 3 || c["finish_reason"] != "length" {
		t.Errorf("ignore_eos: %v", c)
	}
	// Text output gets <|im_end|>; default logprobs finite and negative; -1 = full vocab.
	_, s = serve(t, Options{Script: Sequence("hi")})
	_, m, _ = generateResp(t, s, `{"token_ids":[1],"sampling_params":{"max_tokens":5,"logprobs":-1}}`)
	c := choice0(m)
	content := c["logprobs"].(map[string]any)["content"].([]any)
	if !slices.Equal(ids(c), []int{'h', 'i', IMEnd}) || len(content) != 3 {
		t.Fatalf("default: %v", c)
	}
	for i, e := range content {
		en := e.(map[string]any)
		lp := en["logprob"].(float64)
		if lp >= 0 || lp != DefaultLogprob(ids(c)[i], i) || len(en["top_logprobs"].([]any)) != VocabSize {
			t.Errorf("entry %d: %v", i, lp)
		}
	}
}

func TestGenerateRouteModes(t *testing.T) {
	_, s := serve(t, Options{Generate: GenerateDisabled})
	st, b := post(t, s, "/inference/v1/generate", genBody)
	expect(t, st, b, 404, `{"detail":"Not Found"}`)
	if _, b := call(t, s, "GET", "/openapi.json", ""); strings.Contains(b, "generate") {
		t.Errorf("openapi lists generate: %s", b)
	}
	// The fallback still works.
	st, b = post(t, s, "/v1/completions", `{"prompt":[104],"max_tokens":4}`)
	if st != 200 {
		t.Errorf("completions: %d %s", st, b)
	}
	_, s = serve(t, Options{Generate: GenerateUnsupported})
	st, b = post(t, s, "/inference/v1/generate", genBody)
	expect(t, st, b, 501, `{"error":{"message":"The model does not support generate tokens API","type":"NotImplementedError","param":null,"code":501}}`)
}

func TestCompletions(t *testing.T) {
	_, s := serve(t, Options{MaxModelLen: 32, Script: okScript})
	st, b := post(t, s, "/v1/completions", `{"model":"kiln-test-model","prompt":[104,105],"max_tokens":5,"logprobs":1,"return_token_ids":true}`)
	expect(t, st, b, 200, `{"id":"cmpl-00000000000000000000000000000001","object":"text_completion","created":1700000000,"model":"kiln-test-model","choices":[{"index":0,"text":"ok","logprobs":{"text_offset":[0,1,2],"token_logprobs":[-0.1,-0.2,-0.3],"tokens":["o","k","<|im_end|>"],"top_logprobs":[{"o":-0.1},{"k":-0.2},{"<|im_end|>":-0.3}]},"finish_reason":"stop","stop_reason":null,"token_ids":[111,107,258],"prompt_logprobs":null,"prompt_token_ids":[104,105]}],"usage":{"prompt_tokens":2,"total_tokens":5,"completion_tokens":3,"prompt_tokens_details":null},"kv_transfer_params":null}`)
	st, b = post(t, s, "/v1/completions", `{"prompt":[[104],[105]],"max_tokens":5,"logprobs":0,"return_tokens_as_token_ids":true}`)
	if st != 200 || !strings.Contains(b, `"tokens":["token_id:111","token_id:107","token_id:258"]`) || !strings.Contains(b, `"index":1`) || !strings.Contains(b, `{"token_id:111":-0.1}`) {
		t.Errorf("batch / token ids: %d %s", st, b)
	}
	st, b = post(t, s, "/v1/completions", `{"prompt":[104,105],"max_tokens":31}`)
	if st != 400 || !strings.Contains(b, "maximum context length is 32 tokens. However, you requested 33 tokens (2 in the messages, 31 in the completion)") {
		t.Errorf("context: %d %s", st, b)
	}
	if st, b := post(t, s, "/v1/completions", `{"prompt":[104],"max_tokens":5}`); st != 200 || !strings.Contains(b, `"logprobs":null`) {
		t.Errorf("no logprobs: %d %s", st, b)
	}
}

func TestFaults(t *testing.T) {
	e, s := serve(t, Options{Script: okScript, Fault: func(r Request) Fault {
		if r.SessionID == "bad" {
			return FaultMissingLogprobs
		}
		return NoFault
	}})
	gen := func(hdr ...string) (int, map[string]any, string) { return generateResp(t, s, genBody, hdr...) }
	if _, m, _ := gen("x-session-id", "bad"); choice0(m)["logprobs"] != nil {
		t.Error("Options.Fault not applied")
	}
	e.InjectFault(FaultNaNLogprob)
	if st, _, b := gen(); st != 200 || !strings.Contains(b, `{"token_id":111,"logprob":NaN,`) {
		t.Errorf("NaN: %s", b)
	}
	lens := func(m map[string]any) (int, int) {
		c := choice0(m)
		return len(ids(c)), len(c["logprobs"].(map[string]any)["content"].([]any))
	}
	e.InjectFault(FaultFewerLogprobs, FaultExtraLogprob)
	if _, m, _ := gen(); func() bool { a, b := lens(m); return a != 3 || b != 2 }() {
		t.Error("fewer")
	}
	if _, m, _ := gen(); func() bool { a, b := lens(m); return a != 3 || b != 4 }() {
		t.Error("extra")
	}
	e.InjectFault(FaultMismatchedTokenID, FaultUsageMismatch, FaultMissingTokenIDs)
	if _, _, b := gen(); !strings.Contains(b, `"content":[{"token_id":112,`) || !strings.Contains(b, `"token_ids":[111,107,258]`) {
		t.Errorf("mismatch: %s", b)
	}
	if _, m, _ := gen(); m["usage"].(map[string]any)["completion_tokens"] != float64(4) {
		t.Error("usage mismatch")
	}
	if _, m, _ := gen(); choice0(m)["token_ids"] != nil {
		t.Error("missing token_ids")
	}
	e.InjectFault(FaultServerError, FaultDetailError)
	st, b := post(t, s, "/inference/v1/generate", genBody)
	expect(t, st, b, 500, `{"error":{"message":"boom","type":"InternalServerError","param":null,"code":500}}`)
	st, b = post(t, s, "/inference/v1/generate", genBody)
	expect(t, st, b, 500, `{"detail":"boom"}`)
	e.InjectFault(FaultDropConnection)
	if _, err := s.Client().Post(s.URL+"/inference/v1/generate", "application/json", strings.NewReader(genBody)); err == nil {
		t.Error("dropped connection gave a response")
	}
	// Script errors become 500.
	_, s2 := serve(t, Options{Script: Sequence()})
	if st, _ := post(t, s2, "/inference/v1/generate", genBody); st != 500 {
		t.Errorf("exhausted script: %d", st)
	}
	// The dropped request is logged when its handler returns, which may be
	// after the client saw the connection close.
	got := e.RequestsTo("/inference/v1/generate")
	for deadline := time.Now().Add(2 * time.Second); len(got) < 10 && time.Now().Before(deadline); {
		time.Sleep(time.Millisecond)
		got = e.RequestsTo("/inference/v1/generate")
	}
	if len(got) != 10 || got[1].Fault != FaultNaNLogprob || got[9].Status != 0 {
		t.Errorf("log: %d entries, %+v", len(got), got[len(got)-1])
	}
}

func TestSessionsAndLog(t *testing.T) {
	var mu sync.Mutex
	var seen []Request
	e, s := serve(t, Options{EnablePromptTokensDetails: true, Script: func(r Request) Output {
		mu.Lock()
		seen = append(seen, r)
		mu.Unlock()
		return Sequence("one", "two")(r)
	}})
	long := Encode(strings.Repeat("p", 40))
	body := func(p []int) string {
		b, _ := json.Marshal(map[string]any{"token_ids": p, "sampling_params": map[string]any{"max_tokens": 10, "logprobs": 1}})
		return string(b)
	}
	_, m, _ := generateResp(t, s, body(long), "x-session-id", "s1")
	first := append(slices.Clone(long), ids(choice0(m))...)
	_, m, _ = generateResp(t, s, body(append(slices.Clone(first), 'n')), "x-session-id", "s1")
	if !slices.Equal(ids(choice0(m)), Encode("two<|im_end|>")) {
		t.Errorf("turn 2 output %v", ids(choice0(m)))
	}
	if got := m["usage"].(map[string]any)["prompt_tokens_details"].(map[string]any)["cached_tokens"]; got != float64(32) {
		t.Errorf("cached_tokens = %v", got)
	}
	generateResp(t, s, body(long), "x-session-id", "s2")
	if len(seen) != 3 || seen[1].Turn != 1 || seen[2].Turn != 0 || seen[2].SessionID != "s2" || seen[0].PromptText != strings.Repeat("p", 40) || seen[0].Params.MaxTokens != 10 {
		t.Errorf("script requests: %+v", seen)
	}
	log := e.Requests()
	if len(log) != 3 || log[1].SessionID != "s1" || log[1].Turn != 1 || log[1].CachedTokens != 32 || !bytes.Equal(log[0].Body, []byte(body(long))) || log[2].Header.Get("x-session-id") != "s2" {
		t.Errorf("log: %+v", log)
	}
	st := e.Stats()["/inference/v1/generate"]
	if st.Calls != 3 || st.RequestBytes == 0 || st.ResponseBytes == 0 {
		t.Errorf("stats: %+v", st)
	}
	e.Reset()
	if len(e.Requests()) != 0 || len(e.Stats()) != 0 {
		t.Error("reset")
	}
}

func TestLatencyAbort(t *testing.T) {
	e, s := serve(t, Options{Latency: time.Second})
	ctx, cancel := context.WithTimeout(context.Background(), 50*time.Millisecond)
	defer cancel()
	req, _ := http.NewRequestWithContext(ctx, http.MethodPost, s.URL+"/inference/v1/generate", strings.NewReader(genBody))
	if _, err := s.Client().Do(req); err == nil {
		t.Fatal("expected timeout")
	}
	deadline := time.Now().Add(time.Second)
	for e.Aborted() == 0 && time.Now().Before(deadline) {
		time.Sleep(5 * time.Millisecond)
	}
	if e.Aborted() != 1 {
		t.Errorf("aborted = %d", e.Aborted())
	}
}

func TestConcurrency(t *testing.T) {
	e, s := serve(t, Options{Script: SeededRandom(7)})
	const sessions, turns = 8, 6
	outs := make([][]string, sessions)
	var wg sync.WaitGroup
	for i := range sessions {
		wg.Add(1)
		go func() {
			defer wg.Done()
			for range turns {
				_, m, b := generateResp(t, s, `{"token_ids":[1,2],"sampling_params":{"max_tokens":64,"logprobs":1}}`, "x-session-id", fmt.Sprint("s", i))
				if m == nil {
					t.Errorf("bad response %s", b)
					return
				}
				outs[i] = append(outs[i], fmt.Sprint(ids(choice0(m))))
				post(t, s, "/tokenize", `{"prompt":"x"}`)
			}
		}()
	}
	wg.Wait()
	if n := len(e.Requests()); n != 2*sessions*turns {
		t.Errorf("log has %d requests", n)
	}
	// SeededRandom depends only on (seed, session, turn): replay serially.
	_, s2 := serve(t, Options{Script: SeededRandom(7)})
	for i := range sessions {
		for j := range turns {
			_, m, _ := generateResp(t, s2, `{"token_ids":[1,2],"sampling_params":{"max_tokens":64}}`, "x-session-id", fmt.Sprint("s", i))
			if got := fmt.Sprint(ids(choice0(m))); got != outs[i][j] {
				t.Errorf("session %d turn %d: %s vs %s", i, j, got, outs[i][j])
			}
		}
	}
}
