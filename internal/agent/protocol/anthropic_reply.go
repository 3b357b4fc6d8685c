package protocol

import "io"

// anthropicBlocks is §4.5: thinking (no signature), text, one tool_use per
// call; a reply with none of them is one empty text block.
func anthropicBlocks(rep *Reply, ids IDSource) []*object {
	var blocks []*object
	if rep.Reasoning != "" {
		blocks = append(blocks, obj("type", "thinking", "thinking", rep.Reasoning))
	}
	if rep.Content != "" {
		blocks = append(blocks, obj("type", "text", "text", rep.Content))
	}
	for _, c := range rep.Calls {
		blocks = append(blocks, obj("type", "tool_use", "id", "toolu_"+ids.Hex(16), "name", callName(c), "input", callArgs(c)))
	}
	if len(blocks) == 0 {
		blocks = append(blocks, obj("type", "text", "text", ""))
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

// WriteAnthropic writes the non-streaming message object (§4.6).
func WriteAnthropic(w io.Writer, req *Request, rep *Reply, opt ReplyOptions) error {
	ids := opt.ids()
	id := "msg_" + ids.Hex(24)
	return writeJSON(w, obj(
		"id", id,
		"type", "message",
		"role", "assistant",
		"model", model(req),
		"content", anthropicBlocks(rep, ids),
		"stop_reason", anthropicStop(rep),
		"stop_sequence", nil,
		"usage", obj("input_tokens", rep.PromptTokens, "output_tokens", rep.OutputTokens),
	))
}

// StreamAnthropic writes the SSE event sequence of §4.7: message_start,
// content_block_start/delta/stop per block (thinking_delta, text_delta,
// input_json_delta with the whole input), message_delta with stop_reason
// and usage, message_stop. No ping, signature_delta or error events.
func StreamAnthropic(w io.Writer, req *Request, rep *Reply, opt ReplyOptions) error {
	ids := opt.ids()
	f := &frames{w: w}
	f.event("message_start", obj("type", "message_start", "message", obj(
		"id", "msg_"+ids.Hex(24),
		"type", "message",
		"role", "assistant",
		"model", model(req),
		"content", []any{},
		"stop_reason", nil,
		"stop_sequence", nil,
		"usage", obj("input_tokens", rep.PromptTokens, "output_tokens", 0),
	)))
	for i, b := range anthropicBlocks(rep, ids) {
		var start, delta *object
		switch b.val("type") {
		case "thinking":
			start = obj("type", "thinking", "thinking", "")
			delta = obj("type", "thinking_delta", "thinking", b.val("thinking"))
		case "text":
			start = obj("type", "text", "text", "")
			delta = obj("type", "text_delta", "text", b.val("text"))
		default:
			start = obj("type", "tool_use", "id", b.val("id"), "name", b.val("name"), "input", &object{})
			delta = obj("type", "input_json_delta", "partial_json", string(marshal(b.val("input"))))
		}
		f.event("content_block_start", obj("type", "content_block_start", "index", i, "content_block", start))
		f.event("content_block_delta", obj("type", "content_block_delta", "index", i, "delta", delta))
		f.event("content_block_stop", obj("type", "content_block_stop", "index", i))
	}
	f.event("message_delta", obj("type", "message_delta",
		"delta", obj("stop_reason", anthropicStop(rep), "stop_sequence", nil),
		"usage", obj("input_tokens", rep.PromptTokens, "output_tokens", rep.OutputTokens)))
	f.event("message_stop", obj("type", "message_stop"))
	return f.err
}
