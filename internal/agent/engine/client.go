package engine

import (
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"net/http"
	"net/url"
	"strings"
	"sync"
	"syscall"
	"time"
)

// Mode picks the generation route.
type Mode int

const (
	// ModeAuto uses POST /inference/v1/generate when Probe finds it, else
	// POST /v1/completions with a token-id prompt.
	ModeAuto Mode = iota
	// ModeGenerate requires POST /inference/v1/generate (docs/engine-wire.md §5).
	ModeGenerate
	// ModeCompletions uses POST /v1/completions with a token-id prompt
	// (docs/engine-wire.md §6), the fallback.
	ModeCompletions
)

func (m Mode) String() string {
	switch m {
	case ModeAuto:
		return "auto"
	case ModeGenerate:
		return "generate"
	case ModeCompletions:
		return "completions"
	}
	return fmt.Sprintf("Mode(%d)", int(m))
}

// ParseMode reads "auto", "generate" or "completions" (flag values).
func ParseMode(s string) (Mode, error) {
	switch strings.ToLower(strings.TrimSpace(s)) {
	case "", "auto":
		return ModeAuto, nil
	case "generate":
		return ModeGenerate, nil
	case "completions":
		return ModeCompletions, nil
	}
	return 0, fmt.Errorf("engine: unknown mode %q (want auto, generate or completions)", s)
}

// Route is a generation route.
type Route string

const (
	RouteGenerate    Route = "/inference/v1/generate"
	RouteCompletions Route = "/v1/completions"
)

// Options configure a Client.
type Options struct {
	// BaseURL of the vLLM server (or router), e.g. http://127.0.0.1:8000.
	// Required; a trailing slash is dropped.
	BaseURL string
	// HTTPClient; nil means net/http's Transport tuned for the engine (see
	// NewHTTPClient): HTTP/1.1, up to 1024 idle connections, no proxy, no
	// redirects followed. Set it to route engine calls through a proxy or
	// add TLS settings; the no-resend rule (see Client.do) then holds only
	// as far as its Transport and CheckRedirect keep it.
	HTTPClient *http.Client
	// Model is sent as "model" when non-empty; it must be a served model
	// name or a loaded LoRA name (else vLLM answers 404).
	Model string
	// APIKey, when set, is sent as "Authorization: Bearer <key>" (needed on
	// /v1 and /inference paths of a server started with --api-key).
	APIKey string
	// Mode picks the generation route.
	Mode Mode
	// ContextLength is max_model_len; 0 means learn it from GET /v1/models
	// (or any /tokenize reply). Generate clamps max_tokens to it.
	ContextLength int
	// RequestTimeout bounds each request; 0 means none (cancel through ctx).
	RequestTimeout time.Duration
	// Observe, when set, is called with every generation Generate
	// validated, before Generate returns it, on the caller's goroutine
	// (Probe's own generation is not observed). It must not modify req or
	// g and must be safe for concurrent use. The rollout stage checks the
	// weights each token was generated with here (docs/rollout.md §2.4).
	Observe func(req *GenerateRequest, g *Generation)
}

// Client talks to one vLLM-compatible engine. It is safe for concurrent use.
type Client struct {
	opts Options
	base string
	hc   *http.Client

	probeMu    sync.Mutex // serialises lazy probes
	mu         sync.Mutex
	probed     bool
	caps       Capabilities
	route      Route // "" until decided
	contextLen int
}

// New checks opts and returns a client. It makes no request; call Probe.
func New(opts Options) (*Client, error) {
	if strings.TrimSpace(opts.BaseURL) == "" {
		return nil, errors.New("engine: Options.BaseURL is empty (want e.g. http://127.0.0.1:8000)")
	}
	u, err := url.Parse(strings.TrimSpace(opts.BaseURL))
	if err != nil {
		return nil, fmt.Errorf("engine: Options.BaseURL %q: %w", opts.BaseURL, err)
	}
	if u.Scheme != "http" && u.Scheme != "https" {
		return nil, fmt.Errorf("engine: Options.BaseURL %q: scheme must be http or https", opts.BaseURL)
	}
	if u.Host == "" {
		return nil, fmt.Errorf("engine: Options.BaseURL %q has no host", opts.BaseURL)
	}
	if u.RawQuery != "" || u.Fragment != "" {
		return nil, fmt.Errorf("engine: Options.BaseURL %q must not carry a query or fragment", opts.BaseURL)
	}
	if opts.Mode < ModeAuto || opts.Mode > ModeCompletions {
		return nil, fmt.Errorf("engine: Options.Mode %d is not auto, generate or completions", int(opts.Mode))
	}
	if opts.ContextLength < 0 {
		return nil, fmt.Errorf("engine: Options.ContextLength %d is negative (0 = learn from /v1/models)", opts.ContextLength)
	}
	if opts.RequestTimeout < 0 {
		return nil, fmt.Errorf("engine: Options.RequestTimeout %v is negative (0 = none)", opts.RequestTimeout)
	}
	if strings.ContainsAny(opts.APIKey, "\r\n") {
		return nil, errors.New("engine: Options.APIKey contains a line break")
	}
	c := &Client{opts: opts, base: strings.TrimRight(u.String(), "/"), hc: opts.HTTPClient, contextLen: opts.ContextLength}
	if c.hc == nil {
		c.hc = NewHTTPClient()
	}
	switch opts.Mode {
	case ModeGenerate:
		c.route = RouteGenerate
	case ModeCompletions:
		c.route = RouteCompletions
	}
	return c, nil
}

