package engine

import (
	"bytes"
	"encoding/json"
	"math"

	"github.com/kilnrl/kiln/internal/agent/jsonskim"
)

// genReply is a generate reply as fastGenerate reads it: the raw values
// parseGenerate's later checks take, and the ids and logprobs parsed.
type genReply struct {
	resp     wireResponse
	ch       wireChoice
	ids      []int32   // choices[0].token_ids
	lps      []float32 // choices[0].logprobs.content[i].logprob
	entryIDs []int32   // the id entry i names (token_id or a "token_id:N" label), -1 for none
	intIDs   bool      // some entry carries an integer token_id
	content  bool      // logprobs.content was read
}

// fastGenerate reads a well-formed generate reply (no top logprobs asked)
// in one pass: each level is parsed where it stands instead of skimmed by
// the level above and parsed again, and the values no check needs (the
// prompt_token_ids echo, top_logprobs) are skipped. ok is false for
// anything unusual — a key that matches only case-insensitively, escapes in
// keys, more than one choice, nulls where lists belong — and parseGenerate
// then takes the encoding/json path, which words every error.
func fastGenerate(b []byte) (r genReply, ok bool) {
	choices := 0
	end := objectAt(b, jsonskim.Space(b, 0), func(key []byte, v int) int {
		var dst *json.RawMessage
		switch string(key) {
		case "choices":
			e := jsonskim.Array(b, v, func(v int) int {
				if choices++; choices > 1 {
					return -1
				}
				return r.choice(b, v)
			})
			if e >= 0 {
				r.resp.Choices = b[v:e]
			}
			return e
		case "usage":
			dst = &r.resp.Usage
		case "model":
			dst = &r.resp.Model
		case "created":
			dst = &r.resp.Created
		case "output_mode":
			dst = &r.resp.OutputMode
		case "prompt_token_ids":
			dst = &r.resp.PromptTokenIDs
		default:
			if foldsTo(key, "choices", "usage", "model", "created", "output_mode", "prompt_token_ids") {
				return -1
			}
		}
		return rawAt(b, v, dst)
	})
	if end < 0 || jsonskim.Space(b, end) != len(b) || choices != 1 || r.ids == nil || !r.content || len(r.lps) != len(r.ids) {
		return genReply{}, false
	}
	if r.lps == nil {
		r.lps = []float32{} // as encoding/json reads an empty list
	}
	return r, true
}

func (r *genReply) choice(b []byte, i int) int {
	return objectAt(b, i, func(key []byte, v int) int {
		var dst *json.RawMessage
		switch string(key) {
		case "token_ids":
			ids, e, ok := scanIDs(b, v)
			if !ok {
				return -1
			}
			r.ids, r.ch.TokenIDs = ids, b[v:e]
			return e
		case "logprobs":
			r.lps, r.entryIDs, r.intIDs, r.content = r.lps[:0], r.entryIDs[:0], false, false
			if r.lps == nil && len(r.ids) > 0 { // token_ids came first, as vLLM writes them
				r.lps, r.entryIDs = make([]float32, 0, len(r.ids)), make([]int32, 0, len(r.ids))
			}
			e := objectAt(b, v, func(key []byte, v int) int {
				if string(key) != "content" {
					if foldsTo(key, "content") {
						return -1
					}
					return jsonskim.Value(b, v)
				}
				r.content = true
				return jsonskim.Array(b, v, func(v int) int {
					if e := r.entryC(b, v); e >= 0 {
						return e
					}
					return r.entry(b, v)
				})
			})
			if e >= 0 {
				r.ch.Logprobs = b[v:e]
			}
			return e
		case "finish_reason":
			dst = &r.ch.FinishReason
		case "stop_reason":
			dst = &r.ch.StopReason
		case "sampling_mask":
			dst = &r.ch.SamplingMask
		case "routed_experts":
			dst = &r.ch.RoutedExperts
		default:
			if foldsTo(key, choiceFields...) {
				return -1
			}
		}
		return rawAt(b, v, dst)
	})
}

// entry reads one logprob entry: its finite logprob (required) and the id
// it names, if any. It is read with a loop of its own rather than through
// objectAt: an entry per sampled token makes it the innermost loop of the
// reply.
func (r *genReply) entry(b []byte, i int) int {
	if i >= len(b) || b[i] != '{' {
		return -1
	}
	var lp float32
	haveLP, id := false, int32(-1)
	i = jsonskim.Space(b, i+1)
	for {
		if i >= len(b) || b[i] != '"' {
			return -1
		}
		ke := jsonskim.String(b, i)
		if ke < 0 {
			return -1
		}
		key := b[i+1 : ke-1]
		for _, c := range key {
			if c == '\\' {
				return -1 // keys are matched by their raw text
			}
		}
		if i = jsonskim.Space(b, ke); i >= len(b) || b[i] != ':' {
			return -1
		}
		v := jsonskim.Space(b, i+1)
		e := jsonskim.Value(b, v)
		if e < 0 {
			return -1
		}
		val := b[v:e]
		switch string(key) {
		case "logprob":
			var ok bool
			if lp, ok = parseFinite32(val); !ok {
				return -1
			}
			haveLP = true
		case "token_id":
			if string(val) != "null" {
				n, ok := parseUint32(val)
				if !ok {
					return -1
				}
				id, r.intIDs = n, true
			}
		case "token":
			if string(val) != "null" {
				if len(val) < 2 || val[0] != '"' || bytes.IndexByte(val, '\\') >= 0 {
					return -1
				}
				if label, isLabel := bytes.CutPrefix(val[1:len(val)-1], []byte("token_id:")); isLabel {
					n, ok := parseUint32(label)
					if !ok || (id >= 0 && n != id) {
						return -1
					}
					id = n
				}
			}
		case "top_logprobs", "rank", "bytes":
		default:
			if foldsTo(key, entryFields...) {
				return -1
			}
		}
		if i = jsonskim.Space(b, e); i >= len(b) {
			return -1
		}
		if b[i] == '}' {
			break
		}
		if b[i] != ',' {
			return -1
		}
		i = jsonskim.Space(b, i+1)
	}
	if !haveLP {
		return -1
	}
	r.lps = append(r.lps, lp)
	r.entryIDs = append(r.entryIDs, id)
	return i + 1
}

