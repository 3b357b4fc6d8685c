package rollout

import (
	"bytes"
	"math"
	"strconv"
	"unsafe"

	"github.com/kilnrl/kiln/formats/records"
	"github.com/kilnrl/kiln/internal/ojson"
)

// turnDecoder reads the lines of a turns JSONL file (records.TurnJSON
// objects) without encoding/json's reflection, for the common shape of such
// files, and declines the rest.
//
// Contract: when decode accepts a line, the turn is the one
// readTurnsJSONL's encoding/json path makes of it (a json.Decoder with
// DisallowUnknownFields into records.TurnJSON, then ToTurn), and that path
// would accept it: every byte of the line is checked against the JSON
// grammar, and every check of records.Turn.Validate holds. It declines
// (ok false) anything it cannot vouch for — a key spelled other than
// exactly, a repeated key, a null where the field is not a pointer, a number
// out of its field's range or with a fraction where an integer goes, text
// after the object, a turn Validate would refuse — and the caller then
// decodes that line with encoding/json, which also words the error. So the
// two paths accept the same lines, make the same turns and name the same
// errors.
//
// Consecutive turns of a session resend the previous prompt and history:
// where a line's prompt_ids or prompt_messages array begins with the text
// of the previous accepted line's array (up to the closing bracket, and
// followed by a delimiter), that text is compared, not parsed again —
// it was checked when that line was read, and the same text holds the same
// values. Its prompt ids are then shared, not copied: a turn's PromptIDs
// is a prefix of the next turn's backing array, capped at its length, and
// nothing writes to a turn's ids after decode returns it.
//
// The strings of an accepted turn that hold JSON (PromptMessages,
// ResponseMessage) alias the line, which must not be modified afterwards.
//
// Why a second reader beside encoding/json: the stage's wall time on a real
// size needs it. kiln-rollout assemble --turns-jsonl on the 198 MB file of
// BenchmarkAssembleJSONL (20 sessions of 100 turns), 7 alternating rounds
// of the built binaries, 2026-12-03, load ~3.5 on 2 shared cores: median
// 0.41 s wall (0.40-0.65), 0.38 s CPU with it; 4.75 s wall (4.43-6.23),
// 4.46 s CPU with every line decoded by decodeTurnJSON (readTurnsJSONL
// without dec.decode): 11x. Command (the binary timed with /usr/bin/time
// on the benchmark's file):
//
//	KILN_BENCH_TURNS_SESSIONS=20 go test ./stages/rollout -run '^$' -bench AssembleJSONL -benchtime 1x -timeout 30m
type turnDecoder struct {
	// The previous accepted line's prompt_ids text ('[' to ']') and its
	// ids, with the storage they share with later turns (ids is the longest
	// slice of it given out).
	idsText []byte
	ids     []int32
	// The previous accepted line's prompt_messages text ('[' to ']').
	msgsText []byte
	// The previous session id, reused while the bytes match.
	sessionRaw []byte
	session    string
}

// Bits of the keys a line has given, to decline repeated keys.
const (
	keyRolloutID = 1 << iota
	keyIndex
	keyGroupIndex
	keySession
	keyTurn
	keyPromptIDs
	keyOutputIDs
	keyOutputLogProbs
	keyFinishReason
	keyIllFormed
	keyPromptMessages
	keyResponseMessage
	keyMaxContextTokens
	keyReward
	keyTopPTokenIDs
	keyTopPTokenOffsets
	keyTopPLogProbs
	keyTopKTokenIDs
	keyTopKLogProbs
	keyTopK
	keyRoutedExperts
	keyRoutedExpertsShape
	keyStartedMs
	keyDurationMs
)

