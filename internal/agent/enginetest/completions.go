package enginetest

import (
	"encoding/json"
	"fmt"
	"math"
	"net/http"

	"github.com/kilnrl/kiln/internal/ojson"
)

// handleCompletions serves POST /v1/completions with token-id prompts (the
// fallback of docs/engine-wire.md §6): prompt [int], [[int]], a string or a list of
// strings. Sampling keys are top-level; logprobs k gives the legacy
// completions logprobs object; return_tokens_as_token_ids and
// return_token_ids are honoured. prompt + max_tokens beyond max_model_len
// is a 400, as in vLLM's OpenAI frontend.
func (e *Engine) handleCompletions(w http.ResponseWriter, r *http.Request, body []byte, info *reqInfo) {
	m, ok := e.readRequest(w, body)
	if !ok {
		return
	}
	var prompts [][]int
	raw := m["prompt"]
	one, oneOK := intList(raw)
	var many [][]int
	var str string
	var strs []string
	switch {
	case len(raw) == 0:
		writeError(w, schemaError("prompt", "1 validation error:\n  prompt: Field required"))
		return
	case oneOK && one != nil:
		prompts = [][]int{one}
	case json.Unmarshal(raw, &many) == nil && many != nil:
		prompts = many
	case json.Unmarshal(raw, &str) == nil:
		prompts = [][]int{Encode(str)}
	case json.Unmarshal(raw, &strs) == nil:
		for _, s := range strs {
			prompts = append(prompts, Encode(s))
		}
	default:
		writeError(w, schemaError("prompt", "prompt: Input should be a list of integers, a list of lists of integers, a string or a list of strings"))
		return
	}
	var stream, asIDs, retIDs bool
	_ = json.Unmarshal(m["stream"], &stream)
	_ = json.Unmarshal(m["return_tokens_as_token_ids"], &asIDs)
	_ = json.Unmarshal(m["return_token_ids"], &retIDs)
	if stream {
		writeError(w, &apiError{status: 501, typ: "NotImplementedError", message: "enginetest: streaming completions are not implemented"})
		return
	}
	for i, p := range prompts {
		if len(p) == 0 {
			writeError(w, badRequest("Prompt %d cannot be empty", i))
			return
		}
		if bad, ok := ValidIDs(p); !ok {
			writeError(w, badRequest("Token id %d is out of vocabulary", bad))
			return
		}
	}
	var reqID string
	_ = json.Unmarshal(m["request_id"], &reqID)
	id := "cmpl-" + e.nextID()
	var choices []any
	promptTotal, completionTotal := 0, 0
	var faults []Fault
	for i, p := range prompts {
		remaining := max(1, e.opts.MaxModelLen-len(p))
		sp, aerr := parseSampling(m, 16, remaining)
		if aerr != nil {
			writeError(w, aerr)
			return
		}
		if len(p)+sp.MaxTokens > e.opts.MaxModelLen {
			writeError(w, badRequest("This model's maximum context length is %d tokens. However, you requested %d tokens (%d in the messages, %d in the completion). Please reduce the length of the messages or completion.",
				e.opts.MaxModelLen, len(p)+sp.MaxTokens, len(p), sp.MaxTokens))
			return
		}
		res, aerr := e.generate(r, "/v1/completions", reqID, p, sp)
		if aerr != nil {
			writeError(w, aerr)
			return
		}
		f := e.takeFault(Request{Endpoint: "/v1/completions", SessionID: r.Header.Get("x-session-id"), Turn: res.turn, RequestID: reqID, PromptIDs: p, Params: sp})
		faults = append(faults, f)
		if i == 0 {
			info.turn, info.cached, info.fault = res.turn, res.cached, f
		}
		promptTotal += len(p)
		completionTotal += len(res.ids)
		choice := ojson.Obj("index", i, "text", res.text, "logprobs", completionLogprobs(res, asIDs, f),
			"finish_reason", res.finish, "stop_reason", res.stopReason)
		if retIDs {
			choice.Set("token_ids", res.ids)
		} else {
			choice.Set("token_ids", nil)
		}
		choice.Set("prompt_logprobs", nil)
		if retIDs {
			choice.Set("prompt_token_ids", p)
		} else {
			choice.Set("prompt_token_ids", nil)
		}
		choices = append(choices, choice)
	}
	if !e.wait(r) {
		return
	}
	for _, f := range faults {
		if writeFaultResponse(w, f) {
			return
		}
	}
	writeJSONResponse(w, 200, ojson.Obj("id", id, "object", "text_completion", "created", e.opts.Created, "model", e.opts.ModelName,
		"choices", choices,
		"usage", ojson.Obj("prompt_tokens", promptTotal, "total_tokens", promptTotal+completionTotal, "completion_tokens", completionTotal, "prompt_tokens_details", nil),
		"kv_transfer_params", nil))
}

// completionLogprobs builds the legacy completions logprobs object:
// text_offset, token_logprobs, tokens, top_logprobs (dicts keyed by token
// string, first k+1 entries of the per-position dict, colliding keys merged).
func completionLogprobs(res *genResult, asIDs bool, f Fault) any {
	if res.k < -1 || f == FaultMissingLogprobs {
		return nil
	}
	tokStr := func(id int) string {
		if asIDs {
			return fmt.Sprintf("token_id:%d", id)
		}
		return Decode([]int{id})
	}
	offsets, lps, toks, tops := []int{}, []any{}, []string{}, []any{}
	off := 0
	for i, id := range res.ids {
		lp := res.lps[i]
		if f == FaultNaNLogprob && i == 0 {
			lp = math.NaN()
		}
		offsets = append(offsets, off)
		if !IsSpecial(id) {
			off += len(Decode([]int{id}))
		}
		lps = append(lps, lp)
		toks = append(toks, tokStr(id))
		cands := topCandidates(id, lp, res.ranks[i], res.k)
		if res.k >= 0 {
			cands = cands[:min(len(cands), res.k+1)]
		}
		d := &ojson.Object{}
		for _, c := range cands {
			d.Set(tokStr(c.id), c.lp)
		}
		tops = append(tops, d)
	}
	switch {
	case f == FaultFewerLogprobs && len(lps) > 0:
		lps = lps[:len(lps)-1]
	case f == FaultExtraLogprob && len(lps) > 0:
		lps = append(lps, lps[len(lps)-1])
	}
	return ojson.Obj("text_offset", offsets, "token_logprobs", lps, "tokens", toks, "top_logprobs", tops)
}
