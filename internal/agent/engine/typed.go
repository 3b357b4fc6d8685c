package engine

import (
	"bytes"
	"encoding/json"
	"io"
	"math"
	"strconv"
	"strings"

	"github.com/kilnrl/kiln/internal/ojson"
)

// The typed reading of a generate reply: the fast, common case.
//
// parseGenerateSteps reads a reply level by level into json.RawMessage, so
// that every absence and type error is worded precisely, which scans the
// reply again at every level and copies every field of every logprob
// entry. readGenerate instead decodes each bulky value (token_ids,
// logprobs.content, sampling_mask) once, straight into typed values, and
// either returns the Generation parseGenerateSteps would return for the
// same body or declines (ok=false); it never words an error. parseGenerate
// runs parseGenerateSteps only when it declines: for an invalid reply (to
// word the error) or an unusual valid one.
//
// Why the levels above the bulky values are walked with json.Decoder's
// Token rather than decoded into nested structs: encoding/json decodes a
// key repeated within one object into the same struct value again, merging
// the two (a field only the first occurrence has survives), where
// parseGenerateSteps keeps the last occurrence's raw value whole. Walking
// those levels sees every key, so a repeated key that would merge declines.
// Below them, every decoded field is a scalar whose repetition
// keeps the last value, as the step-by-step reading does.
//
// Keys match fields as encoding/json matches them to struct fields:
// exactly or case-insensitively (strings.EqualFold, which is encoding/json's
// folding).
//
// Why it stays beside the plain reading (issue 37 measured it side by side,
// 2026-12-03, 2 shared cores, load 14-36): with generate and /tokenize
// replies read by encoding/json alone (this file, readTokenizeSkim,
// readTokenizeTyped and ojson.DecodeInts gone), the adapter's CPU a turn
// against a 200 ms-2 s engine at 256 sessions went from 1.1-1.4 ms to
// 2.4-3.2 ms and the turns' mean wall time from 1.1-2.8 s to 2.0-4.2 s
// (the one pinned adapter core saturates), and kiln-rollout run's CPU
// against the same sandbox work alone from 1.07-1.16x to 1.35x (its wall
// goal is <= 1.3x). Commands:
//
//	go test ./internal/agent/adapter -run '^$' -bench 'AdapterLoad/^engine=' -benchtime 1x
//	go test ./stages/rollout -run '^$' -bench '^BenchmarkRun$' -benchtime 1x

// declined is the error the typed values' UnmarshalJSON return for a value
// the step-by-step reading would refuse or read differently; readGenerate
// then declines. It is never returned to a caller.
type declined struct{}

func (declined) Error() string { return "engine: value left to the step-by-step reading" }

// wireID is a token id as tokenID reads one (a JSON integer in [0,
// MaxInt32]); null and anything else decline.
type wireID int32

func (v *wireID) UnmarshalJSON(b []byte) error {
	id, ok := tokenID(b)
	if !ok {
		return declined{}
	}
	*v = wireID(id)
	return nil
}

// optID is a logprob entry's token_id: unset when null (or absent), else
// an id as tokenID reads one.
type optID struct {
	id  int32
	set bool
}

func (v *optID) UnmarshalJSON(b []byte) error {
	if string(b) == "null" {
		*v = optID{}
		return nil
	}
	id, ok := tokenID(b)
	if !ok {
		return declined{}
	}
	*v = optID{id, true}
	return nil
}

// optLogprob is a logprob: unset when null (or absent), else a number
// logprobValue accepts (finite as float64 and as float32).
type optLogprob struct {
	v   float32
	set bool
}

func (v *optLogprob) UnmarshalJSON(b []byte) error {
	if string(b) == "null" {
		*v = optLogprob{}
		return nil
	}
	if len(b) == 0 || (b[0] != '-' && (b[0] < '0' || b[0] > '9')) {
		return declined{} // a string, bool, object or array
	}
	f, ok := finiteLogprob(b)
	if !ok {
		return declined{}
	}
	*v = optLogprob{f, true}
	return nil
}

// finiteLogprob reads a JSON number as logprobValue accepts it: parsed as a
// float64, finite, and finite as a float32.
func finiteLogprob(num []byte) (float32, bool) {
	f, err := strconv.ParseFloat(string(num), 64)
	if err != nil || math.IsNaN(f) || math.IsInf(f, 0) || math.IsInf(float64(float32(f)), 0) {
		return 0, false
	}
	return float32(f), true
}