// decode reads one line (a JSON object, white space around it aside). It
// returns the turn and whether the line gave "turn" (hasTurn false: the
// caller numbers it by its position in the session), or ok false.
func (d *turnDecoder) decode(line []byte) (records.Turn, bool, bool) {
	b := line
	i := ojson.Space(b, 0)
	if i >= len(b) || b[i] != '{' {
		return records.Turn{}, false, false
	}
	var (
		f    turnFields
		seen uint32
	)
	i = ojson.Space(b, i+1)
	if i < len(b) && b[i] == '}' {
		i++
	} else {
		for {
			if i >= len(b) || b[i] != '"' {
				return f.t, false, false
			}
			ks := i + 1
			for i = ks; i < len(b) && b[i] != '"' && b[i] != '\\' && b[i] >= 0x20; i++ {
			}
			if i >= len(b) || b[i] != '"' {
				return f.t, false, false // an escape in a key: encoding/json's matching decides
			}
			key := b[ks:i]
			if i = ojson.Space(b, i+1); i >= len(b) || b[i] != ':' {
				return f.t, false, false
			}
			var bit uint32
			bit, i = d.field(&f, b, key, ojson.Space(b, i+1))
			if i < 0 || seen&bit != 0 {
				return f.t, false, false
			}
			seen |= bit
			if i = ojson.Space(b, i); i >= len(b) {
				return f.t, false, false
			}
			if b[i] == '}' {
				i++
				break
			}
			if b[i] != ',' {
				return f.t, false, false
			}
			i = ojson.Space(b, i+1)
		}
	}
	if ojson.Space(b, i) != len(b) {
		return f.t, false, false // encoding/json's Decoder reads the first value alone
	}
	return d.finish(&f)
}

// turnFields is what decode gathers of a line: the turn's fields, and the
// ones that need more than a parse (records.TurnJSON.ToTurn's defaults,
// the prompt's ids and messages kept for the next line).
type turnFields struct {
	t                 records.Turn
	rolloutID         *int64
	hasTurn, hasMsgs  bool
	ids               []int32
	idsText, msgsText []byte
	resp              []byte
}

// field parses the value at b[v:] of the field key into f, returning the
// key's bit and the index past the value (-1: not a turn line this reader
// takes).
func (d *turnDecoder) field(f *turnFields, b, key []byte, v int) (bit uint32, i int) {
	switch string(key) {
	case "rollout_id":
		bit = keyRolloutID
		if i = literalNull(b, v); i < 0 {
			var x int64
			if x, i = parseInt(b, v, 64); i >= 0 {
				f.rolloutID = &x
			}
		}
	case "index":
		bit = keyIndex
		f.t.Index, i = parseInt(b, v, 64)
	case "group_index":
		bit = keyGroupIndex
		f.t.GroupIndex, i = parseInt(b, v, 64)
	case "session":
		bit = keySession
		f.t.Session, i = d.sessionAt(b, v)
	case "turn":
		bit = keyTurn
		if i = literalNull(b, v); i < 0 {
			var x int64
			x, i = parseInt(b, v, 32)
			f.t.Turn, f.hasTurn = int32(x), i >= 0
		}
	case "prompt_ids":
		bit = keyPromptIDs
		f.ids, i = d.promptIDs(b, v)
		if i >= 0 {
			f.idsText = b[v:i]
		}
	case "output_ids":
		bit = keyOutputIDs
		f.t.OutputIDs, i = parseInt32s(b, v, nil)
	case "output_log_probs":
		bit = keyOutputLogProbs
		f.t.OutputLogProbs, i = parseFloat32s(b, v)
	case "finish_reason":
		bit = keyFinishReason
		f.t.FinishReason, i = parseString(b, v)
		f.t.FinishReason = internFinish(f.t.FinishReason)
	case "ill_formed":
		bit = keyIllFormed
		f.t.IllFormed, i = parseBool(b, v)
	case "prompt_messages":
		bit = keyPromptMessages
		if i = d.messages(b, v); i >= 0 {
			f.msgsText, f.hasMsgs = b[v:i], true
		}
	case "response_message":
		bit = keyResponseMessage
		if i = ojson.ValidValue(b, v, 0); i >= 0 {
			f.resp = b[v:i]
		}
	case "max_context_tokens":
		bit = keyMaxContextTokens
		var x int64
		x, i = parseInt(b, v, 32)
		f.t.MaxContextTokens = int32(x)
	case "reward":
		bit = keyReward
		if i = literalNull(b, v); i < 0 {
			var x float64
			if x, i = parseFloat(b, v, 64); i >= 0 {
				f.t.Reward = &x
			}
		}
	case "rollout_top_p_token_ids":
		bit = keyTopPTokenIDs
		f.t.TopPTokenIDs, i = parseInt32s(b, v, nil)
	case "rollout_top_p_token_offsets":
		bit = keyTopPTokenOffsets
		f.t.TopPTokenOffsets, i = parseInt32s(b, v, nil)
	case "rollout_top_p_log_probs":
		bit = keyTopPLogProbs
		f.t.TopPLogProbs, i = parseFloat32s(b, v)
	case "rollout_topk_token_ids":
		bit = keyTopKTokenIDs
		f.t.TopKTokenIDs, i = parseInt32s(b, v, nil)
	case "rollout_topk_log_probs":
		bit = keyTopKLogProbs
		f.t.TopKLogProbs, i = parseFloat32s(b, v)
	case "rollout_topk_k":
		bit = keyTopK
		var x int64
		x, i = parseInt(b, v, 32)
		f.t.TopK = int32(x)
	case "rollout_routed_experts":
		bit = keyRoutedExperts
		f.t.RoutedExperts, i = parseInt32s(b, v, nil)
	case "rollout_routed_experts_shape":
		bit = keyRoutedExpertsShape
		f.t.RoutedExpertsShape, i = parseInt32s(b, v, nil)
	case "started_ms":
		bit = keyStartedMs
		f.t.StartedMs, i = optInt64(b, v)
	case "duration_ms":
		bit = keyDurationMs
		f.t.DurationMs, i = optInt64(b, v)
	default:
		return 0, -1 // unknown, or not spelled exactly
	}
	return bit, i
}