// entryC reads an entry laid out exactly as vLLM's newest shape (C)
// serializes it — {"token_id":N,"logprob":F,"rank":R,"top_logprobs":[{
// "token_id":N,"logprob":F,"rank":R},...]}, no spaces — by matching that
// text instead of scanning keys and skimming values: the entries are most
// of a reply. It returns -1, having recorded nothing, for anything else,
// and entry then reads it; what it accepts entry would read alike.
func (r *genReply) entryC(b []byte, i int) int {
	start := i
	id, i, ok := cLabel(b, i, `{"token_id":`, scanUint)
	if !ok || id > math.MaxInt32 {
		return -1
	}
	ls := i + len(`,"logprob":`)
	if !bytes.HasPrefix(b[i:], []byte(`,"logprob":`)) {
		return -1
	}
	lp, n, ok := decimal32Prefix(b[ls:])
	le := ls + n
	if !ok { // a number decimal32 leaves to strconv
		le = cNumberEnd(b, ls)
		if lp, ok = parseFinite32(b[ls:le]); !ok {
			return -1
		}
	}
	if i = cRank(b, le); i < 0 || !bytes.HasPrefix(b[i:], []byte(`,"top_logprobs":[`)) {
		return -1
	}
	// The sampled token's own top entry is the entry's opening fields
	// again, closed: where a top entry is those very bytes it is not read
	// a second time.
	own := b[start:i]
	i += len(`,"top_logprobs":[`)
	if i < len(b) && b[i] == ']' {
		i++
	} else {
		for {
			if e := i + len(own); e < len(b) && b[e] == '}' && bytes.Equal(b[i:e], own) {
				i = e + 1
			} else if i = cTopEntry(b, i); i < 0 {
				return -1
			}
			if i >= len(b) {
				return -1
			}
			if b[i] == ']' {
				i++
				break
			}
			if b[i] != ',' {
				return -1
			}
			i++
		}
	}
	if i >= len(b) || b[i] != '}' {
		return -1
	}
	r.lps = append(r.lps, lp)
	r.entryIDs = append(r.entryIDs, int32(id))
	r.intIDs = true
	return i + 1
}

// cTopEntry skims one top_logprobs entry laid out as shape (C) writes it,
// its values only skimmed (as entry skims them), returning the index after
// it or -1.
func cTopEntry(b []byte, i int) int {
	_, i, ok := cLabel(b, i, `{"token_id":`, scanUint)
	if !ok || !bytes.HasPrefix(b[i:], []byte(`,"logprob":`)) {
		return -1
	}
	j := cNumberEnd(b, i+len(`,"logprob":`))
	if j == i+len(`,"logprob":`) {
		return -1
	}
	if i = cRank(b, j); i < 0 || i >= len(b) || b[i] != '}' {
		return -1
	}
	return i + 1
}

// cLabel matches lit at b[i] and reads the value after it with scan.
func cLabel(b []byte, i int, lit string, scan func([]byte, int) (int, int, bool)) (int, int, bool) {
	if !bytes.HasPrefix(b[i:], []byte(lit)) {
		return 0, i, false
	}
	return scan(b, i+len(lit))
}

// cRank matches ,"rank": and an integer or null at b[i], returning the
// index after it or -1.
func cRank(b []byte, i int) int {
	if !bytes.HasPrefix(b[i:], []byte(`,"rank":`)) {
		return -1
	}
	i += len(`,"rank":`)
	if bytes.HasPrefix(b[i:], []byte("null")) {
		return i + 4
	}
	if _, e, ok := scanUint(b, i); ok {
		return e
	}
	return -1
}

// cNumberEnd is the index after the run of number bytes at b[i].
func cNumberEnd(b []byte, i int) int {
	for i < len(b) && (b[i] >= '0' && b[i] <= '9' || b[i] == '-' || b[i] == '.' || b[i] == 'e' || b[i] == 'E' || b[i] == '+') {
		i++
	}
	return i
}

// rawAt skims the value at b[i:] and stores it in dst when dst is set.
func rawAt(b []byte, i int, dst *json.RawMessage) int {
	e := jsonskim.Value(b, i)
	if e >= 0 && dst != nil {
		*dst = b[i:e]
	}
	return e
}

// foldsTo reports whether key equals one of names case-insensitively but
// not exactly: encoding/json would take it for that field, the fast path
// does not.
func foldsTo(key []byte, names ...string) bool {
	for _, n := range names {
		if len(key) == len(n) && string(key) != n && bytes.EqualFold(key, []byte(n)) {
			return true
		}
	}
	return false
}

// objectAt is jsonskim.Object refusing keys with escapes: keys are matched
// by their raw text.
func objectAt(b []byte, i int, fn func(key []byte, v int) int) int {
	return jsonskim.Object(b, i, func(key []byte, v int) int {
		if bytes.IndexByte(key, '\\') >= 0 {
			return -1
		}
		return fn(key, v)
	})
}
