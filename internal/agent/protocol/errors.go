package protocol

import (
	"fmt"
	"net/http"

	"github.com/kilnrl/kiln/internal/ojson"
)

// Error is a request the adapter answers with an HTTP error, in the
// protocol's own shape (Body). Decoders return only *Error values, all 4xx.
type Error struct {
	Status  int    // HTTP status
	Type    string // Anthropic error.type / OpenAI error.type
	Code    string // OpenAI error.code ("" -> null)
	Param   string // OpenAI error.param ("" -> null)
	Message string
}

func (e *Error) Error() string { return fmt.Sprintf("%d %s: %s", e.Status, e.Type, e.Message) }

func badRequest(msg string) *Error {
	return &Error{Status: http.StatusBadRequest, Type: "invalid_request_error", Message: msg}
}

// Body renders the error in protocol p's envelope.
func (e *Error) Body(p Protocol) []byte {
	if p == Anthropic {
		return AnthropicError(e.Status, e.Type, e.Message)
	}
	return openAIBody(e.Status, e.Type, e.Code, e.Param, e.Message)
}

// AnthropicError is {"type":"error","error":{"type":T,"message":M}}; an
// empty typ is derived from the status as the Anthropic API names them.
func AnthropicError(status int, typ, message string) []byte {
	if typ == "" {
		typ = anthropicType(status)
	}
	return ojson.Marshal(ojson.Obj("type", "error", "error", ojson.Obj("type", typ, "message", message)))
}

func anthropicType(status int) string {
	switch status {
	case 400:
		return "invalid_request_error"
	case 401:
		return "authentication_error"
	case 403:
		return "permission_error"
	case 404:
		return "not_found_error"
	case 413:
		return "request_too_large"
	case 429:
		return "rate_limit_error"
	case 529:
		return "overloaded_error"
	}
	if status >= 500 {
		return "api_error"
	}
	return "invalid_request_error"
}

// OpenAIError is {"error":{"message":M,"type":T,"param":null,"code":C}}
// (code null when empty); an empty typ is derived from the status.
func OpenAIError(status int, typ, code, message string) []byte {
	return openAIBody(status, typ, code, "", message)
}

func openAIBody(status int, typ, code, param, message string) []byte {
	if typ == "" {
		switch {
		case status == 429:
			typ = "rate_limit_error"
		case status >= 500:
			typ = "server_error"
		default:
			typ = "invalid_request_error"
		}
	}
	return ojson.Marshal(ojson.Obj("error", ojson.Obj("message", message, "type", typ, "param", orNull(param), "code", orNull(code))))
}

// orNull is s as a JSON value, null when empty (OpenAI's error code and
// param).
func orNull(s string) any {
	if s == "" {
		return nil
	}
	return s
}

// ContextOverflow is the error for a prompt of promptTokens that leaves no
// room in a context of maxTokens, in protocol p's own words: Anthropic's
// 400 invalid_request_error "prompt is too long: N tokens > M maximum"
// (what Claude Code reacts to by compacting), OpenAI's 400
// invalid_request_error with code context_length_exceeded.
func ContextOverflow(p Protocol, promptTokens, maxTokens int) *Error {
	if p == Anthropic {
		return &Error{Status: 400, Type: "invalid_request_error",
			Message: fmt.Sprintf("prompt is too long: %d tokens > %d maximum", promptTokens, maxTokens)}
	}
	param := "messages"
	if p == Responses {
		param = "input"
	}
	return &Error{Status: 400, Type: "invalid_request_error", Code: "context_length_exceeded", Param: param,
		Message: fmt.Sprintf("This model's maximum context length is %d tokens. However, your messages resulted in %d tokens. Please reduce the length of the messages.", maxTokens, promptTokens)}
}
