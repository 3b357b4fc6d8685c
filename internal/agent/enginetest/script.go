package enginetest

import (
	"fmt"
	"hash/fnv"
	"math"
	"math/rand/v2"
)

// Request is what a Script sees of one generation request
// (POST /inference/v1/generate or one prompt of POST /v1/completions).
type Request struct {
	Endpoint  string // "/inference/v1/generate" or "/v1/completions"
	SessionID string // the x-session-id header ("" when absent)
	// Turn is the 0-based number of earlier generation requests that carried
	// the same x-session-id (numbered at arrival).
	Turn       int
	RequestID  string // request_id from the body or X-Request-Id, may be ""
	PromptIDs  []int
	PromptText string // Decode(PromptIDs), special tokens kept
	Params     SamplingParams
}

// Output is a scripted generation. The engine then applies vLLM's stop
// rules to it (eos / stop_token_ids / stop strings, max_tokens, context
// length), so an output longer than allowed is cut with finish "length".
type Output struct {
	// Text is encoded with the test tokenizer (added-token strings become
	// their ids); "<|im_end|>" is appended unless Text already ends with it
	// or NoEnd is set. IDs, when non-nil, are used verbatim instead.
	Text  string
	IDs   []int
	NoEnd bool
	// FinishReason, when set, replaces the engine's finish reason (e.g.
	// "abort"). Otherwise: "stop" when a stop condition fired, "length"
	// when max_tokens / the context ran out or the ids ended without one.
	FinishReason string
	// Logprobs per output id; missing entries (or nil) get DefaultLogprob.
	// Scripted logprobs are reported with rank 1.
	Logprobs []float64
	// WeightVersions, when non-nil, is the reply's
	// choices[0].weight_versions as given (shape C only; not cut or padded
	// to the output), in place of Options.WeightVersion's one per token:
	// a test's engine reloading weights mid-reply.
	WeightVersions []int64
	// Err makes the engine answer 500 with the error's message.
	Err error
}

// Script decides the output of each generation request. It may be called
// concurrently.
type Script func(Request) Output

// Sequence returns outputs[turn] for each session's turn (Request.Turn), the
// same list for every session; a turn past the end fails with a 500.
func Sequence(outputs ...string) Script {
	return func(r Request) Output {
		if r.Turn >= len(outputs) {
			return Output{Err: fmt.Errorf("enginetest: script exhausted: session %q turn %d, %d outputs", r.SessionID, r.Turn, len(outputs))}
		}
		return Output{Text: outputs[r.Turn]}
	}
}

// SequenceOutputs is Sequence with full Output values.
func SequenceOutputs(outputs ...Output) Script {
	return func(r Request) Output {
		if r.Turn >= len(outputs) {
			return Output{Err: fmt.Errorf("enginetest: script exhausted: session %q turn %d, %d outputs", r.SessionID, r.Turn, len(outputs))}
		}
		return outputs[r.Turn]
	}
}

// SeededRandom returns random printable ASCII text (1..48 bytes, no '<', so
// never an added token) followed by <|im_end|>. The text depends only on
// seed, the session id and the turn, not on request interleaving.
func SeededRandom(seed int64) Script {
	return func(r Request) Output {
		h := fnv.New64a()
		h.Write([]byte(r.SessionID))
		rng := rand.New(rand.NewPCG(uint64(seed), h.Sum64()^uint64(r.Turn)*0x9e3779b97f4a7c15))
		n := 1 + rng.IntN(48)
		b := make([]byte, n)
		for i := range b {
			c := byte(' ' + rng.IntN('~'-' '+1))
			if c == '<' {
				c = '>'
			}
			b[i] = c
		}
		return Output{Text: string(b)}
	}
}

// DefaultLogprob is the logprob reported for output id at output position
// pos when the script gives none: finite, negative, deterministic, in
// [-2.45, -0.05].
func DefaultLogprob(id, pos int) float64 {
	v := 0.05 + float64((id*31+pos*17)%97)/40
	return -math.Round(v*1e6) / 1e6
}
