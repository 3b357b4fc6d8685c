package enginetest

import (
	"encoding/json"
	"fmt"
	"math"
	"net/http"
	"slices"
	"strings"
	"time"

	"github.com/kilnrl/kiln/internal/ojson"
)

// SamplingParams are the sampling parameters the engine honours
// (docs/engine-wire.md §5.3), after defaults. Other keys are accepted and ignored,
// as vLLM ignores unknown ones.
type SamplingParams struct {
	MaxTokens              int // effective cap before the context limit
	MaxTokensSet           bool
	Temperature            float64
	TopP                   float64
	TopK                   int
	MinP                   float64
	Seed                   *int64
	MinTokens              int
	StopTokenIDs           []int
	Stop                   []string
	IncludeStopStrInOutput bool
	IgnoreEOS              bool
	Logprobs               *int // nil: no logprobs; -1: full vocabulary
	SkipSpecialTokens      bool
	Detokenize             bool
	N                      int
	// Raw holds every key as sent.
	Raw map[string]json.RawMessage
}

// parseSampling validates the keys of a sampling_params object (or of a
// /v1/completions body) like vLLM. absentMax is the max_tokens default when
// the key is absent; nullMax when it is null.
func parseSampling(raw map[string]json.RawMessage, absentMax, nullMax int) (SamplingParams, *apiError) {
	sp := SamplingParams{Temperature: 1, TopP: 1, SkipSpecialTokens: true, Detokenize: true, N: 1, Raw: raw}
	get := func(key string, dst any) (bool, *apiError) {
		v, ok := raw[key]
		if !ok || string(v) == "null" {
			return false, nil
		}
		if err := json.Unmarshal(v, dst); err != nil {
			return false, schemaError("sampling_params."+key, "sampling_params.%s: invalid value %s", key, v)
		}
		return true, nil
	}
	var errs []*apiError
	chk := func(_ bool, e *apiError) {
		if e != nil {
			errs = append(errs, e)
		}
	}
	sp.MaxTokens = absentMax
	if v, ok := raw["max_tokens"]; ok {
		sp.MaxTokensSet = true
		if string(v) == "null" {
			sp.MaxTokens = nullMax
		} else {
			chk(get("max_tokens", &sp.MaxTokens))
			if sp.MaxTokens < 1 && len(errs) == 0 {
				return sp, badRequest("max_tokens must be at least 1, got %d.", sp.MaxTokens)
			}
		}
	}
	chk(get("temperature", &sp.Temperature))
	chk(get("top_p", &sp.TopP))
	chk(get("top_k", &sp.TopK))
	chk(get("min_p", &sp.MinP))
	var seed int64
	if ok, e := get("seed", &seed); e != nil {
		errs = append(errs, e)
	} else if ok && seed != -1 {
		sp.Seed = &seed
	}
	chk(get("min_tokens", &sp.MinTokens))
	chk(get("stop_token_ids", &sp.StopTokenIDs))
	if v, ok := raw["stop"]; ok && string(v) != "null" {
		var one string
		if json.Unmarshal(v, &one) == nil {
			sp.Stop = []string{one}
		} else {
			chk(get("stop", &sp.Stop))
		}
	}
	chk(get("include_stop_str_in_output", &sp.IncludeStopStrInOutput))
	chk(get("ignore_eos", &sp.IgnoreEOS))
	var lp int
	if ok, e := get("logprobs", &lp); e != nil {
		errs = append(errs, e)
	} else if ok {
		sp.Logprobs = &lp
	}
	chk(get("skip_special_tokens", &sp.SkipSpecialTokens))
	chk(get("detokenize", &sp.Detokenize))
	chk(get("n", &sp.N))
	if len(errs) > 0 {
		return sp, errs[0]
	}
	switch {
	case sp.Temperature < 0 || sp.Temperature > 2:
		return sp, badRequest("temperature must be in [0, 2], got %v.", sp.Temperature)
	case sp.TopP <= 0 || sp.TopP > 1:
		return sp, badRequest("top_p must be in (0, 1], got %v.", sp.TopP)
	case sp.TopK < -1:
		return sp, badRequest("top_k must be 0 (disable), -1 (disable), or at least 1, got %d.", sp.TopK)
	case sp.Logprobs != nil && *sp.Logprobs < -1:
		return sp, badRequest("logprobs must be non-negative or -1, got %d.", *sp.Logprobs)
	case sp.MinTokens < 0 || sp.MinTokens > sp.MaxTokens:
		return sp, badRequest("min_tokens must be greater than or equal to 0 and less than or equal to max_tokens=%d, got %d.", sp.MaxTokens, sp.MinTokens)
	case sp.N != 1:
		return sp, badRequest("enginetest supports n=1 only, got %d.", sp.N)
	case len(sp.Stop) > 0 && !sp.Detokenize:
		return sp, badRequest("stop strings are only supported when detokenize is True. Set detokenize=True to use stop.")
	}
	for _, id := range sp.StopTokenIDs {
		if id < 0 || id >= VocabSize {
			return sp, badRequest("stop_token_ids contains out-of-vocab token id %d", id)
		}
	}
	return sp, nil
}

