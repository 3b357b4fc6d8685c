package engine

import (
	"bytes"
	"encoding/json"
	"fmt"
	"math"
	"strconv"
	"strings"
)

// Shape names the response layout a generation was read from
// (docs/engine-wire.md §5.4, §6).
type Shape int

const (
	ShapeUnknown Shape = iota
	// ShapeDisagg (A): serve/disagg era, v0.14–v0.18 (and v0.11.x): no usage,
	// logprob ids only as "token_id:N" strings.
	ShapeDisagg
	// ShapeScaleOut (B): scale_out before PR #58181: adds model, created,
	// usage, routed_experts; ids still "token_id:N".
	ShapeScaleOut
	// ShapeTokenIDs (C): newest: integer token_id (+rank) in logprobs,
	// output_mode, prompt_token_ids, sampling_mask.
	ShapeTokenIDs
	// ShapeCompletions: legacy /v1/completions logprobs (docs/engine-wire.md §6).
	ShapeCompletions
)

func (s Shape) String() string {
	switch s {
	case ShapeDisagg:
		return "generate/A (serve/disagg)"
	case ShapeScaleOut:
		return "generate/B (scale_out, string ids)"
	case ShapeTokenIDs:
		return "generate/C (integer token_id)"
	case ShapeCompletions:
		return "completions"
	}
	return "unknown"
}

// wire types: every field raw, so that each absence and type error is
// reported precisely.
type wireResponse struct {
	Choices        json.RawMessage `json:"choices"`
	Usage          json.RawMessage `json:"usage"`
	Model          json.RawMessage `json:"model"`
	Created        json.RawMessage `json:"created"`
	OutputMode     json.RawMessage `json:"output_mode"`
	PromptTokenIDs json.RawMessage `json:"prompt_token_ids"`
}

type wireChoice struct {
	TokenIDs      json.RawMessage `json:"token_ids"`
	Logprobs      json.RawMessage `json:"logprobs"`
	FinishReason  json.RawMessage `json:"finish_reason"`
	StopReason    json.RawMessage `json:"stop_reason"`
	SamplingMask  json.RawMessage `json:"sampling_mask"`
	RoutedExperts json.RawMessage `json:"routed_experts"`
	// WeightVersions is read by weightVersions, never validated.
	WeightVersions json.RawMessage `json:"weight_versions"`
}

type wireEntry struct {
	TokenID     json.RawMessage `json:"token_id"`
	Token       json.RawMessage `json:"token"`
	Logprob     json.RawMessage `json:"logprob"`
	TopLogprobs json.RawMessage `json:"top_logprobs"`
}

// sanitizeNonFinite turns Python's bare NaN / Infinity / -Infinity (which
// json.dumps emits and Go rejects) outside strings into strings, so that the
// value is reported as a non-finite logprob rather than as broken JSON.
func sanitizeNonFinite(b []byte) []byte {
	if !bytes.Contains(b, []byte("NaN")) && !bytes.Contains(b, []byte("Infinity")) {
		return b
	}
	out := make([]byte, 0, len(b)+16)
	inStr, esc := false, false
	for i := 0; i < len(b); i++ {
		ch := b[i]
		if inStr {
			out = append(out, ch)
			switch {
			case esc:
				esc = false
			case ch == '\\':
				esc = true
			case ch == '"':
				inStr = false
			}
			continue
		}
		switch {
		case ch == '"':
			inStr = true
		case bytes.HasPrefix(b[i:], []byte("NaN")):
			out = append(out, `"NaN"`...)
			i += 2
			continue
		case bytes.HasPrefix(b[i:], []byte("Infinity")):
			out = append(out, `"Infinity"`...)
			i += 7
			continue
		case bytes.HasPrefix(b[i:], []byte("-Infinity")):
			out = append(out, `"-Infinity"`...)
			i += 8
			continue
		}
		out = append(out, ch)
	}
	return out
}

