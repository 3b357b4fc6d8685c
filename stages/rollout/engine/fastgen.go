package engine

import (
	"bytes"
	"encoding/json"

	"github.com/kilnrl/kiln/stages/rollout/jsonskim"
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
			e := objectAt(b, v, func(key []byte, v int) int {
				if string(key) != "content" {
					if foldsTo(key, "content") {
						return -1
					}
					return jsonskim.Value(b, v)
				}
				r.content = true
				return jsonskim.Array(b, v, func(v int) int { return r.entry(b, v) })
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
// it names, if any.
func (r *genReply) entry(b []byte, i int) int {
	var lp float32
	haveLP, id := false, int32(-1)
	e := objectAt(b, i, func(key []byte, v int) int {
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
			if string(val) == "null" {
				return e
			}
			n, ok := parseUint32(val)
			if !ok {
				return -1
			}
			id, r.intIDs = n, true
		case "token":
			if string(val) == "null" {
				return e
			}
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
		default:
			if foldsTo(key, entryFields...) {
				return -1
			}
		}
		return e
	})
	if e < 0 || !haveLP {
		return -1
	}
	r.lps = append(r.lps, lp)
	r.entryIDs = append(r.entryIDs, id)
	return e
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