// genResult is one finished generation.
type genResult struct {
	ids        []int
	lps        []float64
	ranks      []int
	finish     string
	stopReason any // nil, int or string
	text       string
	greedy     bool
	k          int // top-logprob count; -1 = none requested
	cached     int
	turn       int
	weights    []int64 // choices[0].weight_versions; nil: null
}

// generate runs the script for one prompt and applies vLLM's stop rules.
func (e *Engine) generate(r *http.Request, endpoint, reqID string, prompt []int, sp SamplingParams) (*genResult, *apiError) {
	sid := r.Header.Get("x-session-id")
	e.mu.Lock()
	turn := e.turns[sid]
	e.turns[sid]++
	cached := 0
	if e.opts.EnablePromptTokensDetails {
		for _, seq := range e.history[sid] {
			n := 0
			for n < len(seq) && n < len(prompt) && seq[n] == prompt[n] {
				n++
			}
			cached = max(cached, n)
		}
		cached = min(cached, len(prompt)-1) / 16 * 16
	}
	e.mu.Unlock()

	out := e.opts.Script(Request{
		Endpoint: endpoint, SessionID: sid, Turn: turn, RequestID: reqID,
		PromptIDs: slices.Clone(prompt), PromptText: Decode(prompt), Params: sp,
	})
	if out.Err != nil {
		return nil, &apiError{status: 500, typ: "InternalServerError", message: out.Err.Error()}
	}
	ids := out.IDs
	scripted := out.IDs != nil
	if !scripted {
		text := out.Text
		if !out.NoEnd && !strings.HasSuffix(text, "<|im_end|>") {
			text += "<|im_end|>"
		}
		ids = Encode(text)
	}
	if bad, ok := ValidIDs(ids); !ok {
		return nil, &apiError{status: 500, typ: "InternalServerError", message: fmt.Sprintf("enginetest: script produced invalid token id %d", bad)}
	}

	// vLLM v1 check_stop order: length cap first, then (after min_tokens)
	// the tokenizer eos (stop_reason null), then stop_token_ids including
	// generation_config's extra eos ids (stop_reason = the id); stop strings
	// are matched on the detokenized text afterwards.
	capN := min(sp.MaxTokens, max(1, e.opts.MaxModelLen-len(prompt)))
	stopIDs := slices.Clone(sp.StopTokenIDs)
	if !sp.IgnoreEOS {
		stopIDs = append(stopIDs, EndOfText)
	}
	res := &genResult{greedy: sp.Temperature < 1e-5, k: -2, cached: cached, turn: turn}
	var outIDs []int
	stopCut := -1
loop:
	for _, id := range ids {
		outIDs = append(outIDs, id)
		n := len(outIDs)
		if n >= capN {
			res.finish = "length"
			break
		}
		if n < sp.MinTokens {
			continue
		}
		if !sp.IgnoreEOS && id == IMEnd {
			res.finish = "stop"
			break
		}
		if slices.Contains(stopIDs, id) {
			res.finish, res.stopReason = "stop", id
			break
		}
		if len(sp.Stop) > 0 {
			text := decode(outIDs, sp.SkipSpecialTokens)
			for _, s := range sp.Stop {
				if i := strings.Index(text, s); s != "" && i >= 0 {
					res.finish, res.stopReason = "stop", s
					stopCut = i
					if sp.IncludeStopStrInOutput {
						stopCut += len(s)
					}
					break loop
				}
			}
		}
	}
	if res.finish == "" {
		res.finish = "length"
	}
	if out.FinishReason != "" {
		res.finish = out.FinishReason
	}
	res.ids = outIDs
	res.text = decode(outIDs, sp.SkipSpecialTokens)
	if stopCut >= 0 {
		res.text = res.text[:stopCut]
	}
	res.lps = make([]float64, len(outIDs))
	res.ranks = make([]int, len(outIDs))
	for i, id := range outIDs {
		if i < len(out.Logprobs) {
			res.lps[i], res.ranks[i] = out.Logprobs[i], 1
		} else {
			res.lps[i], res.ranks[i] = DefaultLogprob(id, i), defaultRank(id, i, res.greedy)
		}
	}
	if sp.Logprobs != nil {
		res.k = *sp.Logprobs
	}
	switch {
	case out.WeightVersions != nil:
		res.weights = out.WeightVersions
	case e.opts.WeightVersion != nil:
		res.weights = make([]int64, len(outIDs))
		for i := range res.weights {
			res.weights[i] = *e.opts.WeightVersion
		}
	}

	if e.opts.EnablePromptTokensDetails {
		e.mu.Lock()
		e.history[sid] = append(e.history[sid], append(slices.Clone(prompt), outIDs...))
		e.mu.Unlock()
	}
	return res, nil
}

