package engine

import (
	"context"
	"encoding/json"
	"fmt"
	"net/http"
	"strings"
)

// Capabilities is what Probe learned about the engine.
type Capabilities struct {
	// Version is GET /version's "version" ("" when the route is missing).
	Version string
	// Models are the served model names (GET /v1/models cards without a
	// parent); LoRAs are loaded adapters (cards with a parent).
	Models []string
	LoRAs  []string
	// Root is the checkpoint path or HF id the server loaded (first base
	// card's "root"); LoadSpecialTokens reads it when it is a local dir.
	Root string
	// MaxModelLen is the server's max_model_len (0 if not reported).
	MaxModelLen int
	// ContextLength is what Generate clamps to: Options.ContextLength, or
	// MaxModelLen when that was 0.
	ContextLength int
	// Generate: POST /inference/v1/generate answered a 1-token probe;
	// GenerateShape is the reply shape seen (docs/engine-wire.md §5.4).
	// GenerateDetail says why not, when it did not.
	Generate       bool
	GenerateShape  Shape
	GenerateDetail string
	// Completions: POST /v1/completions answered the token-id probe
	// (probed only when the fallback is in play).
	Completions bool
	// Route is the generation route Generate uses.
	Route Route
}

// enableAdvice is what docs/engine-wire.md §5.1 / §10.1 say turns the token-in
// route on, per release window.
const enableAdvice = "Enable it on the server: vLLM v0.30 and later need `vllm serve ... --enable-scale-out` " +
	"(or `--tokens-only`, which always registers it); the ~v0.29 window needs the environment variable " +
	"VLLM_ENABLE_SCALE_OUT_ENDPOINTS=1 instead; v0.11.2 to ~v0.28 register it without a flag for models " +
	"with the generate task (older releases lack it). " +
	"Alternatively run kiln with `--fallback completions` (engine Mode completions, or auto) to generate " +
	"through POST /v1/completions with a token-id prompt"

// Probe asks the engine what it serves (docs/engine-wire.md §10.1): GET /version,
// GET /v1/models (served names, max_model_len), then a 1-token generation
// with max_tokens 1 on the route the Mode needs (auto: generate, else
// completions). It sets the client's route and, when Options.ContextLength
// is 0, its context length. A missing token-in route under ModeGenerate is
// an *UnavailableError saying how to enable it.
func (c *Client) Probe(ctx context.Context) (Capabilities, error) {
	var caps Capabilities
	// GET /version: optional.
	r, err := c.do(ctx, http.MethodGet, "/version", nil, nil)
	if err != nil {
		return caps, err
	}
	if r.status/100 == 2 {
		var v struct {
			Version string `json:"version"`
		}
		if json.Unmarshal(r.body, &v) == nil {
			caps.Version = v.Version
		}
	}
	// GET /v1/models.
	r, err = c.do(ctx, http.MethodGet, "/v1/models", nil, nil)
	if err != nil {
		return caps, err
	}
	switch {
	case r.status == http.StatusUnauthorized:
		e := c.httpError(http.MethodGet, "/v1/models", r)
		e.Hint = "the server runs with --api-key; set the engine API key"
		return caps, e
	case r.status/100 == 2:
		if err := c.readModels(r.body, &caps); err != nil {
			return caps, err
		}
	case r.status != http.StatusNotFound:
		return caps, c.httpError(http.MethodGet, "/v1/models", r)
	}
	if c.opts.Model != "" && len(caps.Models)+len(caps.LoRAs) > 0 && !contains(caps.Models, c.opts.Model) && !contains(caps.LoRAs, c.opts.Model) {
		return caps, fmt.Errorf("engine: %s does not serve model %q (served: %s)", c.base, c.opts.Model, strings.Join(append(append([]string{}, caps.Models...), caps.LoRAs...), ", "))
	}
	c.learnContext(caps.MaxModelLen)

	// Generation route.
	var route Route
	if c.opts.Mode != ModeCompletions {
		shape, detail, err := c.probeRoute(ctx, RouteGenerate)
		if err != nil {
			return caps, err
		}
		caps.Generate, caps.GenerateShape, caps.GenerateDetail = detail == "", shape, detail
		if caps.Generate {
			route = RouteGenerate
		} else if c.opts.Mode == ModeGenerate {
			return caps, &UnavailableError{URL: c.base, Route: string(RouteGenerate), Version: caps.Version, Detail: detail, Advice: enableAdvice}
		}
	}
	if route == "" {
		_, detail, err := c.probeRoute(ctx, RouteCompletions)
		if err != nil {
			return caps, err
		}
		if detail != "" {
			advice := "The completions fallback needs an OpenAI-compatible vLLM server with a tokenizer."
			if c.opts.Mode == ModeAuto {
				advice = fmt.Sprintf("The token-in route failed too (%s). %s", caps.GenerateDetail, enableAdvice)
			}
			return caps, &UnavailableError{URL: c.base, Route: string(RouteCompletions), Version: caps.Version, Detail: detail, Advice: advice}
		}
		caps.Completions = true
		route = RouteCompletions
	}
	caps.Route = route
	c.mu.Lock()
	c.route = route
	c.probed = true
	caps.ContextLength = c.contextLen
	c.caps = caps
	c.mu.Unlock()
	return caps, nil
}