func decodeTop(route string, body []byte) (wireResponse, wireChoice, error) {
	var resp wireResponse
	body = sanitizeNonFinite(body)
	t := bytes.TrimSpace(body)
	if len(t) == 0 || t[0] != '{' {
		return resp, wireChoice{}, replyErr(route, ReasonBadJSON, "reply is not a JSON object: %s", clip(body, 200))
	}
	if err := json.Unmarshal(t, &resp); err != nil {
		return resp, wireChoice{}, replyErr(route, ReasonBadJSON, "%v: %s", err, clip(body, 200))
	}
	var choices []json.RawMessage
	if isNull(resp.Choices) {
		return resp, wireChoice{}, replyErr(route, ReasonNoChoices, "choices missing")
	}
	if err := json.Unmarshal(resp.Choices, &choices); err != nil {
		return resp, wireChoice{}, replyErr(route, ReasonNoChoices, "choices is not a list: %v", err)
	}
	if len(choices) == 0 {
		return resp, wireChoice{}, replyErr(route, ReasonNoChoices, "choices is empty")
	}
	if len(choices) > 1 {
		return resp, wireChoice{}, replyErr(route, ReasonExtraChoices, "%d choices, asked for 1", len(choices))
	}
	var ch wireChoice
	if err := json.Unmarshal(choices[0], &ch); err != nil {
		return resp, wireChoice{}, replyErr(route, ReasonBadJSON, "choices[0] is not an object: %v", err)
	}
	return resp, ch, nil
}

// tokenIDList reads a JSON list of token ids.
func tokenIDList(route, what string, raw json.RawMessage) ([]int32, error) {
	if isNull(raw) {
		return nil, replyErr(route, ReasonMissingTokenIDs, "%s missing", what)
	}
	var items []json.RawMessage
	if err := json.Unmarshal(raw, &items); err != nil {
		return nil, replyErr(route, ReasonMissingTokenIDs, "%s is not a list: %v", what, err)
	}
	ids := make([]int32, len(items))
	for i, it := range items {
		id, ok := tokenID(it)
		if !ok {
			return nil, replyErr(route, ReasonBadTokenID, "%s[%d] = %s is not a non-negative int32 token id", what, i, clip(it, 40))
		}
		ids[i] = id
	}
	return ids, nil
}

// tokenID reads a token id: a base-10 integer in [0, MaxInt32], white
// space around it aside. It reads every text as strconv.ParseInt(s, 10,
// 64) followed by that range check reads it (a sign, then digits only),
// without ParseInt's copy of the text into a string (which its error
// keeps, so it escapes): one allocation per id, 300 a turn, otherwise
// (BenchmarkDecodeIDs).
func tokenID(raw []byte) (int32, bool) {
	b := bytes.TrimSpace(raw)
	neg := false
	if len(b) > 0 && (b[0] == '-' || b[0] == '+') {
		neg, b = b[0] == '-', b[1:]
	}
	if len(b) == 0 {
		return 0, false
	}
	var v int64
	for _, c := range b {
		if c < '0' || c > '9' {
			return 0, false
		}
		if v <= math.MaxInt32 {
			v = v*10 + int64(c-'0')
		}
	}
	if v > math.MaxInt32 || neg && v != 0 {
		return 0, false
	}
	return int32(v), true
}

// labelID reads "token_id:N" (return_tokens_as_token_ids form).
func labelID(s string) (int32, bool) {
	rest, ok := strings.CutPrefix(s, "token_id:")
	if !ok {
		return 0, false
	}
	v, err := strconv.ParseInt(rest, 10, 64)
	if err != nil || v < 0 || v > math.MaxInt32 {
		return 0, false
	}
	return int32(v), true
}

