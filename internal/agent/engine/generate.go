package engine

import (
	"context"
	"errors"
	"fmt"
	"math"
	"net/http"
	"strconv"
)

// SamplingParams are the vLLM sampling_params kiln sets (docs/engine-wire.md §5.3).
// Pointer fields are sent only when non-nil. On the completions fallback the
// nil ones among Temperature, TopP, TopK, MinP and RepetitionPenalty are sent
// as the engine defaults (1, 1, 0, 0, 1), because /v1/completions would
// otherwise apply the model's generation_config.json values, which
// /inference/v1/generate does not (docs/engine-wire.md §5.3, docs/engine-wire.md §6): both routes sample alike.
type SamplingParams struct {
	// MaxTokens is always sent; must be ≥ 1. Generate lowers it to the room
	// left in the context (ClampMaxTokens).
	MaxTokens   int
	Temperature *float64 // [0, 2]; < 1e-5 is greedy
	TopP        *float64 // (0, 1]
	TopK        *int     // 0 or -1: off
	MinP        *float64 // [0, 1]
	Seed        *int64
	// Stop strings need detokenization: when set, the generate route sends
	// detokenize:true (vLLM answers 400 otherwise).
	Stop                   []string
	IncludeStopStrInOutput bool // sent with Stop only
	// StopTokenIDs end generation after the id is emitted. The tokenizer EOS
	// and generation_config.json eos_token_id(s) stop generation anyway unless
	// IgnoreEOS.
	StopTokenIDs []int32
	IgnoreEOS    bool
	MinTokens    int // ≤ MaxTokens
	// Logprobs is how many top candidates to return per position. The
	// sampled token's logprob is always requested: "logprobs" is sent as
	// max(Logprobs, 1) (v0.11.x returned none for 0, docs/engine-wire.md §5.4). When Logprobs > 0,
	// Generation.TopLogProbs carries the candidates.
	Logprobs          int
	PresencePenalty   *float64
	FrequencyPenalty  *float64
	RepetitionPenalty *float64
	LogitBias         map[int32]float64
}

// GenerateRequest is one token-in generation.
type GenerateRequest struct {
	PromptIDs []int32 // at least one id
	// Memo, when set, is the conversation's: a prompt that is a render
	// read through it is written from the reply's bytes (not sent; see
	// Memo).
	Memo     *Memo
	Sampling SamplingParams
	// SessionID is sent as header x-session-id for the router's consistent
	// hashing (docs/adapter.md §1.2); "" and "default" send no header.
	SessionID string
	// RequestID is sent as "request_id" when non-empty (the engine id becomes
	// generate-tokens-<id>).
	RequestID string
	// CacheSalt is sent as "cache_salt" when non-empty (1–1024 chars).
	CacheSalt string
	// ReturnSamplingMask requires choices[0].sampling_mask (the top-p
	// nucleus per output token, docs/engine-wire.md §5.4 shape C) and returns it as
	// Generation.TopPTokenIDs/TopPTokenOffsets. Upstream vLLM captures it
	// server-wide (--return-sampling-mask, unconfirmed); the per-request key
	// return_sampling_mask is also sent, which upstream ignores (docs/engine-wire.md §1, docs/engine-wire.md §5.4).
	// Generate route only.
	ReturnSamplingMask bool
	// ReturnRoutedExperts sends routed_experts_prompt_start:0 and requires
	// choices[0].routed_experts (base64 .npy, shape (prompt+output−1,
	// layers, experts per token); the server needs
	// enable_return_routed_experts). Generate route only.
	ReturnRoutedExperts bool
}

// StopReason is a choice's optional stop_reason (docs/engine-wire.md §5.4, "some versions"):
// the stop token id or stop string that ended generation. Neither is set
// for EOS, absent or null.
type StopReason struct {
	TokenID   int32
	IsTokenID bool
	Text      string
	IsText    bool
}

