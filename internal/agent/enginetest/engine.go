package enginetest

import (
	"bytes"
	"encoding/json"
	"fmt"
	"io"
	"net/http"
	"sort"
	"strconv"
	"strings"
	"sync"
	"time"

	"github.com/kilnrl/kiln/internal/ojson"
)

// ResponseShape selects which documented non-streaming response of
// POST /inference/v1/generate the engine emits (docs/engine-wire.md §5.4).
type ResponseShape int

const (
	// ShapeTokenIDs is shape (C), the newest: integer token_id and rank in
	// logprobs, top-level output_mode, usage, prompt_token_ids, ....
	ShapeTokenIDs ResponseShape = iota
	// ShapeScaleOut is shape (B), scale_out before PR #58181: "token_id:N"
	// strings in logprobs, top-level model, created, usage.
	ShapeScaleOut
	// ShapeDisagg is shape (A), serve/disagg v0.14–v0.18: "token_id:N"
	// strings, no usage/model/created, a random request_id, and the bug that
	// every top_logprobs entry repeats the sampled id's string.
	ShapeDisagg
)

// GenerateRoute says how POST /inference/v1/generate answers.
type GenerateRoute int

const (
	GenerateEnabled     GenerateRoute = iota
	GenerateDisabled                  // not registered: plain 404 {"detail":"Not Found"} (docs/engine-wire.md §5.1)
	GenerateUnsupported               // registered, model lacks the generate task: 501 envelope (docs/engine-wire.md §5.5)
)

// Options configure an Engine. The zero value is a usable engine.
type Options struct {
	ModelName   string // served model name; default "kiln-test-model"
	ModelRoot   string // /v1/models root (e.g. a WriteTokenizerFiles dir); default ModelName
	MaxModelLen int    // context limit; default 4096
	// Version is GET /version's answer; default "0.32.0" for ShapeTokenIDs,
	// "0.28.0" for ShapeScaleOut, "0.14.0" for ShapeDisagg.
	Version  string
	Shape    ResponseShape
	Generate GenerateRoute
	Template ChatTemplate // chat form of /tokenize
	Script   Script       // default SeededRandom(1)
	// Latency delays every generation response (client disconnects abort).
	Latency time.Duration
	// Fault, when set, is asked per generation request (after InjectFault's
	// queue is empty) which fault to inject.
	Fault func(Request) Fault
	// APIKey enables --api-key: /v1, /v2, /inference paths need
	// "Authorization: Bearer <key>", else 401 {"error":"Unauthorized"}.
	APIKey string
	// EnableTokenizerInfo registers GET /tokenizer_info (docs/engine-wire.md §4).
	EnableTokenizerInfo bool
	// EnablePromptTokensDetails adds usage.prompt_tokens_details.cached_tokens
	// (--enable-prompt-tokens-details): the longest prefix shared with an
	// earlier prompt+output of the same session, in whole 16-token blocks,
	// at most len(prompt)-1.
	EnablePromptTokensDetails bool
	// Created is the "created" timestamp reported; default 1700000000.
	Created int64
	// WeightVersion, when set, is the weights version the engine serves,
	// reported as kiln's serve.py reports it (docs/serve.md §6): GET
	// /v1/models data[0].weight_version, and in shape (C) generate replies
	// choices[0].weight_versions, one entry per output token (unless the
	// Script's Output.WeightVersions says otherwise). Unset, neither is
	// reported (the null weight_versions of upstream vLLM).
	WeightVersion *int64
}

// Fault is a corruption of one generation response, for client validation
// tests (docs/adapter.md §2.4, §8 row 5).
type Fault int

const (
	NoFault                Fault = iota
	FaultMissingLogprobs         // choices[0].logprobs: null
	FaultNaNLogprob              // the first logprob is the literal NaN
	FaultFewerLogprobs           // the last logprobs.content entry is dropped
	FaultExtraLogprob            // one logprobs.content entry too many
	FaultMismatchedTokenID       // logprobs.content[0] names another id than token_ids[0]
	FaultUsageMismatch           // usage.completion_tokens is one more than len(token_ids)
	FaultMissingTokenIDs         // choices[0].token_ids omitted
	FaultServerError             // 500 {"error":{"message":"boom",...}}
	FaultDetailError             // 500 {"detail":"boom"} (FastAPI HTTPException shape)
	FaultDropConnection          // the connection is closed without a response
)

// LoggedRequest is one request as the engine saw it.
type LoggedRequest struct {
	Seq       int // arrival order, from 0
	Method    string
	Path      string
	SessionID string // x-session-id
	Header    http.Header
	Body      []byte
	// Status is the response status; 0 when the connection was dropped or
	// the client went away first.
	Status        int
	ResponseBytes int
	// Turn and CachedTokens are set for generation requests (Turn of the
	// first prompt for a batched completion).
	Turn         int
	CachedTokens int
	Fault        Fault
}