// logprobValue reads a logprob: absent/null → missing; non-number or
// non-finite → non-finite.
func logprobValue(route, where string, raw json.RawMessage) (float32, error) {
	if isNull(raw) {
		return 0, replyErr(route, ReasonMissingLogprobs, "%s: logprob missing", where)
	}
	var f float64
	var err error
	if t := bytes.TrimSpace(raw); len(t) > 0 && (t[0] == '-' || (t[0] >= '0' && t[0] <= '9')) {
		f, err = strconv.ParseFloat(string(t), 64) // a JSON number (the common case)
	} else {
		err = json.Unmarshal(raw, &f)
	}
	if err != nil {
		return 0, replyErr(route, ReasonNonFiniteLogprob, "%s: logprob %s is not a finite number", where, clip(raw, 40))
	}
	if math.IsNaN(f) || math.IsInf(f, 0) || math.IsInf(float64(float32(f)), 0) {
		return 0, replyErr(route, ReasonNonFiniteLogprob, "%s: logprob %v is not finite", where, f)
	}
	return float32(f), nil
}

// entryID resolves a chat-shape logprob entry's id: integer token_id first
// (shape C), else "token_id:N" in token (A, B); ok=false when the entry
// carries neither (then it is zipped with token_ids, docs/engine-wire.md §10.3).
func entryID(route, where string, e *wireEntry) (id int32, ok bool, err error) {
	var fromInt, fromLabel int32
	hasInt, hasLabel := false, false
	if !isNull(e.TokenID) {
		v, good := tokenID(e.TokenID)
		if !good {
			return 0, false, replyErr(route, ReasonBadTokenID, "%s: token_id %s is not a non-negative int32", where, clip(e.TokenID, 40))
		}
		fromInt, hasInt = v, true
	}
	if !isNull(e.Token) {
		var s string
		if json.Unmarshal(e.Token, &s) != nil {
			s = ""
		}
		if strings.HasPrefix(s, "token_id:") {
			v, good := labelID(s)
			if !good {
				return 0, false, replyErr(route, ReasonBadTokenID, "%s: token %q is not token_id:<non-negative int32>", where, s)
			}
			fromLabel, hasLabel = v, true
		}
	}
	switch {
	case hasInt && hasLabel && fromInt != fromLabel:
		return 0, false, replyErr(route, ReasonTokenMismatch, "%s: token_id %d but token %q", where, fromInt, "token_id:"+strconv.Itoa(int(fromLabel)))
	case hasInt:
		return fromInt, true, nil
	case hasLabel:
		return fromLabel, true, nil
	}
	return 0, false, nil
}

func finishReason(route string, raw json.RawMessage) (string, error) {
	if isNull(raw) {
		return "stop", nil // absent: vLLM's default (docs/engine-wire.md §5.4 A), docs/adapter.md §1.3
	}
	var s string
	if err := json.Unmarshal(raw, &s); err != nil {
		return "", replyErr(route, ReasonBadFinishReason, "finish_reason %s is not a string", clip(raw, 40))
	}
	switch s {
	case "", "stop":
		return "stop", nil
	case "length", "abort":
		return s, nil
	case "error":
		return "", replyErr(route, ReasonEngineError, `finish_reason "error": the engine failed the request`)
	}
	return "", replyErr(route, ReasonBadFinishReason, "unknown finish_reason %q (want stop, length or abort)", s)
}

func stopReason(route string, raw json.RawMessage) (StopReason, error) {
	if isNull(raw) {
		return StopReason{}, nil
	}
	if id, ok := tokenID(raw); ok {
		return StopReason{TokenID: id, IsTokenID: true}, nil
	}
	var s string
	if err := json.Unmarshal(raw, &s); err == nil {
		return StopReason{Text: s, IsText: true}, nil
	}
	return StopReason{}, replyErr(route, ReasonBadFinishReason, "stop_reason %s is neither a token id nor a string", clip(raw, 40))
}