// ContextLength is the context length in use (0 while unknown).
func (c *Client) ContextLength() int {
	c.mu.Lock()
	defer c.mu.Unlock()
	return c.contextLen
}

// Transport settings for the engine's own client.
const (
	// maxIdleConns bounds the idle connections kept to the engine: one per
	// concurrent request at the adapter's usual session counts (net/http's
	// default of 2 per host would reconnect on most calls).
	maxIdleConns = 1024
	// idleConnTimeout drops connections idle longer than this: just under
	// vLLM's keep-alive timeout (VLLM_HTTP_TIMEOUT_KEEP_ALIVE, 5 s by
	// default), so the client closes an idle connection before the server
	// does, and a generate is not sent into a close already on its way
	// (that request fails, as it is not re-sent; see Client.do). A fresh
	// connection after a long tool call costs a handshake.
	idleConnTimeout = 4 * time.Second
)

// NewHTTPClient returns the client New uses when Options.HTTPClient is nil
// (a new one each call): net/http's default dialing and TLS settings with
//
//   - HTTP/1.1 only: vLLM (uvicorn) speaks nothing else, and HTTP/2's
//     Transport re-sends a request after some stream resets (see Client.do);
//   - no proxy: the engine is reached directly;
//   - no compression asked for: replies are read as the engine writes them;
//   - idle pools sized for many concurrent sessions (maxIdleConns,
//     idleConnTimeout);
//   - redirects not followed: a 3xx is an *HTTPError, as any non-2xx, and a
//     307/308 would otherwise send a generate body again elsewhere.
//
// A caller that wants to observe the engine calls (the adapter's load
// benchmark times them) wraps its Transport and passes the result as
// Options.HTTPClient, keeping these settings.
func NewHTTPClient() *http.Client {
	tr := http.DefaultTransport.(*http.Transport).Clone()
	tr.Proxy = nil
	tr.Protocols = new(http.Protocols)
	tr.Protocols.SetHTTP1(true)
	tr.ForceAttemptHTTP2 = false
	tr.DisableCompression = true
	tr.MaxIdleConns, tr.MaxIdleConnsPerHost = maxIdleConns, maxIdleConns
	tr.IdleConnTimeout = idleConnTimeout
	return &http.Client{
		Transport:     tr,
		CheckRedirect: func(*http.Request, []*http.Request) error { return http.ErrUseLastResponse },
	}
}

// maxResponse bounds a reply body (routed-experts arrays can be large).
const maxResponse = 1 << 30

type httpReply struct {
	status int
	body   []byte
}

// do sends one request and reads its reply whole. body nil means GET.
//
// Cancellation: the request runs under ctx (bounded by
// Options.RequestTimeout); when ctx ends, net/http's HTTP/1.1 Transport
// closes the connection, which is how vLLM learns to abort a generation
// (docs/engine-wire.md §5.5), and the call fails with ctx.Err(). A call whose ctx has already
// ended sends nothing.
//
// No resend: the client itself never retries, and a POST (generate,
// tokenize, detokenize) is never sent twice by the Transport either.
// net/http re-sends a request on a reused connection that failed only when
// (a) nothing of it was written to the connection (the server cannot have
// seen it), or (b) the request is replayable: GET, HEAD, OPTIONS or TRACE,
// or a rewindable one carrying an Idempotency-Key or X-Idempotency-Key
// header. The client sets neither header (hdr holds only x-session-id), so
// a POST that may have reached the engine — a server that read it and
// dropped the connection may have acted on it — fails to the caller;
// only the probe's GETs may be re-sent. HTTP/2, whose Transport also
// re-sends after some stream resets, is not used (NewHTTPClient).
func (c *Client) do(ctx context.Context, method, path string, body []byte, hdr map[string]string) (*httpReply, error) {
	if c.opts.RequestTimeout > 0 {
		var cancel context.CancelFunc
		ctx, cancel = context.WithTimeout(ctx, c.opts.RequestTimeout)
		defer cancel()
	}
	r, err := c.roundTrip(ctx, method, path, body, hdr)
	if err != nil {
		if ctx.Err() != nil {
			return nil, fmt.Errorf("engine: %s %s aborted: %w", method, c.base+path, ctx.Err())
		}
		if errors.Is(err, syscall.ECONNREFUSED) {
			return nil, fmt.Errorf("engine: no server at %s (%s %s: connection refused); is vLLM running and the engine URL right? %w", c.base, method, path, err)
		}
		return nil, fmt.Errorf("engine: %s %s: %w", method, c.base+path, err)
	}
	return r, nil
}

