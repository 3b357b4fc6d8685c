package engine

import (
	"fmt"
	"strings"
)

// HTTPError is a non-2xx answer from the engine (docs/engine-wire.md §1 "Error
// envelope"). Message is error.message, else detail, else error (string),
// else the start of the raw body.
type HTTPError struct {
	Method, URL string
	Status      int
	Message     string
	// Hint is kiln's reading of the status for this route, when it has one
	// (e.g. a 404 that means the route is not enabled).
	Hint string
}

func (e *HTTPError) Error() string {
	s := fmt.Sprintf("engine: %s %s: HTTP %d: %s", e.Method, e.URL, e.Status, e.Message)
	if e.Hint != "" {
		s += " (" + e.Hint + ")"
	}
	return s
}

// Reason says which reply validation rule failed (docs/adapter.md §2.4,
// docs/engine-wire.md §10).
type Reason string

const (
	ReasonBadJSON              Reason = "bad-json"               // body is not a JSON object
	ReasonNoChoices            Reason = "no-choices"             // choices missing, not a list, or empty
	ReasonExtraChoices         Reason = "extra-choices"          // more than the one choice asked for
	ReasonMissingTokenIDs      Reason = "missing-token-ids"      // no output ids in the choice
	ReasonBadTokenID           Reason = "bad-token-id"           // an id that is not a non-negative int32
	ReasonMissingLogprobs      Reason = "missing-logprobs"       // logprobs (or one entry's logprob) absent/null
	ReasonNonFiniteLogprob     Reason = "non-finite-logprob"     // NaN / ±Inf / non-number logprob
	ReasonLengthMismatch       Reason = "length-mismatch"        // len(logprobs) != len(output ids)
	ReasonTokenMismatch        Reason = "token-mismatch"         // a logprob entry's id != the output id
	ReasonUsageMismatch        Reason = "usage-mismatch"         // usage.completion_tokens != len(output ids)
	ReasonBadFinishReason      Reason = "bad-finish-reason"      // finish_reason not a string, or unknown
	ReasonEngineError          Reason = "engine-error"           // finish_reason "error"
	ReasonBadTopLogprobs       Reason = "bad-top-logprobs"       // requested top logprobs malformed
	ReasonMissingSamplingMask  Reason = "missing-sampling-mask"  // requested nucleus ids absent
	ReasonBadSamplingMask      Reason = "bad-sampling-mask"      // nucleus rows malformed
	ReasonMissingRoutedExperts Reason = "missing-routed-experts" // requested routed experts absent
	ReasonBadRoutedExperts     Reason = "bad-routed-experts"     // routed experts undecodable or wrong shape
)

// ReplyError is a 2xx engine reply that failed validation. Nothing of the
// reply is returned with it.
type ReplyError struct {
	Route  string // "/inference/v1/generate" or "/v1/completions", etc.
	Reason Reason
	Detail string
}

func (e *ReplyError) Error() string {
	return fmt.Sprintf("engine: invalid reply from %s (%s): %s", e.Route, e.Reason, e.Detail)
}

func replyErr(route string, r Reason, format string, args ...any) *ReplyError {
	return &ReplyError{Route: route, Reason: r, Detail: fmt.Sprintf(format, args...)}
}

// ContextOverflowError: the prompt alone leaves no room for one output token
// within the context length. The adapter maps it to each protocol's own error.
type ContextOverflowError struct {
	PromptTokens int
	MaxContext   int
}

func (e *ContextOverflowError) Error() string {
	return fmt.Sprintf("engine: prompt has %d tokens, which leaves no room for output within the context length of %d tokens", e.PromptTokens, e.MaxContext)
}

// UnavailableError: the engine lacks the route the Mode needs (Probe).
type UnavailableError struct {
	URL     string
	Route   string
	Version string // GET /version, "" if unknown
	Detail  string // what was observed, e.g. "HTTP 404 {"detail":"Not Found"}"
	Advice  string
}

func (e *UnavailableError) Error() string {
	v := ""
	if e.Version != "" {
		v = " (vLLM " + e.Version + ")"
	}
	return fmt.Sprintf("engine: %s%s has no usable POST %s: %s. %s", e.URL, v, e.Route, e.Detail, e.Advice)
}

func clip(b []byte, n int) string {
	s := strings.TrimSpace(string(b))
	if len(s) > n {
		return s[:n] + "…"
	}
	return s
}