// checkUsage: usage present and non-empty → completion_tokens (0 when
// absent) must equal the output length (docs/adapter.md §2.4 item 2).
func checkUsage(route string, raw json.RawMessage, n int, g *Generation) error {
	g.PromptTokens, g.CachedTokens = -1, -1
	if isNull(raw) {
		return nil
	}
	u, err := usageJSON(route, raw)
	if err != nil {
		return err
	}
	if !u.fields {
		return nil
	}
	if u.completion != n {
		return replyErr(route, ReasonUsageMismatch, "usage.completion_tokens = %d but %d output ids", u.completion, n)
	}
	g.PromptTokens, g.CachedTokens = u.prompt, u.cached
	return nil
}

// usageCounts is what checkUsage reads of a usage object.
type usageCounts struct {
	fields     bool // the object has a field (it is not {})
	completion int  // 0 when absent or null
	prompt     int  // -1 when absent or null
	cached     int  // prompt_tokens_details.cached_tokens; -1 when absent or null
}

// usageJSON reads any usage value with encoding/json: an object, or an
// error; a completion_tokens that is not an int is an error, other counts
// that cannot be read are -1.
func usageJSON(route string, raw json.RawMessage) (usageCounts, error) {
	u := usageCounts{prompt: -1, cached: -1}
	var fields map[string]json.RawMessage
	if err := json.Unmarshal(raw, &fields); err != nil {
		return u, replyErr(route, ReasonBadJSON, "usage is not an object: %v", err)
	}
	u.fields = len(fields) > 0
	if v, ok := fields["completion_tokens"]; ok && !isNull(v) {
		if err := json.Unmarshal(v, &u.completion); err != nil {
			return u, replyErr(route, ReasonUsageMismatch, "usage.completion_tokens %s is not an int", clip(v, 40))
		}
	}
	if v, ok := fields["prompt_tokens"]; ok && !isNull(v) {
		if json.Unmarshal(v, &u.prompt) != nil {
			u.prompt = -1
		}
	}
	if v, ok := fields["prompt_tokens_details"]; ok && !isNull(v) {
		var d struct {
			CachedTokens *int `json:"cached_tokens"`
		}
		if json.Unmarshal(v, &d) == nil && d.CachedTokens != nil {
			u.cached = *d.CachedTokens
		}
	}
	return u, nil
}

// parseGenerate reads and validates a POST /inference/v1/generate reply
// (shapes A, B, C of docs/engine-wire.md §5.4) with encoding/json one level
// at a time, each field kept raw until it is read, and words every error.
func parseGenerate(body []byte, req *GenerateRequest) (Generation, error) {
	const route = string(RouteGenerate)
	resp, ch, err := decodeTop(route, body)
	if err != nil {
		return Generation{}, err
	}
	g := Generation{Route: RouteGenerate}
	if g.OutputIDs, err = tokenIDList(route, "choices[0].token_ids", ch.TokenIDs); err != nil {
		return Generation{}, err
	}
	n := len(g.OutputIDs)
	if g.FinishReason, err = finishReason(route, ch.FinishReason); err != nil {
		return Generation{}, err
	}
	if g.StopReason, err = stopReason(route, ch.StopReason); err != nil {
		return Generation{}, err
	}
	if isNull(ch.Logprobs) {
		return Generation{}, replyErr(route, ReasonMissingLogprobs, "choices[0].logprobs missing: vLLM must return sampled-token logprobs for token-exact training")
	}
	var lp struct {
		Content json.RawMessage `json:"content"`
	}
	if err := json.Unmarshal(ch.Logprobs, &lp); err != nil {
		return Generation{}, replyErr(route, ReasonMissingLogprobs, "choices[0].logprobs is not an object: %v", err)
	}
	if isNull(lp.Content) {
		return Generation{}, replyErr(route, ReasonMissingLogprobs, "choices[0].logprobs.content missing")
	}
	wantTop := req.Sampling.Logprobs > 0
	var entries []wireEntry
	if err := json.Unmarshal(lp.Content, &entries); err != nil {
		return Generation{}, replyErr(route, ReasonMissingLogprobs, "choices[0].logprobs.content is not a list of objects: %v", err)
	}
	if len(entries) != n {
		return Generation{}, replyErr(route, ReasonLengthMismatch, "%d logprob entries for %d output ids", len(entries), n)
	}
	g.LogProbs = make([]float32, n)
	intIDs := false
	if wantTop {
		g.TopLogProbs = make([][]TopLogProb, n)
	}
	for i := range entries {
		e := &entries[i]
		where := "logprobs.content[" + strconv.Itoa(i) + "]"
		if g.LogProbs[i], err = logprobValue(route, where, e.Logprob); err != nil {
			return Generation{}, err
		}
		id, ok, err := entryID(route, where, e)
		if err != nil {
			return Generation{}, err
		}
		if ok && id != g.OutputIDs[i] {
			return Generation{}, replyErr(route, ReasonTokenMismatch, "%s is for token %d but token_ids[%d] = %d", where, id, i, g.OutputIDs[i])
		}
		intIDs = intIDs || !isNull(e.TokenID)
		if wantTop {
			if g.TopLogProbs[i], err = chatTop(route, where, e.TopLogprobs, g.OutputIDs[i], req.Sampling.Logprobs); err != nil {
				return Generation{}, err
			}
		}
	}
	return finishGenerate(route, g, resp, ch, req, intIDs)
}