// TopLogProb is one candidate at an output position.
type TopLogProb struct {
	ID      int32
	LogProb float32
}

// Generation is a validated engine reply.
type Generation struct {
	// OutputIDs are the sampled ids, including the terminating EOS / stop id.
	OutputIDs []int32
	// LogProbs[i] is the logprob of OutputIDs[i] (the engine's
	// --logprobs-mode, raw by default).
	LogProbs     []float32
	FinishReason string // "stop", "length" or "abort"
	StopReason   StopReason
	// Route and Shape say where the reply came from and how it was read.
	Route Route
	Shape Shape
	// PromptTokens is usage.prompt_tokens when reported, else -1.
	PromptTokens int
	// CachedTokens is usage.prompt_tokens_details.cached_tokens, else -1.
	CachedTokens int
	// MaxTokens is the max_tokens actually sent (after the context clamp).
	MaxTokens int
	// TopLogProbs[i] are position i's candidates as the engine listed them
	// (sampled token first, then rank order); only when Sampling.Logprobs > 0.
	TopLogProbs [][]TopLogProb
	// Top-p nucleus per output token in CSR form (offsets has
	// len(OutputIDs)+1 entries, from 0); only with ReturnSamplingMask.
	TopPTokenIDs     []int32
	TopPTokenOffsets []int32
	// Routed experts, row-major with shape RoutedExpertsShape ([positions,
	// layers, topk]); only with ReturnRoutedExperts.
	RoutedExperts      []int32
	RoutedExpertsShape []int32
	// WeightVersions is choices[0].weight_versions as the engine listed
	// it (docs/engine-wire.md §10.4): the weights version each output token
	// was generated with (kiln's serve.py: one entry per token), each a
	// string (an integer in decimal). nil when the reply has none, or has
	// one of another form than a list of integers and strings, which is
	// ignored: upstream vLLM's field is unconfirmed, so a shape kiln does
	// not know never fails a reply. Generate route only.
	WeightVersions []string
}

// TopK returns the k highest-logprob candidates of every position, row-major
// [len(OutputIDs), k] (ties keep the engine's order), for records.Replay.
// Every position must carry at least k candidates.
func (g *Generation) TopK(k int) (ids []int32, logprobs []float32, err error) {
	if k <= 0 {
		return nil, nil, fmt.Errorf("engine: TopK(%d): k must be positive", k)
	}
	if len(g.TopLogProbs) != len(g.OutputIDs) {
		return nil, nil, errors.New("engine: TopK: the generation carries no top logprobs (set Sampling.Logprobs)")
	}
	ids = make([]int32, 0, k*len(g.OutputIDs))
	logprobs = make([]float32, 0, k*len(g.OutputIDs))
	row := make([]TopLogProb, 0, k+1)
	for i, cands := range g.TopLogProbs {
		if len(cands) < k {
			return nil, nil, fmt.Errorf("engine: TopK(%d): position %d has %d candidates", k, i, len(cands))
		}
		row = append(row[:0], cands...)
		// insertion sort, stable, descending by logprob (rows are short)
		for a := 1; a < len(row); a++ {
			for b := a; b > 0 && row[b].LogProb > row[b-1].LogProb; b-- {
				row[b], row[b-1] = row[b-1], row[b]
			}
		}
		for _, t := range row[:k] {
			ids = append(ids, t.ID)
			logprobs = append(logprobs, t.LogProb)
		}
	}
	return ids, logprobs, nil
}

// ClampMaxTokens returns min(requested, contextLen−promptLen). contextLen ≤ 0
// means unknown (no clamp). A prompt that leaves no room for one token is a
// *ContextOverflowError.
func ClampMaxTokens(promptLen, requested, contextLen int) (int, error) {
	if requested < 1 {
		return 0, fmt.Errorf("engine: max_tokens %d: must be at least 1", requested)
	}
	if promptLen < 0 {
		return 0, fmt.Errorf("engine: prompt length %d is negative", promptLen)
	}
	if contextLen <= 0 {
		return requested, nil
	}
	room := contextLen - promptLen
	if room < 1 {
		return 0, &ContextOverflowError{PromptTokens: promptLen, MaxContext: contextLen}
	}
	return min(requested, room), nil
}