// EndpointStats counts traffic of one path.
type EndpointStats struct {
	Calls         int
	RequestBytes  int64
	ResponseBytes int64
}

// Engine is the scripted test engine; it is an http.Handler.
type Engine struct {
	opts Options

	mu       sync.Mutex
	seq      int
	log      []LoggedRequest
	stats    map[string]EndpointStats
	turns    map[string]int
	faults   []Fault
	history  map[string][][]int // per session: prompt+output sequences (kept for EnablePromptTokensDetails only)
	healthy  bool
	inflight int
	aborted  int
	ids      int // response ids handed out
}

// New returns an engine; serve it with httptest.NewServer(New(opts)).
func New(opts Options) *Engine {
	if opts.ModelName == "" {
		opts.ModelName = "kiln-test-model"
	}
	if opts.ModelRoot == "" {
		opts.ModelRoot = opts.ModelName
	}
	if opts.MaxModelLen <= 0 {
		opts.MaxModelLen = 4096
	}
	if opts.Version == "" {
		opts.Version = map[ResponseShape]string{ShapeTokenIDs: "0.32.0", ShapeScaleOut: "0.28.0", ShapeDisagg: "0.14.0"}[opts.Shape]
	}
	if opts.Script == nil {
		opts.Script = SeededRandom(1)
	}
	if opts.Created == 0 {
		opts.Created = 1700000000
	}
	return &Engine{
		opts:    opts,
		stats:   map[string]EndpointStats{},
		turns:   map[string]int{},
		history: map[string][][]int{},
		healthy: true,
	}
}

// Options returns the effective options (defaults filled in).
func (e *Engine) Options() Options { return e.opts }

// InjectFault queues faults; each generation request takes the next one.
func (e *Engine) InjectFault(faults ...Fault) {
	e.mu.Lock()
	e.faults = append(e.faults, faults...)
	e.mu.Unlock()
}

// SetHealthy makes GET /health answer 200 (true) or 503 (false).
func (e *Engine) SetHealthy(ok bool) {
	e.mu.Lock()
	e.healthy = ok
	e.mu.Unlock()
}

// Requests returns a copy of the request log in arrival order.
func (e *Engine) Requests() []LoggedRequest {
	e.mu.Lock()
	out := append([]LoggedRequest(nil), e.log...)
	e.mu.Unlock()
	sort.Slice(out, func(i, j int) bool { return out[i].Seq < out[j].Seq })
	return out
}

// RequestsTo returns the logged requests for one path, in arrival order.
func (e *Engine) RequestsTo(path string) []LoggedRequest {
	var out []LoggedRequest
	for _, r := range e.Requests() {
		if r.Path == path {
			out = append(out, r)
		}
	}
	return out
}

// Stats returns per-path counters.
func (e *Engine) Stats() map[string]EndpointStats {
	e.mu.Lock()
	defer e.mu.Unlock()
	out := make(map[string]EndpointStats, len(e.stats))
	for k, v := range e.stats {
		out[k] = v
	}
	return out
}

// Aborted counts generation requests whose client went away before the
// answer (cancellation by closing the connection, docs/engine-wire.md §5.5).
func (e *Engine) Aborted() int {
	e.mu.Lock()
	defer e.mu.Unlock()
	return e.aborted
}

// Reset clears the log, counters, session turn numbers, prefix history and
// queued faults.
func (e *Engine) Reset() {
	e.mu.Lock()
	e.log, e.stats, e.turns, e.history, e.faults = nil, map[string]EndpointStats{}, map[string]int{}, map[string][][]int{}, nil
	e.aborted = 0
	e.mu.Unlock()
}

// reqInfo carries per-request details from a handler to the log.
type reqInfo struct {
	turn, cached int
	fault        Fault
}

type countingWriter struct {
	http.ResponseWriter
	status int
	n      int
}

func (w *countingWriter) WriteHeader(code int) {
	if w.status == 0 {
		w.status = code
	}
	w.ResponseWriter.WriteHeader(code)
}

func (w *countingWriter) Write(p []byte) (int, error) {
	if w.status == 0 {
		w.status = http.StatusOK
	}
	n, err := w.ResponseWriter.Write(p)
	w.n += n
	return n, err
}

