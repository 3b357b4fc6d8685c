package rollout

import (
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"log/slog"
	"net"
	"net/http"
	"net/http/httputil"
	"net/url"
	"strings"
	"sync"
	"time"

	"github.com/kilnrl/kiln/formats/records"
)

// replayEngine is the engine of a replay (docs/rollout.md §7): an HTTP
// handler on a loopback listener the stage owns, speaking the vLLM wire
// the engine client speaks (docs/engine-wire.md). It answers generation
// (POST /inference/v1/generate, and POST /v1/completions for --mode
// completions) from the recorded turns, by the session the request names
// in x-session-id and the number of calls that session made before; it
// forwards rendering and detokenizing (POST /tokenize, /detokenize) and
// every GET (/health, /version, /v1/models) to the renderer engine, which
// needs only the recorded checkpoint's tokenizer and chat template. No
// generation is ever forwarded: the renderer never samples.
type replayEngine struct {
	book     *replayBook
	ref      string // the replayed turns version, for messages
	renderer *httputil.ReverseProxy
	log      *slog.Logger

	mu       sync.Mutex
	sessions map[string]*replaySession
	// What the finished sessions did (drop): every recorded turn answered,
	// a call the recording could not answer, or fewer calls than recorded.
	matched, mismatched, short int

	ln net.Listener
	hs *http.Server
}

// replaySession is one stage session being replayed.
type replaySession struct {
	rolloutID int64
	calls     int   // generation calls answered from the recording
	failure   error // the first call the recording could not answer
}

// replayGenerateRoute and replayCompletionsRoute are the generation routes
// the engine client uses (docs/engine-wire.md §5, §6).
const (
	replayGenerateRoute    = "/inference/v1/generate"
	replayCompletionsRoute = "/v1/completions"
)

// newReplayEngine serves book, forwarding rendering to the engine at
// rendererURL.
func newReplayEngine(book *replayBook, ref, rendererURL string, log *slog.Logger) (*replayEngine, error) {
	u, err := url.Parse(rendererURL)
	if err != nil || (u.Scheme != "http" && u.Scheme != "https") || u.Host == "" {
		return nil, fmt.Errorf("--replay-renderer %q: want the base URL of an engine with the recorded checkpoint's tokenizer and chat template, e.g. http://127.0.0.1:8000", rendererURL)
	}
	e := &replayEngine{book: book, ref: ref, log: log, sessions: map[string]*replaySession{}}
	e.renderer = &httputil.ReverseProxy{
		Rewrite: func(r *httputil.ProxyRequest) {
			r.SetURL(u)
			r.Out.Host = u.Host
		},
		ErrorHandler: func(w http.ResponseWriter, r *http.Request, err error) {
			writeReplayError(w, http.StatusBadGateway, "BadGateway", fmt.Sprintf("replay: the renderer %s did not answer %s %s: %v", rendererURL, r.Method, r.URL.Path, err))
		},
	}
	return e, nil
}

// start serves the engine on an ephemeral loopback port and returns its
// base URL.
func (e *replayEngine) start() (string, error) {
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		return "", fmt.Errorf("replay engine listener: %w", err)
	}
	e.ln = ln
	e.hs = &http.Server{Handler: e, ReadHeaderTimeout: 30 * time.Second,
		ErrorLog: slog.NewLogLogger(e.log.Handler(), slog.LevelWarn)}
	go func() { _ = e.hs.Serve(ln) }()
	return "http://" + ln.Addr().String(), nil
}

// close stops the listener (nil-safe).
func (e *replayEngine) close() {
	if e != nil && e.hs != nil {
		_ = e.hs.Close()
	}
}

// open maps the stage session sid (the x-session-id the engine client
// sends) to the rollout whose recording answers it. It must be called
// before the session's first request (nil-safe: no replay).
func (e *replayEngine) open(sid string, rolloutID int64) {
	if e == nil {
		return
	}
	e.mu.Lock()
	defer e.mu.Unlock()
	e.sessions[sid] = &replaySession{rolloutID: rolloutID}
}

