package engine

import (
	"encoding/json"
	"testing"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
)

func TestTokenizeChatBody(t *testing.T) {
	msgs := []json.RawMessage{
		json.RawMessage(`{"role":"system","content":"Use <tools> & be brief"}`),
		json.RawMessage(`{"role":"user","content":"hi"}`),
		json.RawMessage(`{"role":"assistant","content":"","tool_calls":[{"type":"function","function":{"name":"ls","arguments":{"z":1,"a":2}}}]}`),
	}
	tools := []json.RawMessage{json.RawMessage(`{"type":"function","function":{"name":"ls","description":"list <dir>","parameters":{"type":"object","properties":{"z":{"type":"string"},"a":{"type":"string"}}}}}`)}
	for _, tc := range []struct {
		name string
		opts Options
		req  ChatRequest
		want string
	}{
		{
			name: "generation prompt, tools, kwargs",
			opts: Options{Model: "qwen3"},
			req:  ChatRequest{Messages: msgs[:2], Tools: tools, AddGenerationPrompt: true, ChatTemplateKwargs: json.RawMessage(`{"enable_thinking":false,"reasoning_effort":"medium"}`)},
			want: `{"model":"qwen3","messages":[` + string(msgs[0]) + `,` + string(msgs[1]) + `],"tools":[` + string(tools[0]) +
				`],"add_generation_prompt":true,"add_special_tokens":false,"chat_template_kwargs":{"enable_thinking":false,"reasoning_effort":"medium"}}`,
		},
		{
			name: "continue final message, no tools",
			req:  ChatRequest{Messages: msgs, ContinueFinalMessage: true, ChatTemplate: "{{ x }}"},
			want: `{"messages":[` + string(msgs[0]) + `,` + string(msgs[1]) + `,` + string(msgs[2]) +
				`],"add_generation_prompt":false,"continue_final_message":true,"add_special_tokens":false,"chat_template":"{{ x }}"}`,
		},
	} {
		t.Run(tc.name, func(t *testing.T) {
			f := newFake(t, map[string]reply{"POST /tokenize": {body: golden(t, "tokenize.json")}})
			c := newClient(t, f.URL, tc.opts)
			ids, err := c.TokenizeChat(bg, tc.req)
			require.NoError(t, err)
			assert.Equal(t, []int32{151644, 872, 198, 151645}, ids)
			assert.Equal(t, tc.want, string(f.last(t, "/tokenize").Body))
			assert.Equal(t, 40960, c.ContextLength(), "max_model_len learned from /tokenize")
		})
	}
}

func TestTokenizeChatErrors(t *testing.T) {
	f := newFake(t, map[string]reply{"POST /tokenize": {body: []byte(`{"count":3,"max_model_len":10,"tokens":[1,2]}`)}})
	c := newClient(t, f.URL, Options{ContextLength: 5})
	m := []json.RawMessage{json.RawMessage(`{"role":"user","content":"x"}`)}
	for _, tc := range []struct {
		req  ChatRequest
		want string
	}{
		{ChatRequest{}, "no messages"},
		{ChatRequest{Messages: m, AddGenerationPrompt: true, ContinueFinalMessage: true}, "exclusive"},
		{ChatRequest{Messages: []json.RawMessage{json.RawMessage(`{"role":`)}}, "messages[0] is not a JSON object"},
		{ChatRequest{Messages: m, Tools: []json.RawMessage{json.RawMessage(`[]`)}}, "tools[0]"},
		{ChatRequest{Messages: m, ChatTemplateKwargs: json.RawMessage(`3`)}, "ChatTemplateKwargs"},
		{ChatRequest{Messages: m}, "count 3 but 2 tokens"},
	} {
		_, err := c.TokenizeChat(bg, tc.req)
		assert.ErrorContains(t, err, tc.want)
	}
	assert.Equal(t, 5, c.ContextLength(), "an explicit ContextLength is kept")

	// Through a memo, only the very slices a body already held skip the
	// check: other bytes at the same index, or the same bytes re-sliced,
	// are checked.
	var memo Memo
	tools := []json.RawMessage{json.RawMessage(`{"type":"function","function":{"name":"f"}}`)}
	_, err := c.TokenizeChat(bg, ChatRequest{Messages: m, Tools: tools, Memo: &memo})
	assert.ErrorContains(t, err, "count 3 but 2 tokens", "the body was sent")
	for _, tc := range []struct {
		req  ChatRequest
		want string
	}{
		{ChatRequest{Messages: []json.RawMessage{json.RawMessage(`{"role":`)}, Memo: &memo}, "messages[0] is not a JSON object"},
		{ChatRequest{Messages: []json.RawMessage{m[0][:len(m[0])-1]}, Memo: &memo}, "messages[0] is not a JSON object"},
		{ChatRequest{Messages: m, Tools: []json.RawMessage{tools[0][:5]}, Memo: &memo}, "tools[0]"},
	} {
		_, err := c.TokenizeChat(bg, tc.req)
		assert.ErrorContains(t, err, tc.want)
	}

	f2 := newFake(t, map[string]reply{"POST /tokenize": {status: 400, body: []byte(`{"error":{"message":"Chat template is passed with request, but --trust-request-chat-template is not set. Refused request with untrusted chat template.","type":"BadRequestError","param":null,"code":400}}`)}})
	c2 := newClient(t, f2.URL, Options{})
	_, err = c2.TokenizeChat(bg, ChatRequest{Messages: m, ChatTemplate: "x"})
	var he *HTTPError
	require.ErrorAs(t, err, &he)
	assert.Contains(t, he.Error(), "--trust-request-chat-template")
}

func TestDetokenize(t *testing.T) {
	f := newFake(t, map[string]reply{"POST /detokenize": {body: golden(t, "detokenize.json")}})
	c := newClient(t, f.URL, Options{Model: "qwen3"})
	s, err := c.Detokenize(bg, []int32{151644, 872, 198, 151645})
	require.NoError(t, err)
	assert.Equal(t, "<|im_start|>user\n<|im_end|>", s)
	assert.Equal(t, `{"model":"qwen3","tokens":[151644,872,198,151645]}`, string(f.last(t, "/detokenize").Body))
	_, err = c.Detokenize(bg, []int32{-1})
	assert.ErrorContains(t, err, "negative")

	f2 := newFake(t, map[string]reply{"POST /detokenize": {body: []byte(`{}`)}})
	_, err = newClient(t, f2.URL, Options{}).Detokenize(bg, nil)
	assert.ErrorContains(t, err, "no prompt string")
	assert.Equal(t, `{"tokens":[]}`, string(f2.last(t, "/detokenize").Body))
}