func defaultRank(id, pos int, greedy bool) int {
	if greedy {
		return 1
	}
	return 1 + (id+pos)%2
}

type candidate struct {
	id   int
	lp   float64
	rank int
}

// topCandidates returns the engine's per-position logprob dict as a list:
// the sampled token first, then the top-k by rank (the sampled one not
// repeated), k = -1 meaning the whole vocabulary. Alternatives are
// synthetic: rank j < r gets lp*j/r, rank j > r gets lp-0.5*(j-r).
func topCandidates(id int, lp float64, rank, k int) []candidate {
	if k < 0 {
		k = VocabSize
	}
	out := []candidate{{id, lp, rank}}
	alt := 1
	for j := 1; j <= k && j <= VocabSize; j++ {
		if j == rank {
			continue
		}
		cid := (id + alt*37) % VocabSize
		alt++
		var clp float64
		if j < rank {
			clp = lp * float64(j) / float64(rank)
		} else {
			clp = lp - 0.5*float64(j-rank)
		}
		out = append(out, candidate{cid, clp, j})
	}
	return out
}

func (e *Engine) takeFault(req Request) Fault {
	e.mu.Lock()
	if len(e.faults) > 0 {
		f := e.faults[0]
		e.faults = e.faults[1:]
		e.mu.Unlock()
		return f
	}
	e.mu.Unlock()
	if e.opts.Fault != nil {
		return e.opts.Fault(req)
	}
	return NoFault
}

// wait applies Options.Latency; false when the client went away.
func (e *Engine) wait(r *http.Request) bool {
	e.mu.Lock()
	e.inflight++
	e.mu.Unlock()
	defer func() {
		e.mu.Lock()
		e.inflight--
		e.mu.Unlock()
	}()
	if e.opts.Latency <= 0 {
		return r.Context().Err() == nil
	}
	t := time.NewTimer(e.opts.Latency)
	defer t.Stop()
	select {
	case <-t.C:
		return true
	case <-r.Context().Done():
		e.mu.Lock()
		e.aborted++
		e.mu.Unlock()
		return false
	}
}

// writeFaultResponse handles the faults that replace the whole response.
func writeFaultResponse(w http.ResponseWriter, f Fault) bool {
	switch f {
	case FaultServerError:
		writeError(w, &apiError{status: 500, typ: "InternalServerError", message: "boom"})
	case FaultDetailError:
		writeRaw(w, 500, []byte(`{"detail":"boom"}`))
	case FaultDropConnection:
		cw, ok := w.(*countingWriter)
		if !ok {
			return false
		}
		if hj, ok := cw.ResponseWriter.(http.Hijacker); ok {
			if conn, _, err := hj.Hijack(); err == nil {
				conn.Close()
				return true
			}
		}
		panic(http.ErrAbortHandler)
	default:
		return false
	}
	return true
}

