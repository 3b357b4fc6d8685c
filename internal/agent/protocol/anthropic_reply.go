package protocol

import (
	"io"

	"github.com/kilnrl/kiln/internal/ojson"
)

// anthropicBlocks is docs/adapter.md §4.5: thinking (no signature), text, one tool_use per
// call; a reply with none of them is one empty text block.
func anthropicBlocks(rep *Reply, ids IDSource) []*ojson.Object {
	var blocks []*ojson.Object
	if rep.Reasoning != "" {
		blocks = append(blocks, ojson.Obj("type", "thinking", "thinking", rep.Reasoning))
	}
	if rep.Content != "" {
		blocks = append(blocks, ojson.Obj("type", "text", "text", rep.Content))
	}
	for _, c := range rep.Calls {
		blocks = append(blocks, ojson.Obj("type", "tool_use", "id", "toolu_"+ids.Hex(16), "name", callName(c), "input", callArgs(c)))
	}
	if len(blocks) == 0 {
		blocks = append(blocks, ojson.Obj("type", "text", "text", ""))
	}
	return blocks
}

func anthropicStop(rep *Reply) string {
	switch {
	case len(rep.Calls) > 0:
		return "tool_use"
	case rep.FinishReason == "length":
		return "max_tokens"
	}
	return "end_turn"
}

// WriteAnthropic writes the non-streaming message object (docs/adapter.md §4.6).
func WriteAnthropic(w io.Writer, req *Request, rep *Reply, opt ReplyOptions) error {
	ids := opt.ids()
	id := "msg_" + ids.Hex(24)
	return writeJSON(w, ojson.Obj(
		"id", id,
		"type", "message",
		"role", "assistant",
		"model", model(req),
		"content", anthropicBlocks(rep, ids),
		"stop_reason", anthropicStop(rep),
		"stop_sequence", nil,
		"usage", ojson.Obj("input_tokens", rep.PromptTokens, "output_tokens", rep.OutputTokens),
	))
}

// StreamAnthropic writes the SSE event sequence of docs/adapter.md §4.7: message_start,
// content_block_start/delta/stop per block (thinking_delta, text_delta,
// input_json_delta with the whole input), message_delta with stop_reason
// and usage, message_stop. No ping, signature_delta or error events.
func StreamAnthropic(w io.Writer, req *Request, rep *Reply, opt ReplyOptions) error {
	ids := opt.ids()
	f := &frames{w: w}
	f.event("message_start", ojson.Obj("type", "message_start", "message", ojson.Obj(
		"id", "msg_"+ids.Hex(24),
		"type", "message",
		"role", "assistant",
		"model", model(req),
		"content", []any{},
		"stop_reason", nil,
		"stop_sequence", nil,
		"usage", ojson.Obj("input_tokens", rep.PromptTokens, "output_tokens", 0),
	)))
	for i, b := range anthropicBlocks(rep, ids) {
		var start, delta *ojson.Object
		switch b.Val("type") {
		case "thinking":
			start = ojson.Obj("type", "thinking", "thinking", "")
			delta = ojson.Obj("type", "thinking_delta", "thinking", b.Val("thinking"))
		case "text":
			start = ojson.Obj("type", "text", "text", "")
			delta = ojson.Obj("type", "text_delta", "text", b.Val("text"))
		default:
			start = ojson.Obj("type", "tool_use", "id", b.Val("id"), "name", b.Val("name"), "input", &ojson.Object{})
			delta = ojson.Obj("type", "input_json_delta", "partial_json", string(ojson.Marshal(b.Val("input"))))
		}
		f.event("content_block_start", ojson.Obj("type", "content_block_start", "index", i, "content_block", start))
		f.event("content_block_delta", ojson.Obj("type", "content_block_delta", "index", i, "delta", delta))
		f.event("content_block_stop", ojson.Obj("type", "content_block_stop", "index", i))
	}
	f.event("message_delta", ojson.Obj("type", "message_delta",
		"delta", ojson.Obj("stop_reason", anthropicStop(rep), "stop_sequence", nil),
		"usage", ojson.Obj("input_tokens", rep.PromptTokens, "output_tokens", rep.OutputTokens)))
	f.event("message_stop", ojson.Obj("type", "message_stop"))
	return f.err
}