// typedEntry is a logprob entry (chat shape) without its top_logprobs.
// Token is a string or null; any other token declines (entryID ignores it).
type typedEntry struct {
	TokenID optID      `json:"token_id"`
	Token   *string    `json:"token"`
	Logprob optLogprob `json:"logprob"`
}

// typedTopEntry is a logprob entry with its top_logprobs, read when top
// logprobs are asked for.
type typedTopEntry struct {
	TokenID     optID      `json:"token_id"`
	Token       *string    `json:"token"`
	Logprob     optLogprob `json:"logprob"`
	TopLogprobs typedRow   `json:"top_logprobs"`
}

// typedRow is one position's top_logprobs, decoded afresh at each
// occurrence of the key (a repeated key keeps the last list whole, as
// parseGenerateSteps does); unset when null.
type typedRow struct {
	items []typedEntry
	set   bool
}

func (r *typedRow) UnmarshalJSON(b []byte) error {
	if string(b) == "null" {
		*r = typedRow{}
		return nil
	}
	var items []typedEntry
	if err := json.Unmarshal(b, &items); err != nil {
		return declined{}
	}
	*r = typedRow{items, true}
	return nil
}

// resolve is entryID on a typed entry: the entry's id and whether it has
// one, ok=false where entryID fails.
func (e *typedEntry) resolve() (id int32, has, ok bool) {
	hasLabel := false
	var fromLabel int32
	if e.Token != nil && strings.HasPrefix(*e.Token, "token_id:") {
		v, good := labelID(*e.Token)
		if !good {
			return 0, false, false
		}
		fromLabel, hasLabel = v, true
	}
	switch {
	case e.TokenID.set && hasLabel && e.TokenID.id != fromLabel:
		return 0, false, false
	case e.TokenID.set:
		return e.TokenID.id, true, true
	case hasLabel:
		return fromLabel, true, true
	}
	return 0, false, true
}

// walker reads a reply token by token with json.Decoder; every method
// returns false on anything but the JSON it expects.
type walker struct{ dec *json.Decoder }

// object reads an object, calling field for each key, which must read the
// key's value.
func (w walker) object(field func(key string) bool) bool {
	if t, err := w.dec.Token(); err != nil || t != json.Delim('{') {
		return false
	}
	for w.dec.More() {
		t, err := w.dec.Token()
		if err != nil {
			return false
		}
		key, ok := t.(string)
		if !ok || !field(key) {
			return false
		}
	}
	t, err := w.dec.Token()
	return err == nil && t == json.Delim('}')
}

// array reads an array, calling elem for each element, which must read it.
func (w walker) array(elem func(i int) bool) bool {
	if t, err := w.dec.Token(); err != nil || t != json.Delim('[') {
		return false
	}
	for i := 0; w.dec.More(); i++ {
		if !elem(i) {
			return false
		}
	}
	t, err := w.dec.Token()
	return err == nil && t == json.Delim(']')
}

// value decodes the next value into v.
func (w walker) value(v any) bool { return w.dec.Decode(v) == nil }

// raw reads the next value's bytes into *r, replacing what it held.
func (w walker) raw(r *json.RawMessage) bool {
	*r = nil
	return w.dec.Decode(r) == nil
}

// skip reads the next value and drops it.
func (w walker) skip() bool {
	var r json.RawMessage
	return w.dec.Decode(&r) == nil
}

// end reports whether nothing but white space follows.
func (w walker) end() bool {
	_, err := w.dec.Token()
	return err == io.EOF
}

// typedReply is what readGenerate keeps of a reply: the fields
// parseGenerateSteps reads, each as it reads it (raw values where a helper
// of its own reads them).
type typedReply struct {
	top                                    wireResponse // Choices unused
	choices                                int
	ids                                    []wireID
	finish, stop, routed, weights          json.RawMessage
	mask                                   [][]wireID
	logprobs                               bool // an object
	content                                []typedEntry
	topContent                             []typedTopEntry
	seenChoices, seenLogprobs, seenContent bool
}