// failure is the first call of session sid the recording could not
// answer, "" when none (nil-safe).
func (e *replayEngine) failure(sid string) string {
	if e == nil {
		return ""
	}
	e.mu.Lock()
	defer e.mu.Unlock()
	if s := e.sessions[sid]; s != nil && s.failure != nil {
		return s.failure.Error()
	}
	return ""
}

// drop forgets session sid, counting how its run matched the recording
// (nil-safe).
func (e *replayEngine) drop(sid string) {
	if e == nil {
		return
	}
	e.mu.Lock()
	defer e.mu.Unlock()
	if s := e.sessions[sid]; s != nil {
		switch {
		case s.failure != nil:
			e.mismatched++
		case s.calls == len(e.book.runs[s.rolloutID]):
			e.matched++
		default:
			e.short++
		}
	}
	delete(e.sessions, sid)
}

// summary is the replay's end-of-run line, "" without a replay
// (nil-safe): "replay: N of M runs matched" the recording, every recorded
// turn answered, and what the others did.
func (e *replayEngine) summary() string {
	if e == nil {
		return ""
	}
	e.mu.Lock()
	defer e.mu.Unlock()
	line := fmt.Sprintf("replay: %d of %d runs matched %s (every recorded turn answered)", e.matched, e.matched+e.mismatched+e.short, e.ref)
	if e.mismatched+e.short > 0 {
		line += fmt.Sprintf("; %d mismatched (a prompt the recording does not hold), %d made fewer calls than recorded", e.mismatched, e.short)
	}
	return line
}

func (e *replayEngine) ServeHTTP(w http.ResponseWriter, r *http.Request) {
	switch {
	case r.Method == http.MethodPost && r.URL.Path == replayGenerateRoute:
		e.serveGeneration(w, r, false)
	case r.Method == http.MethodPost && r.URL.Path == replayCompletionsRoute:
		e.serveGeneration(w, r, true)
	case r.Method == http.MethodGet || r.Method == http.MethodHead,
		r.Method == http.MethodPost && (r.URL.Path == "/tokenize" || r.URL.Path == "/detokenize"):
		e.renderer.ServeHTTP(w, r)
	default:
		// Chat completions, responses and the rest would sample on the
		// renderer: a replay never forwards them.
		_, _ = io.Copy(io.Discard, io.LimitReader(r.Body, 1<<20))
		writeReplayError(w, http.StatusNotFound, "NotFoundError", fmt.Sprintf(
			"replay: %s %s is not served: a replay answers %s and %s from the recording and forwards only GET, /tokenize and /detokenize to the renderer",
			r.Method, r.URL.Path, replayGenerateRoute, replayCompletionsRoute))
	}
}

// replayRequest is what the replay reads of a generation request: the
// prompt, and the sampling fields a recorded turn must satisfy (its output
// within max_tokens) or cannot (top logprobs, routed experts; the mask
// only when recorded). The generate route nests sampling under
// sampling_params; the completions route puts it at the top level.
type replayRequest struct {
	TokenIDs       []int32         `json:"token_ids"`
	Prompt         json.RawMessage `json:"prompt"`
	SamplingParams *replaySampling `json:"sampling_params"`
	replaySampling                 // the completions route's
}

type replaySampling struct {
	MaxTokens                int  `json:"max_tokens"`
	Logprobs                 *int `json:"logprobs"`
	ReturnSamplingMask       bool `json:"return_sampling_mask"`
	RoutedExpertsPromptStart *int `json:"routed_experts_prompt_start"`
}