func checkSampling(p *SamplingParams) error {
	bad := func(f string, args ...any) error {
		return fmt.Errorf("engine: sampling: "+f, args...)
	}
	switch {
	case p.MaxTokens < 1:
		return bad("MaxTokens %d: must be at least 1", p.MaxTokens)
	case p.Temperature != nil && !(*p.Temperature >= 0 && *p.Temperature <= 2):
		return bad("Temperature %v outside [0, 2]", *p.Temperature)
	case p.TopP != nil && !(*p.TopP > 0 && *p.TopP <= 1):
		return bad("TopP %v outside (0, 1]", *p.TopP)
	case p.TopK != nil && *p.TopK < -1:
		return bad("TopK %d: must be -1, 0 or positive", *p.TopK)
	case p.MinP != nil && !(*p.MinP >= 0 && *p.MinP <= 1):
		return bad("MinP %v outside [0, 1]", *p.MinP)
	case p.MinTokens < 0 || p.MinTokens > p.MaxTokens:
		return bad("MinTokens %d outside [0, MaxTokens=%d]", p.MinTokens, p.MaxTokens)
	case p.Logprobs < 0:
		return bad("Logprobs %d is negative (full-vocabulary -1 is not supported)", p.Logprobs)
	case p.RepetitionPenalty != nil && (!(*p.RepetitionPenalty > 0) || math.IsInf(*p.RepetitionPenalty, 0)):
		return bad("RepetitionPenalty %v: must be positive and finite", *p.RepetitionPenalty)
	}
	for _, f := range []struct {
		n string
		v *float64
	}{{"PresencePenalty", p.PresencePenalty}, {"FrequencyPenalty", p.FrequencyPenalty}} {
		if f.v != nil && !(*f.v >= -2 && *f.v <= 2) {
			return bad("%s %v outside [-2, 2]", f.n, *f.v)
		}
	}
	for _, id := range p.StopTokenIDs {
		if id < 0 {
			return bad("StopTokenIDs holds negative id %d", id)
		}
	}
	for id, v := range p.LogitBias {
		if id < 0 || math.IsNaN(v) || math.IsInf(v, 0) {
			return bad("LogitBias[%d] = %v", id, v)
		}
	}
	return nil
}

// Generate runs one generation on the route the Mode (or Probe, for
// ModeAuto) picked, with max_tokens clamped to the context length when it is
// known, and returns the validated reply. It never retries. Cancelling ctx
// closes the connection, which makes vLLM abort the request (docs/engine-wire.md §5.5).
func (c *Client) Generate(ctx context.Context, req GenerateRequest) (Generation, error) {
	if len(req.PromptIDs) == 0 {
		return Generation{}, errors.New("engine: Generate: empty prompt")
	}
	if !req.Memo.holds(req.PromptIDs) { // a memo's render was read as non-negative ids
		for i, id := range req.PromptIDs {
			if id < 0 {
				return Generation{}, fmt.Errorf("engine: Generate: PromptIDs[%d] = %d is negative", i, id)
			}
		}
	}
	if err := checkSampling(&req.Sampling); err != nil {
		return Generation{}, err
	}
	route, ctxLen, err := c.ready(ctx)
	if err != nil {
		return Generation{}, err
	}
	maxTokens, err := ClampMaxTokens(len(req.PromptIDs), req.Sampling.MaxTokens, ctxLen)
	if err != nil {
		return Generation{}, err
	}
	if route == RouteCompletions && (req.ReturnSamplingMask || req.ReturnRoutedExperts) {
		return Generation{}, errors.New("engine: Generate: the /v1/completions fallback cannot return a sampling mask or routed experts; they need POST /inference/v1/generate")
	}
	var body []byte
	if route == RouteGenerate {
		body, err = c.generateBody(&req, maxTokens)
	} else {
		body, err = c.completionsBody(&req, maxTokens)
	}
	if err != nil {
		return Generation{}, err
	}
	var hdr map[string]string
	if req.SessionID != "" && req.SessionID != "default" {
		hdr = map[string]string{"x-session-id": req.SessionID}
	}
	r, err := c.do(ctx, http.MethodPost, string(route), body, hdr)
	if err != nil {
		return Generation{}, err
	}
	if r.status/100 != 2 {
		e := c.httpError(http.MethodPost, string(route), r)
		if route == RouteGenerate && routeMissing(r) {
			e.Hint = "the token-in route is not enabled; see Probe"
		}
		return Generation{}, e
	}
	var g Generation
	if route == RouteGenerate {
		g, err = parseGenerate(r.body, &req)
	} else {
		g, err = parseCompletions(r.body, &req)
	}
	if err != nil {
		return Generation{}, err
	}
	g.MaxTokens = maxTokens
	if c.opts.Observe != nil {
		c.opts.Observe(&req, &g)
	}
	return g, nil
}