// readGenerate is the typed reading of a generate reply (see above): the
// Generation parseGenerate returns for body, or ok=false.
//
// The reply is first checked whole (ojson.Valid, encoding/json's Valid
// at 6× its speed), then read by skimming it with ojson, which on valid
// JSON finds every value's
// exact extent: each scalar it reads is the text encoding/json would hand
// to the same UnmarshalJSON, each raw value the bytes it would keep. A key
// with an escape declines (skimming sees keys undecoded). This replaced a
// reading token by token with json.Decoder, every logprob entry decoded
// by reflection: BenchmarkParseGenerate's ÷steps (the step-by-step
// reading's time over this one's, same run) was 3.0 with that and is
// 6.1–6.8 with this and json.Valid (2026-12-02, load 10–13), that check
// then half of the reading. TestTypedGenerate and FuzzParseGenerate hold the two
// readings to the same Generations.
func readGenerate(body []byte, req *GenerateRequest) (_ Generation, ok bool) {
	const route = string(RouteGenerate)
	if !ojson.Valid(body) {
		return Generation{}, false
	}
	wantTop := req.Sampling.Logprobs > 0
	var r typedReply
	// Each key reads its value and returns the index after it (-1:
	// decline); a key met twice whose values would merge declines; the
	// others keep their last value.
	content := func(key []byte, v int) int {
		if !strings.EqualFold(string(key), "content") {
			return ojson.ValueEnd(body, v)
		}
		if r.seenContent || body[v] != '[' {
			return -1
		}
		r.seenContent = true
		if wantTop {
			r.topContent = make([]typedTopEntry, 0, len(r.ids))
			return ojson.WalkArray(body, v, func(i int) int {
				r.topContent = append(r.topContent, typedTopEntry{})
				return skimEntry(body, i, &r.topContent[len(r.topContent)-1])
			})
		}
		r.content = make([]typedEntry, 0, len(r.ids))
		return ojson.WalkArray(body, v, func(i int) int {
			r.content = append(r.content, typedEntry{})
			return skimEntry(body, i, &r.content[len(r.content)-1])
		})
	}
	choice := func(key []byte, v int) int {
		k := string(key)
		switch {
		case strings.EqualFold(k, "token_ids"):
			r.ids = nil
			return skimIDs(body, v, &r.ids)
		case strings.EqualFold(k, "logprobs"):
			if r.seenLogprobs {
				return -1
			}
			r.seenLogprobs, r.logprobs = true, true
			return skimObject(body, v, content)
		case strings.EqualFold(k, "finish_reason"):
			return skimRaw(body, v, &r.finish)
		case strings.EqualFold(k, "stop_reason"):
			return skimRaw(body, v, &r.stop)
		case strings.EqualFold(k, "sampling_mask") && req.ReturnSamplingMask:
			r.mask = nil
			if isNullAt(body, v) {
				return v + 4
			}
			r.mask = [][]wireID{}
			return ojson.WalkArray(body, v, func(i int) int {
				var row []wireID
				e := skimIDs(body, i, &row)
				r.mask = append(r.mask, row)
				return e
			})
		case strings.EqualFold(k, "routed_experts"):
			return skimRaw(body, v, &r.routed)
		case strings.EqualFold(k, "weight_versions"):
			return skimRaw(body, v, &r.weights)
		}
		return ojson.ValueEnd(body, v)
	}
	root := func(key []byte, v int) int {
		k := string(key)
		switch {
		case strings.EqualFold(k, "choices"):
			if r.seenChoices {
				return -1
			}
			r.seenChoices = true
			return ojson.WalkArray(body, v, func(i int) int {
				r.choices++
				if r.choices > 1 {
					return -1
				}
				return skimObject(body, i, choice)
			})
		case strings.EqualFold(k, "usage"):
			return skimRaw(body, v, &r.top.Usage)
		case strings.EqualFold(k, "model"):
			return skimRaw(body, v, &r.top.Model)
		case strings.EqualFold(k, "created"):
			return skimRaw(body, v, &r.top.Created)
		case strings.EqualFold(k, "output_mode"):
			return skimRaw(body, v, &r.top.OutputMode)
		case strings.EqualFold(k, "prompt_token_ids"):
			return skimRaw(body, v, &r.top.PromptTokenIDs)
		}
		return ojson.ValueEnd(body, v)
	}
	if skimObject(body, ojson.Space(body, 0), root) < 0 || r.choices != 1 || r.ids == nil || !r.logprobs || !r.seenContent {
		return Generation{}, false
	}
	return r.generation(route, req)
}