// serveGeneration answers one generation from the recording.
func (e *replayEngine) serveGeneration(w http.ResponseWriter, r *http.Request, completions bool) {
	body, err := io.ReadAll(io.LimitReader(r.Body, 256<<20))
	if err != nil {
		writeReplayError(w, http.StatusBadRequest, "BadRequestError", fmt.Sprintf("replay: reading the request: %v", err))
		return
	}
	var req replayRequest
	if err := json.Unmarshal(body, &req); err != nil {
		writeReplayError(w, http.StatusBadRequest, "BadRequestError", fmt.Sprintf("replay: the request is not a %s body: %v", r.URL.Path, err))
		return
	}
	prompt, sp := req.TokenIDs, req.SamplingParams
	if completions {
		sp = &req.replaySampling
		if err := json.Unmarshal(req.Prompt, &prompt); err != nil {
			writeReplayError(w, http.StatusBadRequest, "BadRequestError", "replay: /v1/completions needs a prompt of token ids (the engine client's fallback), not text")
			return
		}
	}
	if len(prompt) == 0 || sp == nil {
		writeReplayError(w, http.StatusBadRequest, "BadRequestError", "replay: the request has no prompt token ids or no sampling parameters")
		return
	}
	sid := r.Header.Get("x-session-id")
	if sid == "" {
		// The engine client's probe (docs/engine-wire.md §10.1): a greedy
		// one-token generation from prompt [0], sent without a session.
		// It is answered here, so that the renderer never generates.
		if len(prompt) == 1 && prompt[0] == 0 && sp.MaxTokens == 1 {
			writeReplayTurn(w, completions, &records.Turn{OutputIDs: []int32{0}, OutputLogProbs: []float32{0}, FinishReason: "length"}, len(prompt), false)
			return
		}
		writeReplayError(w, http.StatusBadRequest, "BadRequestError", "replay: a generation without x-session-id: a replay answers only the sessions of the stage that runs it")
		return
	}
	t, err := e.next(sid, prompt, sp)
	if err != nil {
		writeReplayError(w, http.StatusBadRequest, "ReplayMismatch", err.Error())
		return
	}
	writeReplayTurn(w, completions, t, len(prompt), sp.ReturnSamplingMask)
}

// errUnknownSession answers a session the stage did not open.
var errUnknownSession = errors.New("replay: unknown session")

// next is the recorded turn answering session sid's next call, or why
// there is none. The first failure of a session is kept (failure) and
// answers every later call of it: the run is a mismatch from then on.
func (e *replayEngine) next(sid string, prompt []int32, sp *replaySampling) (*records.Turn, error) {
	e.mu.Lock()
	defer e.mu.Unlock()
	s := e.sessions[sid]
	if s == nil {
		return nil, fmt.Errorf("%w %q: the stage opened no such session (x-session-id)", errUnknownSession, sid)
	}
	if s.failure != nil {
		return nil, s.failure
	}
	fail := func(err error) (*records.Turn, error) {
		s.failure = err
		e.log.Warn("replay mismatch", "replay", e.ref, "rollout", s.rolloutID, "turn", s.calls, "err", err)
		return nil, err
	}
	t, err := e.book.next(s.rolloutID, s.calls, prompt)
	if err != nil {
		return fail(err)
	}
	at := fmt.Sprintf("replay: rollout %d turn %d", s.rolloutID, s.calls)
	switch {
	case len(t.OutputLogProbs) != len(t.OutputIDs):
		return fail(fmt.Errorf("%s: the recording has %d logprobs for %d output ids: replay a turns version kiln-rollout run or kiln-rollout adapter recorded", at, len(t.OutputLogProbs), len(t.OutputIDs)))
	case sp.MaxTokens > 0 && len(t.OutputIDs) > sp.MaxTokens:
		return fail(fmt.Errorf("%s: max_tokens %d is below the recorded output's %d tokens: replay with the recorded run's --max-tokens and --max-context-tokens", at, sp.MaxTokens, len(t.OutputIDs)))
	case sp.ReturnSamplingMask && len(t.TopPTokenOffsets) != len(t.OutputIDs)+1:
		return fail(fmt.Errorf("%s: the call asks for the top-p sampling mask, which the recording does not hold: replay with the recorded run's --top-p", at))
	case sp.RoutedExpertsPromptStart != nil:
		return fail(fmt.Errorf("%s: the call asks for routed experts, which a replay does not serve", at))
	case sp.Logprobs != nil && *sp.Logprobs > 1:
		return fail(fmt.Errorf("%s: the call asks for %d top logprobs per token, which a replay does not serve (only the sampled token's)", at, *sp.Logprobs))
	}
	s.calls++
	return t, nil
}