// ServeHTTP implements http.Handler.
func (e *Engine) ServeHTTP(w http.ResponseWriter, r *http.Request) {
	body, _ := io.ReadAll(r.Body)
	e.mu.Lock()
	seq := e.seq
	e.seq++
	e.mu.Unlock()

	cw := &countingWriter{ResponseWriter: w}
	info := &reqInfo{}
	e.route(cw, r, body, info)

	e.mu.Lock()
	st := e.stats[r.URL.Path]
	st.Calls++
	st.RequestBytes += int64(len(body))
	st.ResponseBytes += int64(cw.n)
	e.stats[r.URL.Path] = st
	e.log = append(e.log, LoggedRequest{
		Seq: seq, Method: r.Method, Path: r.URL.Path,
		SessionID: r.Header.Get("x-session-id"), Header: r.Header.Clone(), Body: body,
		Status: cw.status, ResponseBytes: cw.n,
		Turn: info.turn, CachedTokens: info.cached, Fault: info.fault,
	})
	e.mu.Unlock()
}

func (e *Engine) route(w *countingWriter, r *http.Request, body []byte, info *reqInfo) {
	p := r.URL.Path
	if e.opts.APIKey != "" && (strings.HasPrefix(p, "/v1") || strings.HasPrefix(p, "/v2") || strings.HasPrefix(p, "/inference")) {
		if r.Header.Get("Authorization") != "Bearer "+e.opts.APIKey {
			writeRaw(w, http.StatusUnauthorized, []byte(`{"error":"Unauthorized"}`))
			return
		}
	}
	// A switch, not a map of handlers built per request: the engine's own
	// overhead is taken from the benchmarks it stands in for a GPU
	// server in (docs/rollout.md §6.2).
	method := http.MethodPost
	var h func()
	switch p {
	case "/tokenize":
		h = func() { e.handleTokenize(w, body) }
	case "/detokenize":
		h = func() { e.handleDetokenize(w, body) }
	case "/v1/completions":
		h = func() { e.handleCompletions(w, r, body, info) }
	case "/v1/models":
		method, h = http.MethodGet, func() { e.handleModels(w) }
	case "/health":
		method, h = http.MethodGet, func() { e.handleHealth(w) }
	case "/version":
		method, h = http.MethodGet, func() { writeJSONResponse(w, 200, ojson.Obj("version", e.opts.Version)) }
	case "/load":
		method, h = http.MethodGet, func() {
			e.mu.Lock()
			n := e.inflight
			e.mu.Unlock()
			writeJSONResponse(w, 200, ojson.Obj("server_load", n))
		}
	case "/openapi.json":
		method, h = http.MethodGet, func() { e.handleOpenAPI(w) }
	case "/inference/v1/generate":
		if e.opts.Generate != GenerateDisabled {
			h = func() { e.handleGenerate(w, r, body, info) }
		}
	case "/tokenizer_info":
		if e.opts.EnableTokenizerInfo {
			method, h = http.MethodGet, func() { e.handleTokenizerInfo(w) }
		}
	}
	if h == nil {
		writeRaw(w, http.StatusNotFound, []byte(`{"detail":"Not Found"}`))
		return
	}
	if r.Method != method {
		writeRaw(w, http.StatusMethodNotAllowed, []byte(`{"detail":"Method Not Allowed"}`))
		return
	}
	h()
}

func (e *Engine) routePaths() []string {
	ps := []string{"/detokenize", "/health", "/load", "/openapi.json", "/tokenize", "/v1/completions", "/v1/models", "/version"}
	if e.opts.Generate != GenerateDisabled {
		ps = append(ps, "/inference/v1/generate")
	}
	if e.opts.EnableTokenizerInfo {
		ps = append(ps, "/tokenizer_info")
	}
	sort.Strings(ps)
	return ps
}

// apiError is vLLM's OpenAI-style error envelope (docs/engine-wire.md §1).
type apiError struct {
	status  int
	typ     string
	message string
	param   any
}

func badRequest(format string, a ...any) *apiError {
	return &apiError{status: 400, typ: "BadRequestError", message: fmt.Sprintf(format, a...)}
}

func schemaError(param, format string, a ...any) *apiError {
	return &apiError{status: 400, typ: "Bad Request", message: fmt.Sprintf(format, a...), param: param}
}

func writeError(w http.ResponseWriter, err *apiError) {
	writeJSONResponse(w, err.status, ojson.Obj("error", ojson.Obj("message", err.message, "type", err.typ, "param", err.param, "code", err.status)))
}

func writeJSONResponse(w http.ResponseWriter, status int, v any) {
	writeRaw(w, status, ojson.Marshal(v))
}

func writeRaw(w http.ResponseWriter, status int, body []byte) {
	w.Header().Set("Content-Type", "application/json")
	w.Header().Set("Content-Length", strconv.Itoa(len(body)))
	w.WriteHeader(status)
	_, _ = w.Write(body)
}