// skimObject walks the object at body[v] with fn, declining (-1) at a key
// with an escape: fn sees keys as their text, undecoded, which is the
// decoded key only without one.
func skimObject(body []byte, v int, fn func(key []byte, v int) int) int {
	return ojson.WalkObject(body, v, func(key []byte, v int) int {
		if bytes.IndexByte(key, '\\') >= 0 {
			return -1
		}
		return fn(key, v)
	})
}

// skimRaw keeps the value at body[v] as *dst, as json.RawMessage keeps it.
func skimRaw(body []byte, v int, dst *json.RawMessage) int {
	e := ojson.ValueEnd(body, v)
	if e >= 0 {
		*dst = body[v:e]
	}
	return e
}

func isNullAt(body []byte, v int) bool { return bytes.HasPrefix(body[v:], []byte("null")) }

// skimIDs reads the list of ids at body[v] into *dst as []wireID decodes
// it: null leaves it nil, a list gives a non-nil slice, an element
// wireID refuses declines.
func skimIDs(body []byte, v int, dst *[]wireID) int {
	if isNullAt(body, v) {
		return v + 4
	}
	ids := []wireID{}
	e := ojson.WalkArray(body, v, func(i int) int {
		e := ojson.ValueEnd(body, i)
		if e < 0 {
			return -1
		}
		id, ok := tokenID(body[i:e])
		if !ok {
			return -1
		}
		ids = append(ids, wireID(id))
		return e
	})
	*dst = ids
	return e
}

// entryField is the logprob entry field key names, matched as
// encoding/json matches it to a struct field (exactly, else
// case-insensitively); "" for none. The exact names are tried first: they
// are what engines write, and a switch on them costs less than folding.
func entryField(key []byte) string {
	switch string(key) {
	case "token_id":
		return "token_id"
	case "logprob":
		return "logprob"
	case "token":
		return "token"
	case "top_logprobs":
		return "top_logprobs"
	case "rank", "bytes":
		return ""
	}
	for _, f := range [...]string{"token_id", "logprob", "token", "top_logprobs"} {
		if strings.EqualFold(string(key), f) {
			return f
		}
	}
	return ""
}

// skimEntry reads the logprob entry at body[v] into e (a *typedEntry or
// *typedTopEntry) as encoding/json decodes it into that struct: fields by
// key, exactly or case-insensitively, the last occurrence winning; null
// leaves e zero; anything but an object or null declines, as do the
// values the fields' UnmarshalJSON refuse and a token that is not a
// string or null.
func skimEntry[E typedEntry | typedTopEntry](body []byte, v int, e *E) int {
	if isNullAt(body, v) {
		return v + 4
	}
	var (
		id  *optID
		tok **string
		lp  *optLogprob
		top *typedRow
	)
	switch x := any(e).(type) {
	case *typedEntry:
		id, tok, lp = &x.TokenID, &x.Token, &x.Logprob
	case *typedTopEntry:
		id, tok, lp, top = &x.TokenID, &x.Token, &x.Logprob, &x.TopLogprobs
	}
	return skimObject(body, v, func(key []byte, v int) int {
		e := ojson.ValueEnd(body, v)
		if e < 0 {
			return -1
		}
		val := body[v:e]
		var err error
		switch entryField(key) {
		case "token_id":
			err = id.UnmarshalJSON(val)
		case "logprob":
			err = lp.UnmarshalJSON(val)
		case "token":
			switch val[0] {
			case 'n':
				*tok = nil
			case '"':
				s, ok := ojson.Unquote(val)
				if !ok {
					return -1
				}
				*tok = &s
			default:
				return -1
			}
		case "top_logprobs":
			if top == nil {
				break
			}
			if isNullAt(body, v) {
				*top = typedRow{}
				break
			}
			items := []typedEntry{}
			if ojson.WalkArray(body, v, func(i int) int {
				items = append(items, typedEntry{})
				return skimEntry(body, i, &items[len(items)-1])
			}) != e {
				return -1
			}
			*top = typedRow{items, true}
		}
		if err != nil {
			return -1
		}
		return e
	})
}

