package protocol

// A streamed reply is generated whole before any of it is sent (§4.7), so
// a long generation is a silence on the connection, and clients bound
// silences: Claude Code gives up on a request whose response head has not
// come within API_TIMEOUT_MS (600 s by default) and sends it again, which
// starts the generation over, up to ten times. The adapter may therefore
// answer a slow streamed turn early and keep the stream alive until the
// reply is ready (§4.7's design note); these are the frames it sends.

// KeepAlive is the frame a streamed reply in protocol p repeats while its
// turn is generated, or "" where none is sent: Anthropic's own ping
// event (the API sends it, so every client of it ignores it), an SSE
// comment for Chat Completions (which OpenAI's SDKs skip), and nothing for
// Responses: Codex, its main client, waits for a response head without a
// limit but, once it has one, gives up after stream_idle_timeout_ms (300 s
// by default) without an event, and a comment is not one — keep-alives
// would shorten the wait they are meant to lengthen.
func KeepAlive(p Protocol) string {
	switch p {
	case Anthropic:
		return "event: ping\ndata: {\"type\":\"ping\"}\n\n"
	case Chat:
		return ": keep-alive\n\n"
	}
	return ""
}

// StreamError is e as the event that ends a stream of protocol p whose
// head was already sent (the status can no longer say it): Anthropic's
// error event, Chat Completions' error data line, Responses' error event.
func StreamError(p Protocol, e *Error) []byte {
	var b []byte
	switch p {
	case Anthropic:
		b = append(b, "event: error\ndata: "...)
		b = append(b, e.Body(p)...)
	case Responses:
		var code, param any // null when empty
		if e.Code != "" {
			code = e.Code
		}
		if e.Param != "" {
			param = e.Param
		}
		o := obj("type", "error", "code", code, "message", e.Message, "param", param, "sequence_number", 0)
		b = append(b, "event: error\ndata: "...)
		b = appendJSON(b, o)
	default:
		b = append(b, "data: "...)
		b = append(b, e.Body(p)...)
	}
	return append(b, "\n\n"...)
}