// writeReplayTurn writes t as the engine would have answered it: shape C
// of docs/engine-wire.md §5.4 on the generate route (integer token ids,
// usage), the legacy completions logprobs on the fallback (§6). The
// logprobs are written as the float64 of the recorded float32, so the
// client reads back the same float32.
func writeReplayTurn(w http.ResponseWriter, completions bool, t *records.Turn, promptLen int, mask bool) {
	n := len(t.OutputIDs)
	usage := map[string]int{"prompt_tokens": promptLen, "completion_tokens": n, "total_tokens": promptLen + n}
	var choice map[string]any
	if completions {
		labels := make([]string, n)
		lps := make([]float64, n)
		for i, id := range t.OutputIDs {
			labels[i], lps[i] = fmt.Sprintf("token_id:%d", id), float64(t.OutputLogProbs[i])
		}
		choice = map[string]any{"index": 0, "text": "", "token_ids": t.OutputIDs, "finish_reason": t.FinishReason,
			"logprobs": map[string]any{"tokens": labels, "token_logprobs": lps, "top_logprobs": nil, "text_offset": make([]int, n)}}
	} else {
		content := make([]map[string]any, n)
		for i, id := range t.OutputIDs {
			content[i] = map[string]any{"token_id": id, "logprob": float64(t.OutputLogProbs[i]), "rank": 1, "top_logprobs": []any{}}
		}
		choice = map[string]any{"index": 0, "token_ids": t.OutputIDs, "finish_reason": t.FinishReason,
			"logprobs": map[string]any{"content": content}}
		if mask {
			rows := make([][]int32, n)
			for i := range rows {
				rows[i] = t.TopPTokenIDs[t.TopPTokenOffsets[i]:t.TopPTokenOffsets[i+1]]
			}
			choice["sampling_mask"] = rows
		}
	}
	if t.OutputIDs == nil {
		choice["token_ids"] = []int32{}
	}
	writeReplayJSON(w, http.StatusOK, map[string]any{"choices": []any{choice}, "usage": usage})
}

// writeReplayError writes vLLM's error envelope (docs/engine-wire.md §1).
func writeReplayError(w http.ResponseWriter, status int, typ, msg string) {
	writeReplayJSON(w, status, map[string]any{"error": map[string]any{"message": msg, "type": typ, "param": nil, "code": status}})
}

func writeReplayJSON(w http.ResponseWriter, status int, v any) {
	b, err := json.Marshal(v)
	if err != nil {
		status, b = http.StatusInternalServerError, []byte(`{"error":{"message":"replay: encoding the reply failed","type":"InternalServerError","code":500}}`)
	}
	w.Header().Set("Content-Type", "application/json")
	w.Header().Set("Content-Length", fmt.Sprint(len(b)))
	w.WriteHeader(status)
	_, _ = w.Write(b)
}

// replayEngineRef is the turns version a replay serves (the ref of its
// replay:// engine), ok false when no engine replays.
func replayEngineRef(engines []string) (ref string, ok bool) {
	for _, u := range engines {
		if r, is := replayRef(u); is {
			return r, true
		}
	}
	return "", false
}

// checkReplayOptions is RunOptions.check's part for replay:// engines
// (docs/rollout.md §7): one replay engine and nothing else, a renderer, a
// pinned recording.
func checkReplayOptions(engines []string, renderer string) error {
	n := 0
	for _, u := range engines {
		if strings.HasPrefix(u, replayScheme) {
			n++
		}
	}
	switch {
	case n == 0 && renderer != "":
		return fmt.Errorf("--replay-renderer %q is given but no --engine is replay://REF: the renderer serves only a replay", renderer)
	case n == 0:
		return nil
	case len(engines) > 1:
		return fmt.Errorf("--engine %s: a replay:// engine must be the only engine (a replay serves every run from one recording)", strings.Join(engines, ","))
	case renderer == "":
		return fmt.Errorf("--engine %s needs --replay-renderer URL: an engine with the recorded checkpoint's tokenizer and chat template, which renders prompts and decodes outputs (it is never asked to generate)", engines[0])
	}
	ref, _ := replayRef(engines[0])
	if !strings.Contains(ref, "@") {
		return fmt.Errorf("--engine %s: pin the recording, replay://NAME/turns@VERSION (`kiln ls %s` lists its versions): the version id of a replay names the version it replays", engines[0], ref)
	}
	return nil
}