// finish completes decode's turn, as records.TurnJSON.ToTurn does, checks
// it as records.Turn.Validate does, and keeps the prompt for the next
// line.
func (d *turnDecoder) finish(f *turnFields) (records.Turn, bool, bool) {
	t := f.t
	t.RolloutID = t.Index
	if f.rolloutID != nil {
		t.RolloutID = *f.rolloutID
	}
	if f.ids != nil {
		t.PromptIDs = f.ids[:len(f.ids):len(f.ids)] // later turns append to the storage past it
	}
	t.PromptMessages = "[]"
	if f.hasMsgs {
		t.PromptMessages = unsafe.String(unsafe.SliceData(f.msgsText), len(f.msgsText))
	}
	if len(f.resp) > 0 && string(f.resp) != "null" {
		s := unsafe.String(unsafe.SliceData(f.resp), len(f.resp))
		t.ResponseMessage = &s
	}
	// records.Turn.Validate itself, so that the two paths refuse the same
	// turns, but for prompt_messages and response_message, whose text was
	// checked as it was read (Validate would check a whole history again
	// every turn).
	v := t
	v.PromptMessages, v.ResponseMessage = "[]", nil
	if (f.hasMsgs && f.msgsText[0] != '[') || v.Validate() != nil {
		return t, false, false
	}
	if f.idsText != nil {
		d.idsText, d.ids = f.idsText, f.ids
	} else {
		d.idsText, d.ids = nil, nil
	}
	if f.hasMsgs && f.msgsText[0] == '[' {
		d.msgsText = f.msgsText
	} else {
		d.msgsText = nil
	}
	return t, f.hasTurn, true
}

// sessionAt reads the session string at b[i], reusing the previous line's
// string when the literal is the same.
func (d *turnDecoder) sessionAt(b []byte, i int) (string, int) {
	if i >= len(b) || b[i] != '"' {
		return "", -1
	}
	end := ojson.StringEnd(b, i)
	if end < 0 {
		return "", -1
	}
	if d.sessionRaw != nil && bytes.Equal(b[i:end], d.sessionRaw) {
		return d.session, end
	}
	s, ok := ojson.Unquote(b[i:end])
	if !ok {
		return "", -1
	}
	d.sessionRaw, d.session = append(d.sessionRaw[:0], b[i:end]...), s
	return s, end
}

