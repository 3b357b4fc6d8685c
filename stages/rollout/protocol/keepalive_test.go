package protocol

import (
	"testing"

	"github.com/stretchr/testify/assert"
)

// A failure after a stream's head is the protocol's own error event.
func TestStreamError(t *testing.T) {
	e := &Error{Status: 500, Type: "api_error", Message: "vllm upstream 500: <boom> & \"x\""}
	for _, c := range []struct {
		p    Protocol
		want string
	}{
		{Anthropic, "event: error\ndata: {\"type\":\"error\",\"error\":{\"type\":\"api_error\",\"message\":\"vllm upstream 500: <boom> & \\\"x\\\"\"}}\n\n"},
		{Chat, "data: {\"error\":{\"message\":\"vllm upstream 500: <boom> & \\\"x\\\"\",\"type\":\"api_error\",\"param\":null,\"code\":null}}\n\n"},
		{Responses, "event: error\ndata: {\"type\":\"error\",\"code\":null,\"message\":\"vllm upstream 500: <boom> & \\\"x\\\"\",\"param\":null,\"sequence_number\":0}\n\n"},
	} {
		assert.Equal(t, c.want, string(StreamError(c.p, e)), c.p)
	}
	coded := &Error{Status: 400, Type: "invalid_request_error", Code: "context_length_exceeded", Param: "input", Message: "too long"}
	assert.Equal(t, "event: error\ndata: {\"type\":\"error\",\"code\":\"context_length_exceeded\",\"message\":\"too long\",\"param\":\"input\",\"sequence_number\":0}\n\n",
		string(StreamError(Responses, coded)))
}