// ready returns the route and context length, probing first when the Mode
// is Auto or the context length is still to be learned.
func (c *Client) ready(ctx context.Context) (Route, int, error) {
	needProbe := func() bool {
		c.mu.Lock()
		defer c.mu.Unlock()
		return !c.probed && (c.route == "" || c.contextLen == 0)
	}
	if needProbe() {
		c.probeMu.Lock() // one lazy probe at a time
		var err error
		if needProbe() {
			_, err = c.Probe(ctx)
		}
		c.probeMu.Unlock()
		if err != nil {
			return "", 0, err
		}
	}
	c.mu.Lock()
	defer c.mu.Unlock()
	return c.route, c.contextLen, nil
}

type wireSampling struct {
	MaxTokens                  int               `json:"max_tokens"`
	Temperature                *float64          `json:"temperature,omitempty"`
	TopP                       *float64          `json:"top_p,omitempty"`
	TopK                       *int              `json:"top_k,omitempty"`
	MinP                       *float64          `json:"min_p,omitempty"`
	Seed                       *int64            `json:"seed,omitempty"`
	Stop                       []string          `json:"stop,omitempty"`
	IncludeStopStrInOutput     *bool             `json:"include_stop_str_in_output,omitempty"`
	StopTokenIDs               []int32           `json:"stop_token_ids,omitempty"`
	IgnoreEOS                  bool              `json:"ignore_eos,omitempty"`
	MinTokens                  int               `json:"min_tokens,omitempty"`
	Logprobs                   int               `json:"logprobs"`
	PresencePenalty            *float64          `json:"presence_penalty,omitempty"`
	FrequencyPenalty           *float64          `json:"frequency_penalty,omitempty"`
	RepetitionPenalty          *float64          `json:"repetition_penalty,omitempty"`
	LogitBias                  map[int32]float64 `json:"logit_bias,omitempty"`
	SkipSpecialTokens          bool              `json:"skip_special_tokens"`
	SpacesBetweenSpecialTokens bool              `json:"spaces_between_special_tokens"`
	Detokenize                 *bool             `json:"detokenize,omitempty"`
	ReturnSamplingMask         bool              `json:"return_sampling_mask,omitempty"`
	RoutedExpertsPromptStart   *int              `json:"routed_experts_prompt_start,omitempty"`
}

func wireSamplingOf(p *SamplingParams, maxTokens int) wireSampling {
	w := wireSampling{
		MaxTokens: maxTokens, Temperature: p.Temperature, TopP: p.TopP, TopK: p.TopK, MinP: p.MinP,
		Seed: p.Seed, StopTokenIDs: p.StopTokenIDs, IgnoreEOS: p.IgnoreEOS, MinTokens: p.MinTokens,
		Logprobs: max(p.Logprobs, 1), PresencePenalty: p.PresencePenalty, FrequencyPenalty: p.FrequencyPenalty,
		RepetitionPenalty: p.RepetitionPenalty, LogitBias: p.LogitBias,
	}
	if len(p.Stop) > 0 {
		w.Stop = p.Stop
		inc := p.IncludeStopStrInOutput
		w.IncludeStopStrInOutput = &inc
	}
	return w
}