// finishGenerate checks usage, names the shape and reads the optional
// replay fields of a generate reply whose ids and logprobs are read.
func finishGenerate(route string, g Generation, resp wireResponse, ch wireChoice, req *GenerateRequest, intIDs bool) (Generation, error) {
	n := len(g.OutputIDs)
	var err error
	if err := checkUsage(route, resp.Usage, n, &g); err != nil {
		return Generation{}, err
	}
	switch {
	case intIDs || !isNull(resp.OutputMode) || !isNull(resp.PromptTokenIDs):
		g.Shape = ShapeTokenIDs
	case !isNull(resp.Model) || !isNull(resp.Usage) || !isNull(resp.Created):
		g.Shape = ShapeScaleOut
	default:
		g.Shape = ShapeDisagg
	}
	if req.ReturnSamplingMask {
		if g.TopPTokenIDs, g.TopPTokenOffsets, err = samplingMask(route, ch.SamplingMask, g.OutputIDs); err != nil {
			return Generation{}, err
		}
	}
	g.WeightVersions = weightVersions(ch.WeightVersions)
	if req.ReturnRoutedExperts && n > 0 {
		if isNull(ch.RoutedExperts) {
			return Generation{}, replyErr(route, ReasonMissingRoutedExperts, "choices[0].routed_experts missing: vLLM must return routed experts for routing replay (server needs enable_return_routed_experts)")
		}
		if g.RoutedExperts, g.RoutedExpertsShape, err = routedExperts(route, ch.RoutedExperts, len(req.PromptIDs)+n-1); err != nil {
			return Generation{}, err
		}
	}
	return g, nil
}

// chatTop reads one position's top_logprobs (chat shape). Rows hold the
// sampled token first, then rank order, k or k+1 entries.
func chatTop(route, where string, raw json.RawMessage, sampled int32, k int) ([]TopLogProb, error) {
	if isNull(raw) {
		return nil, replyErr(route, ReasonBadTopLogprobs, "%s.top_logprobs missing (asked for %d)", where, k)
	}
	var items []wireEntry
	if err := json.Unmarshal(raw, &items); err != nil {
		return nil, replyErr(route, ReasonBadTopLogprobs, "%s.top_logprobs is not a list of objects: %v", where, err)
	}
	out := make([]TopLogProb, len(items))
	for j := range items {
		w := fmt.Sprintf("%s.top_logprobs[%d]", where, j)
		id, ok, err := entryID(route, w, &items[j])
		if err != nil {
			return nil, err
		}
		if !ok {
			return nil, replyErr(route, ReasonBadTopLogprobs, "%s carries no token id", w)
		}
		lp, err := logprobValue(route, w, items[j].Logprob)
		if err != nil {
			return nil, err
		}
		out[j] = TopLogProb{ID: id, LogProb: lp}
	}
	return checkTopRow(route, where, out, sampled, k)
}

