package protocol

import (
	"crypto/rand"
	"encoding/hex"
	"encoding/json"
	"fmt"
	"io"
	"iter"
	mrand "math/rand/v2"
	"time"

	"github.com/kilnrl/kiln/internal/ojson"
)

// Reply is one parsed model turn, ready to be answered in any protocol.
type Reply struct {
	Reasoning    string // parsed reasoning ("" when none)
	Content      string // visible text
	Calls        []Call
	FinishReason string // raw engine finish reason: stop, length, abort, ...
	PromptTokens int    // prompt ids sent to the engine (after prefix reuse)
	OutputTokens int    // output ids generated
}

// Call is one parsed tool call. Name is the schema name the model called
// (ns.name for namespaced Responses tools). Arguments is a JSON object in
// the model's key order; anything else is coerced per docs/adapter.md §5.7.
type Call struct {
	ID        string // unused by the encoders, which mint wire ids; free for the caller
	Name      string
	Arguments json.RawMessage
}

// IDSource mints the random hex suffixes of wire ids (msg_, toolu_, resp_,
// fc_, call_, chatcmpl_).
type IDSource interface {
	Hex(n int) string // n lowercase hex digits
}

// RandomIDs draws from crypto/rand.
func RandomIDs() IDSource { return randomIDs{} }

type randomIDs struct{}

func (randomIDs) Hex(n int) string {
	buf := make([]byte, (n+1)/2)
	_, _ = rand.Read(buf)
	return hex.EncodeToString(buf)[:n]
}

// SeededIDs is deterministic (PCG seeded with seed), for golden tests.
func SeededIDs(seed uint64) IDSource {
	return &seededIDs{r: mrand.New(mrand.NewPCG(seed, seed^0x9e3779b97f4a7c15))}
}

type seededIDs struct{ r *mrand.Rand }

func (s *seededIDs) Hex(n int) string {
	b := make([]byte, n)
	for i := range b {
		b[i] = "0123456789abcdef"[s.r.IntN(16)]
	}
	return string(b)
}

// ReplyOptions controls what a reply encoder may not derive itself.
type ReplyOptions struct {
	IDs     IDSource // nil: RandomIDs
	Created int64    // unix seconds for created/created_at; 0: now
}

func (o ReplyOptions) ids() IDSource {
	if o.IDs == nil {
		return randomIDs{}
	}
	return o.IDs
}

func (o ReplyOptions) created() int64 {
	if o.Created == 0 {
		return time.Now().Unix()
	}
	return o.Created
}

// Content types and SSE headers of replies.
const (
	ContentTypeJSON = "application/json"
	ContentTypeSSE  = "text/event-stream"
)

// SSEHeaders yields the headers of a streamed reply (docs/adapter.md §4.7, docs/adapter.md §5.5), name
// and value, in a fixed order.
func SSEHeaders() iter.Seq2[string, string] {
	return func(yield func(string, string) bool) {
		_ = yield("Content-Type", ContentTypeSSE) &&
			yield("Cache-Control", "no-cache") &&
			yield("Connection", "keep-alive")
	}
}

// ContentType is the Content-Type of req's reply.
func ContentType(req *Request) string {
	if req.Stream {
		return ContentTypeSSE
	}
	return ContentTypeJSON
}

// Fixed bodies of the auxiliary routes (docs/adapter.md §4.1, docs/adapter.md §1.1), fresh on each call.

// CountTokensBody is the body of POST /v1/messages/count_tokens.
func CountTokensBody() []byte { return []byte(`{"input_tokens":0}`) }

// OKBody is the body of GET /healthz and GET /v1/models.
func OKBody() []byte { return []byte(`{"ok":true}`) }

// WriteReply writes rep as req's protocol answers it: JSON, or the SSE
// event sequence when req.Stream.
func WriteReply(w io.Writer, req *Request, rep *Reply, opt ReplyOptions) error {
	switch req.Protocol {
	case Anthropic:
		if req.Stream {
			return StreamAnthropic(w, req, rep, opt)
		}
		return WriteAnthropic(w, req, rep, opt)
	case Responses:
		if req.Stream {
			return StreamResponses(w, req, rep, opt)
		}
		return WriteResponses(w, req, rep, opt)
	case Chat:
		if req.Stream {
			return StreamChat(w, req, rep, opt)
		}
		return WriteChat(w, req, rep, opt)
	}
	return fmt.Errorf("protocol: unknown protocol %q", req.Protocol)
}

// AssistantMessage is the canonical assistant message of a reply (the
// reference's manager_message): what decoding the client's echo of the
// reply produces, so the next turn's history matches it.
//   - Anthropic: content, reasoning_content when non-empty, all calls.
//   - Responses: content, all calls, no reasoning.
//   - Chat: content "" when there are calls, only the first call, no
//     reasoning (what Chat clients can echo).
func AssistantMessage(req *Request, rep *Reply) json.RawMessage {
	m := ojson.Obj("role", "assistant", "content", rep.Content)
	calls := rep.Calls
	switch req.Protocol {
	case Anthropic, Responses:
		// Both clients echo the reasoning back (thinking blocks; kiln's
		// reasoning item handle).
		if rep.Reasoning != "" {
			m.Set("reasoning_content", rep.Reasoning)
		}
	case Chat:
		if len(calls) > 0 {
			m.Set("content", "")
			calls = calls[:1]
		}
	}
	if len(calls) > 0 {
		tc := make([]any, len(calls))
		for i, c := range calls {
			tc[i] = toolCall(callName(c), callArgs(c))
		}
		m.Set("tool_calls", tc)
	}
	return ojson.Marshal(m)
}

func callName(c Call) string {
	if c.Name == "" {
		return "tool"
	}
	return c.Name
}

// callArgs is a call's arguments as an object (docs/adapter.md §5.7 for anything else).
func callArgs(c Call) *ojson.Object {
	if len(c.Arguments) == 0 {
		return &ojson.Object{}
	}
	v, err := ojson.Decode(c.Arguments)
	if err != nil {
		return ojson.Obj("_raw_arguments", string(c.Arguments))
	}
	return coerceArguments(v)
}

func model(req *Request) string {
	if req.Model != "" {
		return req.Model
	}
	return DefaultModel
}

// frames writes SSE frames, remembering the first write error.
type frames struct {
	w   io.Writer
	err error
	buf []byte
}

func (f *frames) event(name string, payload *ojson.Object) {
	if f.err != nil {
		return
	}
	f.buf = f.buf[:0]
	if name != "" {
		f.buf = append(f.buf, "event: "...)
		f.buf = append(f.buf, name...)
		f.buf = append(f.buf, '\n')
	}
	f.buf = append(f.buf, "data: "...)
	if payload == nil {
		f.buf = append(f.buf, "[DONE]"...)
	} else {
		f.buf = ojson.Append(f.buf, payload)
	}
	f.buf = append(f.buf, "\n\n"...)
	_, f.err = f.w.Write(f.buf)
}

func writeJSON(w io.Writer, v any) error {
	_, err := w.Write(ojson.Marshal(v))
	return err
}