// generation checks a walked reply as parseGenerateSteps checks it and
// builds its Generation, or declines.
func (r *typedReply) generation(route string, req *GenerateRequest) (Generation, bool) {
	n := len(r.ids)
	g := Generation{Route: RouteGenerate, OutputIDs: make([]int32, n), LogProbs: make([]float32, n)}
	for i, id := range r.ids {
		g.OutputIDs[i] = int32(id)
	}
	var err error
	if g.FinishReason, err = finishReason(route, r.finish); err != nil {
		return Generation{}, false
	}
	if g.StopReason, err = stopReason(route, r.stop); err != nil {
		return Generation{}, false
	}
	intIDs := false
	entry := func(i int, e *typedEntry) bool {
		if !e.Logprob.set {
			return false
		}
		g.LogProbs[i] = e.Logprob.v
		id, has, ok := e.resolve()
		if !ok || has && id != g.OutputIDs[i] {
			return false
		}
		intIDs = intIDs || e.TokenID.set
		return true
	}
	if k := req.Sampling.Logprobs; k > 0 {
		if len(r.topContent) != n {
			return Generation{}, false
		}
		g.TopLogProbs = make([][]TopLogProb, n)
		for i := range r.topContent {
			e := &r.topContent[i]
			if !entry(i, &typedEntry{e.TokenID, e.Token, e.Logprob}) || !e.TopLogprobs.set {
				return Generation{}, false
			}
			row := make([]TopLogProb, len(e.TopLogprobs.items))
			for j := range e.TopLogprobs.items {
				t := &e.TopLogprobs.items[j]
				id, has, ok := t.resolve()
				if !ok || !has || !t.Logprob.set {
					return Generation{}, false
				}
				row[j] = TopLogProb{ID: id, LogProb: t.Logprob.v}
			}
			if g.TopLogProbs[i], err = checkTopRow(route, "", row, g.OutputIDs[i], k); err != nil {
				return Generation{}, false
			}
		}
	} else {
		if len(r.content) != n {
			return Generation{}, false
		}
		for i := range r.content {
			if !entry(i, &r.content[i]) {
				return Generation{}, false
			}
		}
	}
	if err := checkUsage(route, r.top.Usage, n, &g); err != nil {
		return Generation{}, false
	}
	resp := &r.top
	switch {
	case intIDs || !isNull(resp.OutputMode) || !isNull(resp.PromptTokenIDs):
		g.Shape = ShapeTokenIDs
	case !isNull(resp.Model) || !isNull(resp.Usage) || !isNull(resp.Created):
		g.Shape = ShapeScaleOut
	default:
		g.Shape = ShapeDisagg
	}
	if req.ReturnSamplingMask {
		var ok bool
		if g.TopPTokenIDs, g.TopPTokenOffsets, ok = typedMask(r.mask, g.OutputIDs); !ok {
			return Generation{}, false
		}
	}
	g.WeightVersions = weightVersions(r.weights)
	if req.ReturnRoutedExperts && n > 0 {
		if isNull(r.routed) {
			return Generation{}, false
		}
		if g.RoutedExperts, g.RoutedExpertsShape, err = routedExperts(route, r.routed, len(req.PromptIDs)+n-1); err != nil {
			return Generation{}, false
		}
	}
	return g, true
}

// typedMask is samplingMask on decoded rows (nil: absent or null).
func typedMask(rows [][]wireID, out []int32) ([]int32, []int32, bool) {
	if rows == nil {
		if len(out) == 0 {
			return []int32{}, []int32{0}, true
		}
		return nil, nil, false
	}
	if len(rows) != len(out) {
		return nil, nil, false
	}
	total := 0
	for _, row := range rows {
		total += len(row)
	}
	if total > math.MaxInt32 {
		return nil, nil, false
	}
	ids := make([]int32, 0, total)
	offs := make([]int32, 1, len(rows)+1)
	for i, row := range rows {
		has := false
		for _, id := range row {
			has = has || int32(id) == out[i]
			ids = append(ids, int32(id))
		}
		if !has {
			return nil, nil, false
		}
		offs = append(offs, int32(len(ids)))
	}
	return ids, offs, true
}
