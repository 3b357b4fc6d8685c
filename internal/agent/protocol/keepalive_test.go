package protocol

import (
	"bytes"
	"regexp"
	"slices"
	"strings"
	"testing"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
)

// A prelude's frames followed by its Reply are a stream as valid as the
// whole reply's: Anthropic and Chat frames stand apart from the reply,
// which follows unchanged; Responses frames are the reply's own
// response.created plus response.in_progress events, and the reply's
// events follow under the same response id, numbered on.
func TestPrelude(t *testing.T) {
	const frames = 3
	seqField := regexp.MustCompile(`"sequence_number":\d+`)
	for _, p := range []Protocol{Anthropic, Responses, Chat} {
		for name, rep := range replies {
			t.Run(string(p)+"/"+name, func(t *testing.T) {
				req := &Request{Protocol: p, Model: "m", Stream: true}
				var whole bytes.Buffer
				require.NoError(t, WriteReply(&whole, req, &rep, ReplyOptions{IDs: SeededIDs(1), Created: 1700000000}))

				pre := NewPrelude(req, ReplyOptions{IDs: SeededIDs(1), Created: 1700000000})
				var got bytes.Buffer
				var sent []string
				for range frames {
					f := pre.Frame()
					sent = append(sent, string(f))
					got.Write(f)
				}
				require.NoError(t, pre.Reply(&got, &rep))
				switch p {
				case Anthropic:
					assert.Equal(t, strings.Repeat("event: ping\ndata: {\"type\":\"ping\"}\n\n", frames)+whole.String(), got.String())
				case Chat:
					assert.Equal(t, strings.Repeat(": keep-alive\n\n", frames)+whole.String(), got.String())
				case Responses:
					checkFraming(t, p, true, got.Bytes())
					want := append([]string{"response.created"}, slices.Repeat([]string{"response.in_progress"}, frames)...)
					want = append(want, eventTypes(whole.String())[1:]...)
					assert.Equal(t, want, eventTypes(got.String()))
					// Less the keep-alives and the numbering, the whole reply.
					var kept []string
					for _, ev := range strings.SplitAfter(got.String(), "\n\n") {
						if !strings.HasPrefix(ev, "event: response.in_progress\n") {
							kept = append(kept, ev)
						}
					}
					assert.Equal(t, seqField.ReplaceAllString(whole.String(), ""), seqField.ReplaceAllString(strings.Join(kept, ""), ""))
					assert.Equal(t, strings.Replace(sent[1], `"type":"response.in_progress","sequence_number":2`, `"type":"response.in_progress","sequence_number":3`, 1), sent[2],
						"each in_progress is the same but for its number")
				}
			})
		}
	}
	assert.Nil(t, NewPrelude(&Request{Protocol: Anthropic}, ReplyOptions{}), "JSON replies have no prelude")
}

// A failure after a stream's head is the protocol's own error event.
func TestPreludeError(t *testing.T) {
	e := &Error{Status: 500, Type: "api_error", Message: "vllm upstream 500: <boom> & \"x\""}
	for _, c := range []struct {
		p    Protocol
		want string
	}{
		{Anthropic, "event: error\ndata: {\"type\":\"error\",\"error\":{\"type\":\"api_error\",\"message\":\"vllm upstream 500: <boom> & \\\"x\\\"\"}}\n\n"},
		{Chat, "data: {\"error\":{\"message\":\"vllm upstream 500: <boom> & \\\"x\\\"\",\"type\":\"api_error\",\"param\":null,\"code\":null}}\n\n"},
		{Responses, "event: error\ndata: {\"type\":\"error\",\"code\":null,\"message\":\"vllm upstream 500: <boom> & \\\"x\\\"\",\"param\":null,\"sequence_number\":0}\n\n"},
	} {
		pre := NewPrelude(&Request{Protocol: c.p, Stream: true}, ReplyOptions{IDs: SeededIDs(1)})
		assert.Equal(t, c.want, string(pre.Error(e)), c.p)
	}
	// On Responses the error event is numbered after the frames sent.
	pre := NewPrelude(&Request{Protocol: Responses, Stream: true}, ReplyOptions{IDs: SeededIDs(1)})
	pre.Frame() // response.created 0, response.in_progress 1
	pre.Frame() // response.in_progress 2
	coded := &Error{Status: 400, Type: "invalid_request_error", Code: "context_length_exceeded", Param: "input", Message: "too long"}
	assert.Equal(t, "event: error\ndata: {\"type\":\"error\",\"code\":\"context_length_exceeded\",\"message\":\"too long\",\"param\":\"input\",\"sequence_number\":3}\n\n",
		string(pre.Error(coded)))
}