// Capabilities returns the last successful Probe's result.
func (c *Client) Capabilities() Capabilities {
	c.mu.Lock()
	defer c.mu.Unlock()
	return c.caps
}

func (c *Client) readModels(body []byte, caps *Capabilities) error {
	var list struct {
		Data []struct {
			ID          string  `json:"id"`
			Root        string  `json:"root"`
			Parent      *string `json:"parent"`
			MaxModelLen *int    `json:"max_model_len"`
		} `json:"data"`
	}
	if err := json.Unmarshal(body, &list); err != nil {
		return replyErr("/v1/models", ReasonBadJSON, "%v: %s", err, clip(body, 200))
	}
	for _, m := range list.Data {
		if m.Parent != nil && *m.Parent != "" {
			caps.LoRAs = append(caps.LoRAs, m.ID)
			continue
		}
		caps.Models = append(caps.Models, m.ID)
		if caps.Root == "" {
			caps.Root = m.Root
		}
		if m.MaxModelLen != nil && *m.MaxModelLen > 0 && (caps.MaxModelLen == 0 || m.ID == c.opts.Model) {
			caps.MaxModelLen = *m.MaxModelLen
		}
	}
	return nil
}

// probeRoute runs a greedy 1-token generation from prompt [0]. detail is
// non-empty when the route is absent or unusable (404 without an error
// envelope, 501, the "does not support generate tokens API" 400, or a reply
// that fails validation); err is for everything else.
func (c *Client) probeRoute(ctx context.Context, route Route) (Shape, string, error) {
	zero := 0.0
	req := GenerateRequest{PromptIDs: []int32{0}, Sampling: SamplingParams{MaxTokens: 1, Temperature: &zero}}
	var body []byte
	var err error
	if route == RouteGenerate {
		body, err = c.generateBody(&req, 1)
	} else {
		body, err = c.completionsBody(&req, 1)
	}
	if err != nil {
		return 0, "", err
	}
	r, err := c.do(ctx, http.MethodPost, string(route), body, nil)
	if err != nil {
		return 0, "", err
	}
	if r.status/100 != 2 {
		msg := errorMessage(r.body)
		switch {
		case routeMissing(r):
			return 0, fmt.Sprintf("HTTP 404 %s: the route is not registered", msg), nil
		case r.status == http.StatusNotImplemented,
			r.status == http.StatusBadRequest && strings.Contains(msg, "does not support generate tokens"):
			return 0, fmt.Sprintf("HTTP %d %s: the served model has no generate task", r.status, msg), nil
		case r.status == http.StatusUnauthorized:
			e := c.httpError(http.MethodPost, string(route), r)
			e.Hint = "the server runs with --api-key; set the engine API key"
			return 0, "", e
		}
		return 0, "", c.httpError(http.MethodPost, string(route), r)
	}
	var g Generation
	if route == RouteGenerate {
		g, err = parseGenerate(r.body, &req)
	} else {
		g, err = parseCompletions(r.body, &req)
	}
	if err != nil {
		return 0, "", err
	}
	return g.Shape, "", nil
}

func contains(list []string, s string) bool {
	for _, x := range list {
		if x == s {
			return true
		}
	}
	return false
}
