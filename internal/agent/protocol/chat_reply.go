package protocol

import (
	"io"

	"github.com/kilnrl/kiln/internal/ojson"
)

func chatFinish(rep *Reply) string {
	switch {
	case len(rep.Calls) > 0:
		return "tool_calls"
	case rep.FinishReason == "length":
		return "length"
	}
	return "stop"
}

// chatCall is the first call as a wire tool call (docs/adapter.md §5.6: Chat clients get
// only the first of parallel calls). Arguments keep the model's key order.
func chatCall(rep *Reply, ids IDSource) *ojson.Object {
	c := rep.Calls[0]
	return ojson.Obj("id", "call_"+ids.Hex(24), "type", "function",
		"function", ojson.Obj("name", callName(c), "arguments", string(ojson.Marshal(callArgs(c)))))
}

// WriteChat writes the non-streaming chat.completion object (docs/adapter.md §5.6).
func WriteChat(w io.Writer, req *Request, rep *Reply, opt ReplyOptions) error {
	ids := opt.ids()
	id := "chatcmpl_" + ids.Hex(24)
	msg := ojson.Obj("role", "assistant", "content", nil)
	if len(rep.Calls) == 0 && rep.Content != "" {
		msg.Set("content", rep.Content)
	}
	if rep.Reasoning != "" {
		msg.Set("reasoning_content", rep.Reasoning)
	}
	if len(rep.Calls) > 0 {
		msg.Set("tool_calls", []any{chatCall(rep, ids)})
	}
	return writeJSON(w, ojson.Obj(
		"id", id,
		"object", "chat.completion",
		"created", opt.created(),
		"model", model(req),
		"choices", []any{ojson.Obj("index", 0, "message", msg, "finish_reason", chatFinish(rep))},
		"usage", chatUsage(rep),
	))
}

func chatUsage(rep *Reply) *ojson.Object {
	return ojson.Obj("prompt_tokens", rep.PromptTokens, "completion_tokens", rep.OutputTokens,
		"total_tokens", rep.PromptTokens+rep.OutputTokens)
}

// StreamChat writes chat.completion.chunk data lines (docs/adapter.md §5.6): role,
// reasoning_content (if any), content (if non-empty and no call), the
// tool call in one chunk with index 0, a final empty delta with
// finish_reason and usage, then data: [DONE].
func StreamChat(w io.Writer, req *Request, rep *Reply, opt ReplyOptions) error {
	ids := opt.ids()
	id := "chatcmpl_" + ids.Hex(24)
	created := opt.created()
	f := &frames{w: w}
	chunk := func(delta *ojson.Object, finish any) *ojson.Object {
		return ojson.Obj("id", id, "object", "chat.completion.chunk", "created", created, "model", model(req),
			"choices", []any{ojson.Obj("index", 0, "delta", delta, "finish_reason", finish)})
	}
	f.event("", chunk(ojson.Obj("role", "assistant"), nil))
	if rep.Reasoning != "" {
		f.event("", chunk(ojson.Obj("reasoning_content", rep.Reasoning), nil))
	}
	if len(rep.Calls) == 0 && rep.Content != "" {
		f.event("", chunk(ojson.Obj("content", rep.Content), nil))
	}
	if len(rep.Calls) > 0 {
		tc := chatCall(rep, ids)
		tc = ojson.Obj("index", 0, "id", tc.Val("id"), "type", "function", "function", tc.Val("function"))
		f.event("", chunk(ojson.Obj("tool_calls", []any{tc}), nil))
	}
	last := chunk(&ojson.Object{}, chatFinish(rep))
	last.Set("usage", chatUsage(rep))
	f.event("", last)
	f.event("", nil)
	return f.err
}