func checkTopRow(route, where string, row []TopLogProb, sampled int32, k int) ([]TopLogProb, error) {
	if len(row) == 0 || len(row) > k+1 {
		return nil, replyErr(route, ReasonBadTopLogprobs, "%s: %d top logprobs, asked for %d", where, len(row), k)
	}
	seen := make(map[int32]struct{}, len(row))
	for _, t := range row {
		if _, dup := seen[t.ID]; dup {
			return nil, replyErr(route, ReasonBadTopLogprobs, "%s: token %d listed twice among the top logprobs (the serve/disagg-era label bug, vLLM v0.14–v0.18: candidate ids are unreliable there)", where, t.ID)
		}
		seen[t.ID] = struct{}{}
	}
	if _, ok := seen[sampled]; !ok {
		return nil, replyErr(route, ReasonBadTopLogprobs, "%s: the sampled token %d is not among the top logprobs", where, sampled)
	}
	return row, nil
}

// weightVersions reads choices[0].weight_versions (docs/engine-wire.md
// §10.4) for Generation.WeightVersions: a list whose every element is a
// JSON integer (read as an int64, written back in decimal) or a string.
// Anything else is no list (nil): absent, null, an empty list, another
// type, a list holding a fraction, an exponent, a number past int64,
// null, a bool or an object. Both readings of a generate reply call it on
// the same bytes, so they agree. A run of equal entries shares one string.
func weightVersions(raw json.RawMessage) []string {
	if isNull(raw) {
		return nil
	}
	var items []json.RawMessage
	if json.Unmarshal(raw, &items) != nil || len(items) == 0 {
		return nil
	}
	out := make([]string, len(items))
	var prev json.RawMessage
	for i, it := range items {
		if i > 0 && bytes.Equal(it, prev) {
			out[i] = out[i-1]
			continue
		}
		switch {
		case len(it) > 0 && it[0] == '"':
			if json.Unmarshal(it, &out[i]) != nil {
				return nil
			}
		default:
			n, err := strconv.ParseInt(string(it), 10, 64)
			if err != nil {
				return nil
			}
			out[i] = strconv.FormatInt(n, 10)
		}
		prev = it
	}
	return out
}

// samplingMask flattens choices[0].sampling_mask ([[int]] per output token)
// to CSR ids/offsets; every row must hold its sampled token.
func samplingMask(route string, raw json.RawMessage, out []int32) ([]int32, []int32, error) {
	if isNull(raw) {
		if len(out) == 0 {
			return []int32{}, []int32{0}, nil
		}
		return nil, nil, replyErr(route, ReasonMissingSamplingMask, "choices[0].sampling_mask missing: vLLM must return nucleus token ids for top-p replay (upstream: --return-sampling-mask)")
	}
	var rows [][]json.RawMessage
	if err := json.Unmarshal(raw, &rows); err != nil {
		return nil, nil, replyErr(route, ReasonBadSamplingMask, "sampling_mask is not a list of id lists: %v", err)
	}
	if len(rows) != len(out) {
		return nil, nil, replyErr(route, ReasonBadSamplingMask, "sampling_mask has %d rows for %d output ids", len(rows), len(out))
	}
	ids := make([]int32, 0, len(rows))
	offs := make([]int32, 1, len(rows)+1)
	for i, row := range rows {
		has := false
		for j, it := range row {
			id, ok := tokenID(it)
			if !ok {
				return nil, nil, replyErr(route, ReasonBadSamplingMask, "sampling_mask[%d][%d] = %s is not a token id", i, j, clip(it, 40))
			}
			has = has || id == out[i]
			ids = append(ids, id)
		}
		if !has {
			return nil, nil, replyErr(route, ReasonBadSamplingMask, "sampling_mask[%d] lacks the sampled token %d", i, out[i])
		}
		if len(ids) > math.MaxInt32 {
			return nil, nil, replyErr(route, ReasonBadSamplingMask, "sampling_mask too large")
		}
		offs = append(offs, int32(len(ids)))
	}
	return ids, offs, nil
}