// promptIDs reads the prompt_ids array at b[i]: when its text extends the
// previous accepted line's, those ids (sharing their storage) and only the
// ids that follow them are read; else every id.
//
// The previous line's state stays valid whatever happens here: appending
// past len(d.ids) writes storage no turn's slice reaches.
func (d *turnDecoder) promptIDs(b []byte, i int) ([]int32, int) {
	if j, ok := extends(b, i, d.idsText); ok && len(d.ids) > 0 {
		return appendInt32Tail(d.ids, b, j)
	}
	return parseInt32s(b, i, make([]int32, 0, (len(b)-i)/6))
}

// messages checks the prompt_messages value at b[i] and returns the index
// after it: an array whose text extends the previous line's is checked from
// where that text ends.
func (d *turnDecoder) messages(b []byte, i int) int {
	if j, ok := extends(b, i, d.msgsText); ok && len(d.msgsText) > 2 {
		return ojson.ValidArrayTail(b, j, 1)
	}
	return ojson.ValidValue(b, i, 0)
}

// extends reports whether the text at b[i:] begins with prev (a JSON array
// with at least one element, '[' to ']') up to its closing bracket, and the
// byte there is one that ends prev's last element (',', ']' or white
// space); j is the index of that byte. The elements before j are then
// prev's very text.
func extends(b []byte, i int, prev []byte) (j int, ok bool) {
	n := len(prev)
	if n < 3 || len(b)-i < n || !bytes.Equal(b[i:i+n-1], prev[:n-1]) {
		return 0, false
	}
	j = i + n - 1
	switch b[j] {
	case ',', ']', ' ', '\t', '\n', '\r':
		return j, true
	}
	return 0, false
}

// internFinish returns the usual finish reasons as constants, so reading
// one allocates nothing.
func internFinish(s string) string {
	switch s {
	case "stop":
		return "stop"
	case "length":
		return "length"
	case "tool_calls":
		return "tool_calls"
	case "abort":
		return "abort"
	}
	return s
}

// literalNull returns the index after a null at b[i], or -1.
func literalNull(b []byte, i int) int {
	if len(b)-i >= 4 && string(b[i:i+4]) == "null" {
		return i + 4
	}
	return -1
}

// parseBool reads true or false at b[i].
func parseBool(b []byte, i int) (bool, int) {
	switch {
	case len(b)-i >= 4 && string(b[i:i+4]) == "true":
		return true, i + 4
	case len(b)-i >= 5 && string(b[i:i+5]) == "false":
		return false, i + 5
	}
	return false, -1
}

// parseString reads the string literal at b[i] as encoding/json decodes it.
func parseString(b []byte, i int) (string, int) {
	if i >= len(b) || b[i] != '"' {
		return "", -1
	}
	end := ojson.StringEnd(b, i)
	if end < 0 {
		return "", -1
	}
	s, ok := ojson.Unquote(b[i:end])
	if !ok {
		return "", -1
	}
	return s, end
}

// optInt64 reads an int64 or null (nil) at b[i].
func optInt64(b []byte, i int) (*int64, int) {
	if end := literalNull(b, i); end >= 0 {
		return nil, end
	}
	x, end := parseInt(b, i, 64)
	if end < 0 {
		return nil, -1
	}
	return &x, end
}

// parseInt reads the JSON integer at b[i] (-?(0|[1-9][0-9]*), no fraction
// or exponent) that fits in a signed integer of bits bits. A number with a
// fraction or exponent, or out of range, is declined: encoding/json refuses
// it for an integer field.
func parseInt(b []byte, i, bits int) (int64, int) {
	neg := i < len(b) && b[i] == '-'
	if neg {
		i++
	}
	if i >= len(b) || b[i] < '0' || b[i] > '9' {
		return 0, -1
	}
	var u uint64
	start := i
	if b[i] == '0' {
		i++
	} else {
		for ; i < len(b) && b[i] >= '0' && b[i] <= '9'; i++ {
			if i-start >= 19 {
				return 0, -1 // past int64's digits
			}
			u = u*10 + uint64(b[i]-'0')
		}
	}
	if i < len(b) && (b[i] == '.' || b[i] == 'e' || b[i] == 'E') {
		return 0, -1
	}
	limit := uint64(1) << (bits - 1) // |min|; max is limit-1
	if (!neg && u >= limit) || (neg && u > limit) {
		return 0, -1
	}
	if neg {
		return -int64(u), i
	}
	return int64(u), i
}