// decodeBody decodes a JSON object body into raw fields (the last of
// duplicate keys wins). Like json.Decoder, it reads the first value only
// and ignores what follows it.
func decodeBody(body []byte) (map[string]json.RawMessage, *apiError) {
	var m map[string]json.RawMessage
	if json.NewDecoder(bytes.NewReader(body)).Decode(&m) != nil || m == nil {
		return nil, bodyError()
	}
	return m, nil
}

func bodyError() *apiError {
	return schemaError("body", "1 validation error:\n  body: Input should be a valid JSON object")
}

// intList reads raw as a JSON list of integers (null elements read as 0);
// ok is false for anything else, null included.
func intList(raw json.RawMessage) (ids []int, ok bool) {
	return ids, len(raw) > 0 && json.Unmarshal(raw, &ids) == nil && ids != nil
}

// readRequest decodes a request body and checks its model, writing the
// error reply when either fails (ok false).
func (e *Engine) readRequest(w http.ResponseWriter, body []byte) (m map[string]json.RawMessage, ok bool) {
	m, aerr := decodeBody(body)
	if aerr == nil {
		aerr = e.checkModel(m)
	}
	if aerr != nil {
		writeError(w, aerr)
		return nil, false
	}
	return m, true
}

// idsError is the reply to a list of token ids given as field that holds a
// negative id or one outside the vocabulary, or nil.
func idsError(field string, ids []int) *apiError {
	bad, ok := ValidIDs(ids)
	switch {
	case ok:
		return nil
	case bad < 0:
		return schemaError(field, "%s: Input should be greater than or equal to 0", field)
	}
	return badRequest("Token id %d is out of vocabulary", bad)
}

// checkModel enforces the optional model field (docs/engine-wire.md §1: unknown model → 404).
func (e *Engine) checkModel(m map[string]json.RawMessage) *apiError {
	raw, ok := m["model"]
	if !ok || string(raw) == "null" {
		return nil
	}
	var name string
	if err := json.Unmarshal(raw, &name); err != nil {
		return schemaError("model", "model: Input should be a valid string")
	}
	if name != e.opts.ModelName {
		return &apiError{status: 404, typ: "NotFoundError", message: fmt.Sprintf("The model `%s` does not exist.", name)}
	}
	return nil
}

func (e *Engine) handleHealth(w http.ResponseWriter) {
	e.mu.Lock()
	ok := e.healthy
	e.mu.Unlock()
	if ok {
		w.WriteHeader(http.StatusOK)
		return
	}
	w.WriteHeader(http.StatusServiceUnavailable)
}

func (e *Engine) handleModels(w http.ResponseWriter) {
	card := ojson.Obj(
		"id", e.opts.ModelName, "object", "model", "created", e.opts.Created, "owned_by", "vllm",
		"root", e.opts.ModelRoot, "parent", nil, "max_model_len", e.opts.MaxModelLen,
		"permission", []any{ojson.Obj(
			"id", "modelperm-enginetest", "object", "model_permission", "created", e.opts.Created,
			"allow_create_engine", false, "allow_sampling", true, "allow_logprobs", true,
			"allow_search_indices", false, "allow_view", true, "allow_fine_tuning", false,
			"organization", "*", "group", nil, "is_blocking", false)},
	)
	if v := e.opts.WeightVersion; v != nil {
		card.Set("weight_version", *v)
	}
	writeJSONResponse(w, 200, ojson.Obj("object", "list", "data", []any{card}))
}

func (e *Engine) handleOpenAPI(w http.ResponseWriter) {
	paths := &ojson.Object{}
	for _, p := range e.routePaths() {
		m := "post"
		switch p {
		case "/health", "/load", "/openapi.json", "/v1/models", "/version", "/tokenizer_info":
			m = "get"
		}
		paths.Set(p, ojson.Obj(m, ojson.Obj()))
	}
	writeJSONResponse(w, 200, ojson.Obj("openapi", "3.1.0", "info", ojson.Obj("title", "enginetest", "version", e.opts.Version), "paths", paths))
}

func (e *Engine) handleTokenizerInfo(w http.ResponseWriter) {
	dec := &ojson.Object{}
	for _, t := range addedTokens {
		dec.Set(fmt.Sprint(t.ID), t.Content)
	}
	writeJSONResponse(w, 200, ojson.Obj(
		"tokenizer_class", "Qwen2Tokenizer",
		"add_bos_token", false, "add_prefix_space", false,
		"added_tokens_decoder", dec,
		"additional_special_tokens", []string{"<|im_start|>", "<|im_end|>"},
		"bos_token", nil, "clean_up_tokenization_spaces", false,
		"eos_token", "<|im_end|>", "errors", "replace",
		"model_max_length", e.opts.MaxModelLen, "pad_token", "<|endoftext|>",
		"split_special_tokens", false, "unk_token", nil,
	))
}