// wire types of the legacy completions logprobs (docs/engine-wire.md §6).
type wireCompletionsChoice struct {
	TokenIDs     json.RawMessage `json:"token_ids"`
	Logprobs     json.RawMessage `json:"logprobs"`
	FinishReason json.RawMessage `json:"finish_reason"`
	StopReason   json.RawMessage `json:"stop_reason"`
}

type wireCompletionsLogprobs struct {
	Tokens        json.RawMessage `json:"tokens"`
	TokenLogprobs json.RawMessage `json:"token_logprobs"`
	TopLogprobs   json.RawMessage `json:"top_logprobs"`
}

// parseCompletions reads and validates a POST /v1/completions reply made with
// a token-id prompt, return_tokens_as_token_ids and return_token_ids (docs/engine-wire.md §6).
// Output ids come from choices[0].token_ids when present (servers since
// ~2025-08) and are checked against the "token_id:N" labels; older servers
// give only the labels.
func parseCompletions(body []byte, req *GenerateRequest) (Generation, error) {
	const route = string(RouteCompletions)
	resp, _, err := decodeTop(route, body)
	if err != nil {
		return Generation{}, err
	}
	var choices []json.RawMessage
	_ = json.Unmarshal(resp.Choices, &choices) // checked by decodeTop
	var ch wireCompletionsChoice
	if err := json.Unmarshal(choices[0], &ch); err != nil {
		return Generation{}, replyErr(route, ReasonBadJSON, "choices[0]: %v", err)
	}
	g := Generation{Route: RouteCompletions, Shape: ShapeCompletions}
	if g.FinishReason, err = finishReason(route, ch.FinishReason); err != nil {
		return Generation{}, err
	}
	if g.StopReason, err = stopReason(route, ch.StopReason); err != nil {
		return Generation{}, err
	}
	if isNull(ch.Logprobs) {
		return Generation{}, replyErr(route, ReasonMissingLogprobs, "choices[0].logprobs missing: vLLM must return sampled-token logprobs for token-exact training")
	}
	var lp wireCompletionsLogprobs
	if err := json.Unmarshal(ch.Logprobs, &lp); err != nil {
		return Generation{}, replyErr(route, ReasonMissingLogprobs, "choices[0].logprobs is not an object: %v", err)
	}
	if isNull(lp.TokenLogprobs) {
		return Generation{}, replyErr(route, ReasonMissingLogprobs, "choices[0].logprobs.token_logprobs missing")
	}
	var values []json.RawMessage
	if err := json.Unmarshal(lp.TokenLogprobs, &values); err != nil {
		return Generation{}, replyErr(route, ReasonMissingLogprobs, "token_logprobs is not a list: %v", err)
	}
	var labels []string
	if !isNull(lp.Tokens) {
		if err := json.Unmarshal(lp.Tokens, &labels); err != nil {
			return Generation{}, replyErr(route, ReasonBadJSON, "logprobs.tokens is not a list of strings: %v", err)
		}
		if len(labels) != len(values) {
			return Generation{}, replyErr(route, ReasonLengthMismatch, "%d logprobs.tokens for %d token_logprobs", len(labels), len(values))
		}
	}
	if !isNull(ch.TokenIDs) {
		if g.OutputIDs, err = tokenIDList(route, "choices[0].token_ids", ch.TokenIDs); err != nil {
			return Generation{}, err
		}
	} else {
		if labels == nil {
			return Generation{}, replyErr(route, ReasonMissingTokenIDs, "neither choices[0].token_ids nor logprobs.tokens")
		}
		g.OutputIDs = make([]int32, len(labels))
		for i, s := range labels {
			id, ok := labelID(s)
			if !ok {
				return Generation{}, replyErr(route, ReasonMissingTokenIDs, "no choices[0].token_ids and logprobs.tokens[%d] = %q is not token_id:<id> (the server ignored return_tokens_as_token_ids)", i, s)
			}
			g.OutputIDs[i] = id
		}
	}
	n := len(g.OutputIDs)
	if len(values) != n {
		return Generation{}, replyErr(route, ReasonLengthMismatch, "%d logprob entries for %d output ids", len(values), n)
	}
	g.LogProbs = make([]float32, n)
	for i := range values {
		where := fmt.Sprintf("logprobs.token_logprobs[%d]", i)
		if g.LogProbs[i], err = logprobValue(route, where, values[i]); err != nil {
			return Generation{}, err
		}
		if labels != nil && strings.HasPrefix(labels[i], "token_id:") {
			id, ok := labelID(labels[i])
			if !ok {
				return Generation{}, replyErr(route, ReasonBadTokenID, "logprobs.tokens[%d] = %q", i, labels[i])
			}
			if id != g.OutputIDs[i] {
				return Generation{}, replyErr(route, ReasonTokenMismatch, "logprobs.tokens[%d] is for token %d but token_ids[%d] = %d", i, id, i, g.OutputIDs[i])
			}
		}
	}
	if err := checkUsage(route, resp.Usage, n, &g); err != nil {
		return Generation{}, err
	}
	if k := req.Sampling.Logprobs; k > 0 {
		if g.TopLogProbs, err = completionsTop(route, lp.TopLogprobs, g.OutputIDs, k); err != nil {
			return Generation{}, err
		}
	}
	return g, nil
}