func (c *Client) generateBody(req *GenerateRequest, maxTokens int) ([]byte, error) {
	sp := wireSamplingOf(&req.Sampling, maxTokens)
	detok := len(req.Sampling.Stop) > 0 // stop strings need text (docs/engine-wire.md §5.3)
	sp.Detokenize = &detok
	sp.ReturnSamplingMask = req.ReturnSamplingMask
	if req.ReturnRoutedExperts {
		zero := 0
		sp.RoutedExpertsPromptStart = &zero
	}
	// The prompt ids are written first, through the memo (a render it
	// read is written as the reply's bytes of it), then the rest of the
	// body by encoding/json.
	type restFields struct {
		SamplingParams wireSampling `json:"sampling_params"`
		Model          string       `json:"model,omitempty"`
		RequestID      string       `json:"request_id,omitempty"`
		CacheSalt      string       `json:"cache_salt,omitempty"`
	}
	rest, err := marshal(restFields{sp, c.opts.Model, req.RequestID, req.CacheSalt})
	if err != nil {
		return nil, err
	}
	b := make([]byte, 0, len(rest)+16+7*len(req.PromptIDs))
	b = append(b, `{"token_ids":`...)
	b = req.Memo.appendPrompt(b, req.PromptIDs)
	b = append(b, ',')
	return append(b, rest[1:]...), nil
}

// appendIDs appends ids as a JSON array, as encoding/json writes an
// []int32 (null for nil).
func appendIDs(b []byte, ids []int32) []byte {
	if ids == nil {
		return append(b, "null"...)
	}
	b = append(b, '[')
	for i, id := range ids {
		if i > 0 {
			b = append(b, ',')
		}
		b = strconv.AppendInt(b, int64(id), 10)
	}
	return append(b, ']')
}

func (c *Client) completionsBody(req *GenerateRequest, maxTokens int) ([]byte, error) {
	p := req.Sampling
	one, zero, zeroF := 1.0, 0, 0.0
	if p.Temperature == nil {
		p.Temperature = &one
	}
	if p.TopP == nil {
		p.TopP = &one
	}
	if p.TopK == nil {
		p.TopK = &zero
	}
	if p.MinP == nil {
		p.MinP = &zeroF
	}
	if p.RepetitionPenalty == nil {
		p.RepetitionPenalty = &one
	}
	// As generateBody: the prompt ids are written through the memo, the
	// rest by encoding/json ("model" first, then "prompt", then the rest:
	// the order encoding/json would write the whole body in).
	sp := wireSamplingOf(&p, maxTokens)
	rest, err := marshal(struct {
		wireSampling
		ReturnTokensAsTokenIDs bool   `json:"return_tokens_as_token_ids"`
		ReturnTokenIDs         bool   `json:"return_token_ids"`
		RequestID              string `json:"request_id,omitempty"`
		CacheSalt              string `json:"cache_salt,omitempty"`
	}{sp, true, true, req.RequestID, req.CacheSalt})
	if err != nil {
		return nil, err
	}
	b := make([]byte, 0, len(c.opts.Model)+len(rest)+32+7*len(req.PromptIDs))
	b = append(b, '{')
	if c.opts.Model != "" {
		m, err := marshal(c.opts.Model)
		if err != nil {
			return nil, err
		}
		b = append(append(append(b, `"model":`...), m...), ',')
	}
	b = append(b, `"prompt":`...)
	b = req.Memo.appendPrompt(b, req.PromptIDs)
	b = append(b, ',')
	return append(b, rest[1:]...), nil
}