// handleGenerate serves POST /inference/v1/generate (docs/engine-wire.md §5).
func (e *Engine) handleGenerate(w http.ResponseWriter, r *http.Request, body []byte, info *reqInfo) {
	if e.opts.Generate == GenerateUnsupported {
		writeError(w, &apiError{status: 501, typ: "NotImplementedError", message: "The model does not support generate tokens API"})
		return
	}
	m, ok := e.readRequest(w, body)
	if !ok {
		return
	}
	prompt, ok := intList(m["token_ids"])
	if !ok {
		writeError(w, schemaError("token_ids", "1 validation error:\n  token_ids: Field required (a list of integers)"))
		return
	}
	if len(prompt) == 0 {
		writeError(w, schemaError("token_ids", "1 validation error:\n  token_ids: List should have at least 1 item after validation, not 0"))
		return
	}
	if aerr := idsError("token_ids", prompt); aerr != nil {
		writeError(w, aerr)
		return
	}
	var spRaw map[string]json.RawMessage
	if json.Unmarshal(m["sampling_params"], &spRaw) != nil || spRaw == nil {
		writeError(w, schemaError("sampling_params", "1 validation error:\n  sampling_params: Field required (an object)"))
		return
	}
	var stream bool
	_ = json.Unmarshal(m["stream"], &stream)
	if stream {
		writeError(w, &apiError{status: 501, typ: "NotImplementedError", message: "enginetest: streaming generate is not implemented"})
		return
	}
	var outputMode string
	_ = json.Unmarshal(m["output_mode"], &outputMode)
	if outputMode != "" && outputMode != "tokens" {
		writeError(w, &apiError{status: 501, typ: "NotImplementedError", message: "enginetest: output_mode \"text\" is not implemented"})
		return
	}
	remaining := max(1, e.opts.MaxModelLen-len(prompt))
	absentMax := remaining
	if e.opts.Shape == ShapeDisagg {
		absentMax = 16
	}
	sp, aerr := parseSampling(spRaw, absentMax, remaining)
	if aerr != nil {
		writeError(w, aerr)
		return
	}
	if len(prompt) > e.opts.MaxModelLen {
		writeError(w, badRequest("The decoder prompt (length %d) is longer than the maximum model length of %d. Make sure that `max_model_len` is no smaller than the number of text tokens.", len(prompt), e.opts.MaxModelLen))
		return
	}
	var reqID string
	_ = json.Unmarshal(m["request_id"], &reqID)
	if h := r.Header.Get("X-Request-Id"); h != "" {
		reqID = h
	}
	var returnTokenIDs bool
	_ = json.Unmarshal(m["return_token_ids"], &returnTokenIDs)

	res, aerr := e.generate(r, "/inference/v1/generate", reqID, prompt, sp)
	if aerr != nil {
		writeError(w, aerr)
		return
	}
	info.turn, info.cached = res.turn, res.cached
	f := e.takeFault(Request{Endpoint: "/inference/v1/generate", SessionID: r.Header.Get("x-session-id"), Turn: res.turn, RequestID: reqID, PromptIDs: prompt, Params: sp})
	info.fault = f
	if !e.wait(r) {
		return
	}
	if writeFaultResponse(w, f) {
		return
	}
	writeJSONResponse(w, 200, e.generateResponse(res, prompt, reqID, returnTokenIDs, f))
}

func (e *Engine) nextID() string {
	e.mu.Lock()
	defer e.mu.Unlock()
	e.ids++
	return fmt.Sprintf("%032x", e.ids)
}