func (c *Client) roundTrip(ctx context.Context, method, path string, body []byte, hdr map[string]string) (*httpReply, error) {
	if err := ctx.Err(); err != nil {
		return nil, err // sent now, the request would only be aborted
	}
	var rd io.Reader
	if body != nil {
		rd = bytes.NewReader(body)
	}
	req, err := http.NewRequestWithContext(ctx, method, c.base+path, rd)
	if err != nil {
		return nil, err
	}
	if body != nil {
		req.Header.Set("Content-Type", "application/json")
	}
	req.Header.Set("Accept", "application/json")
	req.Header.Set("User-Agent", "kiln")
	if c.opts.APIKey != "" {
		req.Header.Set("Authorization", "Bearer "+c.opts.APIKey)
	}
	for k, v := range hdr {
		// net/http refuses these too, naming the header canonicalized;
		// the check here names it as the caller gave it.
		if k == "" || strings.ContainsAny(k, "\r\n: ") || strings.ContainsAny(v, "\r\n") {
			return nil, fmt.Errorf("header %q: %q is not a valid header line", k, v)
		}
		req.Header.Set(k, v)
	}
	resp, err := c.hc.Do(req)
	if err != nil {
		var ue *url.Error
		if errors.As(err, &ue) {
			err = ue.Err // do names the method and URL itself
		}
		return nil, err
	}
	defer resp.Body.Close()
	if resp.ContentLength > maxResponse {
		return nil, fmt.Errorf("reply larger than %d bytes", maxResponse)
	}
	b, err := io.ReadAll(io.LimitReader(resp.Body, maxResponse+1))
	if err != nil {
		return nil, fmt.Errorf("reading reply: %w", err)
	}
	if len(b) > maxResponse {
		return nil, fmt.Errorf("reply larger than %d bytes", maxResponse)
	}
	return &httpReply{status: resp.StatusCode, body: b}, nil
}

// httpError builds the HTTPError for a non-2xx reply (docs/engine-wire.md §1: decide
// by status; message from error.message, else detail, else error string,
// else raw text).
func (c *Client) httpError(method, path string, r *httpReply) *HTTPError {
	return &HTTPError{Method: method, URL: c.base + path, Status: r.status, Message: errorMessage(r.body)}
}

func errorMessage(body []byte) string {
	var env struct {
		Error  json.RawMessage `json:"error"`
		Detail json.RawMessage `json:"detail"`
	}
	if json.Unmarshal(body, &env) == nil {
		if len(env.Error) > 0 && !isNull(env.Error) {
			var obj struct {
				Message string `json:"message"`
			}
			if json.Unmarshal(env.Error, &obj) == nil && obj.Message != "" {
				return clip([]byte(obj.Message), 400)
			}
			var s string
			if json.Unmarshal(env.Error, &s) == nil && s != "" {
				return clip([]byte(s), 400)
			}
		}
		if len(env.Detail) > 0 && !isNull(env.Detail) {
			var s string
			if json.Unmarshal(env.Detail, &s) == nil {
				return clip([]byte(s), 400)
			}
			return clip(env.Detail, 400) // pydantic-style detail list
		}
	}
	if len(bytes.TrimSpace(body)) == 0 {
		return "(empty body)"
	}
	return clip(body, 400)
}

// routeMissing reports a 404 that is FastAPI's "no such route" rather than an
// error envelope (an unknown model is a 404 with {"error": {...}}).
func routeMissing(r *httpReply) bool {
	if r.status != http.StatusNotFound {
		return false
	}
	var env struct {
		Error json.RawMessage `json:"error"`
	}
	if json.Unmarshal(r.body, &env) == nil && len(env.Error) > 0 && !isNull(env.Error) {
		return false
	}
	return true
}

func isNull(raw json.RawMessage) bool {
	t := bytes.TrimSpace(raw)
	return len(t) == 0 || string(t) == "null"
}

// marshal encodes v without HTML escaping and without the trailing newline.
func marshal(v any) ([]byte, error) {
	var buf bytes.Buffer
	enc := json.NewEncoder(&buf)
	enc.SetEscapeHTML(false)
	if err := enc.Encode(v); err != nil {
		return nil, err
	}
	return bytes.TrimRight(buf.Bytes(), "\n"), nil
}

// learnContext sets the context length from a server report when the
// options left it 0.
func (c *Client) learnContext(n int) {
	if n <= 0 {
		return
	}
	c.mu.Lock()
	if c.opts.ContextLength == 0 && c.contextLen == 0 {
		c.contextLen = n
	}
	c.mu.Unlock()
}
