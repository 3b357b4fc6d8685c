// Package enginectl is the control side of a serving engine: reloading
// weights from a local directory and asking which weights it serves, over
// vLLM's and SGLang's HTTP protocols (docs/sync.md §3, §5). Generation is
// internal/agent/engine's; this package never generates.
//
// Every call has a deadline: an engine that accepts the connection and
// never answers fails at it, named by URL. A fleet is paused, reloaded and
// checked as a whole, and resumed only when every engine serves the new
// version (the stay-paused policy of docs/sync.md §3).
package enginectl

import (
	"context"
	"log/slog"
	"net/http"
	"time"
)

// Protocol names an engine's control protocol.
type Protocol string

const (
	VLLM   Protocol = "vllm"   // vLLM in dev mode, and kiln's serve.py
	SGLang Protocol = "sglang" // SGLang's HTTP server
)

// Options configure calls to engines.
type Options struct {
	Protocol Protocol // "" is VLLM
	// APIKey, when set, is sent as "Authorization: Bearer APIKey".
	APIKey string
	// Client is the HTTP client (nil: a new one). Deadlines come from the
	// context and CallTimeout, never from Client.Timeout.
	Client *http.Client
	// CallTimeout bounds each control call but the reload itself
	// (default 60s).
	CallTimeout time.Duration
	// Flush resets vLLM engines' prefix caches after the pause; SGLang
	// engines are always flushed (docs/sync.md §3).
	Flush bool
	// Retries and RetryEvery bound the cache-flush retries (default 60 x 1s).
	Retries    int
	RetryEvery time.Duration
	Log        *slog.Logger
}

// Reload makes every engine serve the model directory path as weights
// number version (docs/sync.md §3): pause all, reload all in parallel,
// check every engine reports version, then resume all. The whole call is
// bounded by ctx. On any failure no engine is resumed and the error is a
// *FleetError naming each engine's outcome.
//
// func Reload(ctx context.Context, engines []string, path string, version int64, o Options) error

// ServedVersion asks one engine which weights number it serves (vLLM:
// GET /v1/models data[0].weight_version, else GET /weight_info; SGLang:
// GET /get_weight_version). An engine that reports none is an error that
// says so.
//
// func ServedVersion(ctx context.Context, engine string, o Options) (string, error)

var _ = context.Background // the signatures above name it
