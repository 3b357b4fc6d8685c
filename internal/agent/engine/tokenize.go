package engine

import (
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"math"
	"net/http"
	"strconv"
)

// ChatRequest is the chat form of POST /tokenize (docs/engine-wire.md §2.2).
// Messages and Tools are sent verbatim (bytes as given: key order kept, no
// re-encoding, no HTML escaping). Send every tool with all of type, function
// {name, description, parameters}: vLLM re-serialises tools and turns a
// missing description/parameters into an explicit null (docs/engine-wire.md §2.2).
type ChatRequest struct {
	Messages []json.RawMessage
	Tools    []json.RawMessage // nil or empty: "tools" not sent
	// AddGenerationPrompt is always sent (the server default is true).
	AddGenerationPrompt bool
	// ContinueFinalMessage is sent only when true; it excludes
	// AddGenerationPrompt (vLLM answers 400 to both).
	ContinueFinalMessage bool
	// AddSpecialTokens is always sent; keep it false so the ids are exactly
	// what the template emits (docs/engine-wire.md §2.2, docs/engine-wire.md §10.6).
	AddSpecialTokens bool
	// ChatTemplateKwargs is a JSON object merged into the template context
	// (e.g. {"enable_thinking": false}); nil: not sent. Sent verbatim.
	ChatTemplateKwargs json.RawMessage
	// ChatTemplate overrides the server's template; vLLM refuses it (400)
	// unless started with --trust-request-chat-template. "": not sent.
	ChatTemplate string
	// Memo, when set, is the conversation's: the ids this reply shares
	// byte for byte with an earlier render are taken from it rather than
	// parsed, and messages and tools the last request through it held are
	// not checked again (not sent; see Memo).
	Memo *Memo
}

// TokenizeChat renders messages with the served model's chat template and
// tokenizer through POST /tokenize and returns the prompt ids.
func (c *Client) TokenizeChat(ctx context.Context, req ChatRequest) ([]int32, error) {
	body, err := c.tokenizeBody(req)
	if err != nil {
		return nil, err
	}
	return c.tokenize(ctx, body, req.Memo)
}

func (c *Client) tokenizeBody(req ChatRequest) ([]byte, error) {
	if len(req.Messages) == 0 {
		return nil, errors.New("engine: TokenizeChat: no messages")
	}
	if req.AddGenerationPrompt && req.ContinueFinalMessage {
		return nil, errors.New("engine: TokenizeChat: AddGenerationPrompt and ContinueFinalMessage are exclusive (vLLM answers 400 to both)")
	}
	b := bytes.NewBuffer(make([]byte, 0, 256+bodySize(req.Messages)+bodySize(req.Tools)))
	b.WriteByte('{')
	if c.opts.Model != "" {
		m, _ := marshal(c.opts.Model)
		b.WriteString(`"model":`)
		b.Write(m)
		b.WriteByte(',')
	}
	b.WriteString(`"messages":[`)
	checkedMsgs, checkedTools := req.Memo.checked()
	for i, m := range req.Messages {
		if !(i < len(checkedMsgs) && sameSlice(m, checkedMsgs[i])) && !validValue(m, '{') {
			return nil, fmt.Errorf("engine: TokenizeChat: messages[%d] is not a JSON object", i)
		}
		if i > 0 {
			b.WriteByte(',')
		}
		b.Write(bytes.TrimSpace(m))
	}
	b.WriteByte(']')
	if len(req.Tools) > 0 {
		b.WriteString(`,"tools":[`)
		for i, t := range req.Tools {
			if !(i < len(checkedTools) && sameSlice(t, checkedTools[i])) && !validValue(t, '{') {
				return nil, fmt.Errorf("engine: TokenizeChat: tools[%d] is not a JSON object", i)
			}
			if i > 0 {
				b.WriteByte(',')
			}
			b.Write(bytes.TrimSpace(t))
		}
		b.WriteByte(']')
	}
	req.Memo.setChecked(req.Messages, req.Tools)
	b.WriteString(`,"add_generation_prompt":`)
	b.WriteString(strconv.FormatBool(req.AddGenerationPrompt))
	if req.ContinueFinalMessage {
		b.WriteString(`,"continue_final_message":true`)
	}
	b.WriteString(`,"add_special_tokens":`)
	b.WriteString(strconv.FormatBool(req.AddSpecialTokens))
	if req.ChatTemplateKwargs != nil {
		if !validValue(req.ChatTemplateKwargs, '{') {
			return nil, errors.New("engine: TokenizeChat: ChatTemplateKwargs is not a JSON object")
		}
		b.WriteString(`,"chat_template_kwargs":`)
		b.Write(bytes.TrimSpace(req.ChatTemplateKwargs))
	}
	if req.ChatTemplate != "" {
		t, _ := marshal(req.ChatTemplate)
		b.WriteString(`,"chat_template":`)
		b.Write(t)
	}
	b.WriteByte('}')
	return b.Bytes(), nil
}