// parseInt32s reads the array of int32 at b[i] (an empty array is a
// non-nil empty slice, as encoding/json makes it), appending to dst.
func parseInt32s(b []byte, i int, dst []int32) ([]int32, int) {
	if i >= len(b) || b[i] != '[' {
		return nil, -1
	}
	if dst == nil {
		dst = []int32{}
	}
	i = ojson.Space(b, i+1)
	if i < len(b) && b[i] == ']' {
		return dst, i + 1
	}
	for {
		var ok bool
		if dst, i, ok = appendInt32(dst, b, i); !ok {
			return nil, -1
		}
		if i = ojson.Space(b, i); i >= len(b) {
			return nil, -1
		}
		switch b[i] {
		case ']':
			return dst, i + 1
		case ',':
			i = ojson.Space(b, i+1)
		default:
			return nil, -1
		}
	}
}

// appendInt32Tail appends to ids the elements of an int32 array that
// follow ones already read, from b[j] (white space, then ',' before each
// element or the closing ']').
func appendInt32Tail(ids []int32, b []byte, j int) ([]int32, int) {
	for {
		if j = ojson.Space(b, j); j >= len(b) {
			return nil, -1
		}
		switch b[j] {
		case ']':
			return ids, j + 1
		case ',':
			var ok bool
			if ids, j, ok = appendInt32(ids, b, ojson.Space(b, j+1)); !ok {
				return nil, -1
			}
		default:
			return nil, -1
		}
	}
}

// appendInt32 appends the int32 at b[i] to dst; the common case, up to
// nine digits, is read inline.
func appendInt32(dst []int32, b []byte, i int) ([]int32, int, bool) {
	if i < len(b) && b[i] > '0' && b[i] <= '9' {
		u := uint32(b[i] - '0')
		j := i + 1
		for ; j < len(b) && j-i < 9 && b[j] >= '0' && b[j] <= '9'; j++ {
			u = u*10 + uint32(b[j]-'0')
		}
		if j >= len(b) || (b[j] != ',' && b[j] != ']' && b[j] != ' ' && b[j] != '\n' && b[j] != '\t' && b[j] != '\r') {
			goto general // more digits, a fraction, an exponent, or not a number's end
		}
		return append(dst, int32(u)), j, true
	}
general:
	x, end := parseInt(b, i, 32)
	if end < 0 {
		return dst, -1, false
	}
	return append(dst, int32(x)), end, true
}

// parseFloat reads the JSON number at b[i] as encoding/json decodes it into
// a float of bits bits (strconv.ParseFloat; out of range is declined).
func parseFloat(b []byte, i, bits int) (float64, int) {
	end := ojson.NumberEnd(b, i)
	if end < 0 {
		return 0, -1
	}
	num := b[i:end]
	x, err := strconv.ParseFloat(unsafe.String(unsafe.SliceData(num), len(num)), bits)
	if err != nil {
		return 0, -1
	}
	if bits == 32 && (x > math.MaxFloat32 || x < -math.MaxFloat32) {
		return 0, -1 // reflect.Value.OverflowFloat: encoding/json refuses it
	}
	return x, end
}

// parseFloat32s reads the array of float32 at b[i] (an empty array is a
// non-nil empty slice).
func parseFloat32s(b []byte, i int) ([]float32, int) {
	if i >= len(b) || b[i] != '[' {
		return nil, -1
	}
	dst := make([]float32, 0, 64)
	i = ojson.Space(b, i+1)
	if i < len(b) && b[i] == ']' {
		return dst, i + 1
	}
	for {
		x, end := parseFloat(b, i, 32)
		if end < 0 {
			return nil, -1
		}
		dst = append(dst, float32(x))
		if i = ojson.Space(b, end); i >= len(b) {
			return nil, -1
		}
		switch b[i] {
		case ']':
			return dst, i + 1
		case ',':
			i = ojson.Space(b, i+1)
		default:
			return nil, -1
		}
	}
}
