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
	// ModeGenerate requires POST /inference/v1/generate (vllm-wire.md §5).
	ModeGenerate
	// ModeCompletions uses POST /v1/completions with a token-id prompt
	// (vllm-wire.md §6), the fallback.
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
	// HTTPClient; nil means kiln's own HTTP/1.1 transport for http:// URLs
	// (persistent connections, up to 1024 idle, no proxy: the engine is
	// reached directly) and net/http's pooled transport for https://.
	// Set it to route engine calls through a proxy or add TLS settings.
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
}

// Client talks to one vLLM-compatible engine. It is safe for concurrent use.
type Client struct {
	opts     Options
	base     string
	basePath string       // the base URL's path, for h1
	hc       *http.Client // set when h1 is nil
	h1       *h1Pool      // plain-http engines without Options.HTTPClient
	bufs     bufPool      // request and reply bodies

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
		return nil, fmt.Errorf("engine: Options.BaseURL %q: %v", opts.BaseURL, err)
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
	switch {
	case c.hc == nil && u.Scheme == "http":
		c.h1 = newH1Pool(u.Host, maxIdleConns, &c.bufs)
		c.basePath = strings.TrimRight(u.EscapedPath(), "/")
	case c.hc == nil:
		// The default transport keeps 2 idle connections per host, so an
		// adapter serving many sessions would reconnect on most calls.
		tr := http.DefaultTransport.(*http.Transport).Clone()
		tr.MaxIdleConns, tr.MaxIdleConnsPerHost = maxIdleConns, maxIdleConns
		c.hc = &http.Client{Transport: tr}
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

// maxIdleConns bounds the idle connections kept to the engine: one per
// concurrent request at the adapter's usual session counts.
const maxIdleConns = 1024

// maxResponse bounds a reply body (routed-experts arrays can be large).
const maxResponse = 1 << 30

type httpReply struct {
	status int
	body   []byte
}

// release recycles the reply's body; nothing may use it afterwards (values
// parsed from it are copies).
func (c *Client) release(r *httpReply) {
	c.bufs.put(r.body)
	r.body = nil
}

// do sends one request. body nil means GET. It retries only a request the
// server cannot have seen (h1Pool).
func (c *Client) do(ctx context.Context, method, path string, body []byte, hdr map[string]string) (*httpReply, error) {
	if c.opts.RequestTimeout > 0 {
		var cancel context.CancelFunc
		ctx, cancel = context.WithTimeout(ctx, c.opts.RequestTimeout)
		defer cancel()
	}
	var r *httpReply
	var err error
	if c.h1 != nil {
		r, err = c.doH1(ctx, method, path, body, hdr)
	} else {
		r, err = c.doHTTP(ctx, method, path, body, hdr)
	}
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

func (c *Client) doH1(ctx context.Context, method, path string, body []byte, hdr map[string]string) (*httpReply, error) {
	req := h1Request{method: method, path: c.basePath + path, body: body}
	if c.opts.APIKey != "" {
		req.headers = append(req.headers, [2]string{"Authorization", "Bearer " + c.opts.APIKey})
	}
	for k, v := range hdr {
		req.headers = append(req.headers, [2]string{k, v})
	}
	status, b, err := c.h1.roundTrip(ctx, &req)
	if err != nil {
		return nil, err
	}
	return &httpReply{status: status, body: b}, nil
}

func (c *Client) doHTTP(ctx context.Context, method, path string, body []byte, hdr map[string]string) (*httpReply, error) {
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
	if c.opts.APIKey != "" {
		req.Header.Set("Authorization", "Bearer "+c.opts.APIKey)
	}
	for k, v := range hdr {
		req.Header.Set(k, v)
	}
	resp, err := c.hc.Do(req)
	if err != nil {
		return nil, err
	}
	defer resp.Body.Close()
	b, err := io.ReadAll(io.LimitReader(resp.Body, maxResponse+1))
	if err != nil {
		return nil, fmt.Errorf("reading reply: %w", err)
	}
	if len(b) > maxResponse {
		return nil, fmt.Errorf("reply larger than %d bytes", maxResponse)
	}
	return &httpReply{status: resp.StatusCode, body: b}, nil
}

// httpError builds the HTTPError for a non-2xx reply (vllm-wire.md §1: decide
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
