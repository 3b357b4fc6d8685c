package protocol

import (
	"bytes"
	"io"

	"github.com/kilnrl/kiln/internal/ojson"
)

// A streamed reply is generated whole before any of it is sent (docs/adapter.md §4.7), so
// a long generation is a silence on the connection, and clients bound
// silences: Claude Code gives up on a request whose response head has not
// come within API_TIMEOUT_MS (600 s by default) and sends it again, which
// starts the generation over, up to ten times; OpenAI's Python SDK reads
// with a 600 s timeout between bytes; Codex, once it has a response head,
// gives up after stream_idle_timeout_ms (300 s by default) without an SSE
// event. The adapter may therefore start a slow streamed reply early and
// keep it alive until the reply is ready (docs/adapter.md §4.7's design note). A Prelude
// is that start.

// Prelude is the part of a streamed reply sent before the reply exists:
// keep-alive frames, then the reply (Reply) or an error event (Error).
// Frames: Anthropic's own ping event (the API sends it, so its clients
// ignore it); an SSE comment on Chat Completions (which OpenAI's SDKs
// skip); on Responses, the response.created event the reply would begin
// with, then response.in_progress events — events, since a comment does
// not reset Codex's idle timeout — and the reply's events continue their
// sequence numbers under the same response id. Not safe for concurrent
// use.
type Prelude struct {
	req     *Request
	opt     ReplyOptions
	created int64
	id      string // Responses: minted by the first frame
	seq     int    // Responses: events sent
}

// NewPrelude returns the prelude of req's streamed reply, with opt as the
// reply will have them; nil when req is not streamed.
func NewPrelude(req *Request, opt ReplyOptions) *Prelude {
	if !req.Stream {
		return nil
	}
	return &Prelude{req: req, opt: opt, created: opt.created()}
}

// Frame is the next keep-alive frame.
func (p *Prelude) Frame() []byte {
	switch p.req.Protocol {
	case Anthropic:
		return []byte("event: ping\ndata: {\"type\":\"ping\"}\n\n")
	case Responses:
		var b bytes.Buffer
		f := &frames{w: &b}
		if p.seq == 0 {
			p.id = "resp_" + p.opt.ids().Hex(24)
			f.event("response.created", ojson.Obj("type", "response.created", "sequence_number", 0,
				"response", responseStart(p.req, p.id, p.created)))
			p.seq++
		}
		f.event("response.in_progress", ojson.Obj("type", "response.in_progress", "sequence_number", p.seq,
			"response", responseStart(p.req, p.id, p.created)))
		p.seq++
		return b.Bytes()
	}
	return []byte(": keep-alive\n\n")
}

// Reply writes the rest of the stream: the reply's events after the
// frames sent.
func (p *Prelude) Reply(w io.Writer, rep *Reply) error {
	if p.req.Protocol == Responses && p.seq > 0 {
		return streamResponses(w, p.req, rep, p.opt.ids(), p.id, p.created, p.seq)
	}
	opt := p.opt
	opt.Created = p.created
	return WriteReply(w, p.req, rep, opt)
}

// Error is e as the event that ends the stream (its status can no longer
// be sent): Anthropic's error event, Chat Completions' error data line,
// Responses' error event, numbered after the frames sent.
func (p *Prelude) Error(e *Error) []byte {
	var b []byte
	switch p.req.Protocol {
	case Anthropic:
		b = append(b, "event: error\ndata: "...)
		b = append(b, e.Body(Anthropic)...)
	case Responses:
		b = append(b, "event: error\ndata: "...)
		b = ojson.Append(b, ojson.Obj("type", "error", "code", orNull(e.Code), "message", e.Message, "param", orNull(e.Param), "sequence_number", p.seq))
		p.seq++
	default:
		b = append(b, "data: "...)
		b = append(b, e.Body(p.req.Protocol)...)
	}
	return append(b, "\n\n"...)
}