func (e *Engine) generateResponse(res *genResult, prompt []int, reqID string, returnTokenIDs bool, f Fault) *ojson.Object {
	shape := e.opts.Shape
	var logprobs any
	if res.k >= -1 && f != FaultMissingLogprobs {
		logprobs = ojson.Obj("content", logprobsContent(res, shape, f))
	}
	n := len(res.ids)
	usageN := n
	if f == FaultUsageMismatch {
		usageN++
	}
	var details any
	if e.opts.EnablePromptTokensDetails {
		details = ojson.Obj("cached_tokens", res.cached)
	}
	usage := ojson.Obj("prompt_tokens", len(prompt), "total_tokens", len(prompt)+usageN, "completion_tokens", usageN, "prompt_tokens_details", details)
	choice := &ojson.Object{}
	choice.Set("index", 0)
	if shape != ShapeTokenIDs {
		choice.Set("logprobs", logprobs)
	}
	choice.Set("finish_reason", res.finish)
	if shape != ShapeDisagg {
		choice.Set("stop_reason", res.stopReason)
	}
	if f != FaultMissingTokenIDs {
		choice.Set("token_ids", res.ids)
	}
	if shape == ShapeTokenIDs {
		choice.Set("logprobs", logprobs)
	}
	if shape != ShapeDisagg {
		choice.Set("routed_experts", nil)
	}
	if shape == ShapeTokenIDs {
		choice.Set("sampling_mask", nil)
		var weights any
		if res.weights != nil {
			weights = res.weights
		}
		choice.Set("weight_versions", weights)
	}
	switch shape {
	case ShapeDisagg:
		resp := ojson.Obj("request_id", e.nextID(), "choices", []any{choice}, "prompt_logprobs", nil, "kv_transfer_params", nil)
		if f == FaultUsageMismatch {
			resp.Set("usage", usage)
		}
		return resp
	case ShapeScaleOut:
		return ojson.Obj("request_id", engineRequestID(reqID, e), "model", e.opts.ModelName, "created", e.opts.Created,
			"choices", []any{choice}, "usage", usage, "prompt_logprobs", nil, "kv_transfer_params", nil)
	default:
		var promptIDs any
		if returnTokenIDs {
			promptIDs = prompt
		}
		return ojson.Obj("request_id", engineRequestID(reqID, e), "output_mode", "tokens", "model", e.opts.ModelName,
			"created", e.opts.Created, "choices", []any{choice}, "usage", usage,
			"prompt_token_ids", promptIDs, "mm_placeholders", nil, "metrics", nil,
			"prompt_logprobs", nil, "prompt_token_id_logprobs", nil,
			"kv_transfer_params", nil, "ec_transfer_params", nil)
	}
}

// logprobsContent builds logprobs.content of a generate reply as values
// for ojson.Append, in each shape.
func logprobsContent(res *genResult, shape ResponseShape, f Fault) []any {
	label := func(id int) any {
		if shape == ShapeTokenIDs {
			return id
		}
		return fmt.Sprintf("token_id:%d", id)
	}
	var content []any
	for i, id := range res.ids {
		lp, id := entryFault(res, i, id, f)
		var tops []any
		for _, c := range entryCandidates(res, i, id, lp) {
			switch shape {
			case ShapeTokenIDs:
				tops = append(tops, ojson.Obj("token_id", c.id, "logprob", c.lp, "rank", c.rank))
			case ShapeScaleOut:
				tops = append(tops, ojson.Obj("token", label(c.id), "logprob", c.lp, "bytes", nil))
			case ShapeDisagg:
				tops = append(tops, ojson.Obj("token", label(id), "logprob", c.lp, "bytes", nil))
			}
		}
		if shape == ShapeTokenIDs {
			content = append(content, ojson.Obj("token_id", id, "logprob", lp, "rank", res.ranks[i], "top_logprobs", tops))
		} else {
			content = append(content, ojson.Obj("token", label(id), "logprob", lp, "bytes", nil, "top_logprobs", tops))
		}
	}
	switch {
	case f == FaultFewerLogprobs && len(content) > 0:
		content = content[:len(content)-1]
	case f == FaultExtraLogprob && len(content) > 0:
		content = append(content, content[len(content)-1])
	}
	if content == nil {
		content = []any{}
	}
	return content
}

// entryFault is output position i's reported logprob and id under fault f.
func entryFault(res *genResult, i, id int, f Fault) (float64, int) {
	lp := res.lps[i]
	if f == FaultNaNLogprob && i == 0 {
		lp = math.NaN()
	}
	if f == FaultMismatchedTokenID && i == 0 {
		id = (id + 1) % VocabSize
	}
	return lp, id
}

// entryCandidates is position i's top_logprobs: max(k, 1) candidates, the
// whole vocabulary for k = -1.
func entryCandidates(res *genResult, i, id int, lp float64) []candidate {
	if res.k == -1 {
		return topCandidates(id, lp, res.ranks[i], -1)
	}
	cands := topCandidates(id, lp, res.ranks[i], res.k)
	return cands[:min(len(cands), max(res.k, 1))]
}

func engineRequestID(reqID string, e *Engine) string {
	if reqID == "" {
		reqID = e.nextID()
	}
	return "generate-tokens-" + reqID
}