// bodySize is the bytes of raw values written one after another.
func bodySize(vals []json.RawMessage) int {
	n := 0
	for _, v := range vals {
		n += len(v) + 1
	}
	return n
}

// validValue: raw is one JSON value whose first byte is open ('{' or '[').
func validValue(raw json.RawMessage, open byte) bool {
	t := bytes.TrimSpace(raw)
	return len(t) > 0 && t[0] == open && json.Valid(t)
}

func (c *Client) tokenize(ctx context.Context, body []byte, memo *Memo) ([]int32, error) {
	const path = "/tokenize"
	r, err := c.do(ctx, http.MethodPost, path, body, nil)
	if err != nil {
		return nil, err
	}
	if r.status/100 != 2 {
		return nil, c.httpError(http.MethodPost, path, r)
	}
	ids, maxLen, err := readTokenize(r.body, memo)
	if err != nil {
		return nil, err
	}
	c.learnContext(maxLen)
	return ids, nil
}

// readTokenize reads a /tokenize reply: its ids (through memo, see Memo)
// and max_model_len (0 when absent). The reply is decoded with its tokens
// list raw, the list read through memo (decoded whole without one), and a
// reply the memo does not take is decoded again to word the error.
func readTokenize(body []byte, memo *Memo) (ids []int32, maxLen int, err error) {
	var resp struct {
		Count       *int            `json:"count"`
		MaxModelLen int             `json:"max_model_len"`
		Tokens      json.RawMessage `json:"tokens"`
	}
	if json.Unmarshal(body, &resp) == nil && !isNull(resp.Tokens) {
		if ids, ok := memo.scan(resp.Tokens); ok {
			if resp.Count != nil && *resp.Count != len(ids) {
				return nil, 0, replyErr("/tokenize", ReasonLengthMismatch, "count %d but %d tokens", *resp.Count, len(ids))
			}
			return ids, resp.MaxModelLen, nil
		}
	}
	return readTokenizeIDs(body)
}

// readTokenizeIDs reads a /tokenize reply the memo did not take (tokens
// missing or not a list of int32 ids) as int64 ids, and words the error.
func readTokenizeIDs(body []byte) ([]int32, int, error) {
	const path = "/tokenize"
	var resp struct {
		Count       *int    `json:"count"`
		MaxModelLen int     `json:"max_model_len"`
		Tokens      []int64 `json:"tokens"`
	}
	if err := json.Unmarshal(body, &resp); err != nil {
		return nil, 0, replyErr(path, ReasonBadJSON, "%v: %s", err, clip(body, 200))
	}
	if resp.Tokens == nil {
		return nil, 0, replyErr(path, ReasonMissingTokenIDs, "no tokens list")
	}
	if resp.Count != nil && *resp.Count != len(resp.Tokens) {
		return nil, 0, replyErr(path, ReasonLengthMismatch, "count %d but %d tokens", *resp.Count, len(resp.Tokens))
	}
	ids := make([]int32, len(resp.Tokens))
	for i, t := range resp.Tokens {
		if t < 0 || t > math.MaxInt32 {
			return nil, 0, replyErr(path, ReasonBadTokenID, "tokens[%d] = %d", i, t)
		}
		ids[i] = int32(t)
	}
	return ids, resp.MaxModelLen, nil
}

// Detokenize decodes ids with POST /detokenize. vLLM keeps special tokens in
// the text (docs/engine-wire.md §3).
func (c *Client) Detokenize(ctx context.Context, ids []int32) (string, error) {
	const path = "/detokenize"
	for i, id := range ids {
		if id < 0 {
			return "", fmt.Errorf("engine: Detokenize: ids[%d] = %d is negative", i, id)
		}
	}
	if ids == nil {
		ids = []int32{} // "tokens":[], not null
	}
	body, err := marshal(struct {
		Model  string  `json:"model,omitempty"`
		Tokens []int32 `json:"tokens"`
	}{c.opts.Model, ids})
	if err != nil {
		return "", err
	}
	r, err := c.do(ctx, http.MethodPost, path, body, nil)
	if err != nil {
		return "", err
	}
	if r.status/100 != 2 {
		return "", c.httpError(http.MethodPost, path, r)
	}
	return readDetokenize(r.body)
}

// readDetokenize reads a /detokenize reply's "prompt" string.
func readDetokenize(body []byte) (string, error) {
	const path = "/detokenize"
	var resp struct {
		Prompt *string `json:"prompt"`
	}
	if err := json.Unmarshal(body, &resp); err != nil {
		return "", replyErr(path, ReasonBadJSON, "%v: %s", err, clip(body, 200))
	}
	if resp.Prompt == nil {
		return "", replyErr(path, ReasonBadJSON, "no prompt string in %s", clip(body, 200))
	}
	return *resp.Prompt, nil
}