// completionsTop reads top_logprobs: [{"token_id:N": float} | null], keys in
// the server's order.
func completionsTop(route string, raw json.RawMessage, out []int32, k int) ([][]TopLogProb, error) {
	if isNull(raw) {
		return nil, replyErr(route, ReasonBadTopLogprobs, "logprobs.top_logprobs missing (asked for %d)", k)
	}
	var rows []json.RawMessage
	if err := json.Unmarshal(raw, &rows); err != nil {
		return nil, replyErr(route, ReasonBadTopLogprobs, "logprobs.top_logprobs is not a list: %v", err)
	}
	if len(rows) != len(out) {
		return nil, replyErr(route, ReasonLengthMismatch, "%d top_logprobs rows for %d output ids", len(rows), len(out))
	}
	res := make([][]TopLogProb, len(rows))
	for i, r := range rows {
		where := fmt.Sprintf("logprobs.top_logprobs[%d]", i)
		if isNull(r) {
			return nil, replyErr(route, ReasonBadTopLogprobs, "%s is null", where)
		}
		dec := json.NewDecoder(bytes.NewReader(r))
		if t, err := dec.Token(); err != nil || t != json.Delim('{') {
			return nil, replyErr(route, ReasonBadTopLogprobs, "%s is not an object", where)
		}
		var row []TopLogProb
		for dec.More() {
			kt, err := dec.Token()
			if err != nil {
				return nil, replyErr(route, ReasonBadTopLogprobs, "%s: %v", where, err)
			}
			key, _ := kt.(string)
			id, ok := labelID(key)
			if !ok {
				return nil, replyErr(route, ReasonBadTopLogprobs, "%s: key %q is not token_id:<id> (the server ignored return_tokens_as_token_ids)", where, key)
			}
			var v json.RawMessage
			if err := dec.Decode(&v); err != nil {
				return nil, replyErr(route, ReasonBadTopLogprobs, "%s: %v", where, err)
			}
			lp, err := logprobValue(route, where+"["+strconv.Quote(key)+"]", v)
			if err != nil {
				return nil, err
			}
			row = append(row, TopLogProb{ID: id, LogProb: lp})
		}
		var err error
		if res[i], err = checkTopRow(route, where, row, out[i], k); err != nil {
			return nil, err
		}
	}
	return res, nil
}
