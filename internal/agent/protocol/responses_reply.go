package protocol

import (
	"encoding/base64"
	"io"

	"github.com/kilnrl/kiln/internal/ojson"
)

// reasoningHandle prefixes the encrypted_content of the reasoning items kiln
// emits: the model's own reasoning text, base64. Codex echoes reasoning items
// verbatim (docs/clients-wire.md), so the next request carries the reasoning the
// chat template needs to render the history exactly as sampled, and prefix
// reuse can continue from the original tokens. Foreign encrypted_content is
// ignored.
const reasoningHandle = "kiln-reasoning:v1:"

func encodeReasoningHandle(reasoning string) string {
	return reasoningHandle + base64.StdEncoding.EncodeToString([]byte(reasoning))
}

type responsesItem struct {
	final, added *ojson.Object // the completed item and its in-progress form
	kind         string        // message, function_call, custom_tool_call
	id           string
	text         string // message text, function arguments or custom input
}

// responsesItems is docs/adapter.md §5.4: a reasoning item carrying the reasoning (kiln's
// addition, see reasoningHandle), a message item when there is text or no call,
// then one item per call (all of them), named and typed after the
// request's tool specs (unknown names: plain functions, no namespace).
func responsesItems(req *Request, rep *Reply, ids IDSource) []responsesItem {
	var items []responsesItem
	if rep.Reasoning != "" {
		id := "rs_" + ids.Hex(24)
		item := ojson.Obj("type", "reasoning", "id", id, "summary", []any{}, "encrypted_content", encodeReasoningHandle(rep.Reasoning))
		items = append(items, responsesItem{kind: "reasoning", id: id, final: item, added: item})
	}
	if rep.Content != "" || len(rep.Calls) == 0 {
		id := "msg_" + ids.Hex(24)
		part := ojson.Obj("type", "output_text", "text", rep.Content, "annotations", []any{})
		items = append(items, responsesItem{
			kind: "message", id: id, text: rep.Content,
			final: ojson.Obj("type", "message", "id", id, "role", "assistant", "status", "completed", "content", []any{part}),
			added: ojson.Obj("type", "message", "id", id, "role", "assistant", "status", "in_progress", "content", []any{}),
		})
	}
	for _, c := range rep.Calls {
		spec, ok := req.Spec(c.Name)
		if !ok {
			spec = ToolSpec{SchemaName: c.Name, Name: callName(c), Kind: FunctionTool}
		}
		id, callID := "fc_"+ids.Hex(24), "call_"+ids.Hex(24)
		args := callArgs(c)
		mk := func(typ string) *ojson.Object {
			o := ojson.Obj("type", typ, "id", id, "call_id", callID, "name", spec.Name)
			if spec.Namespace != "" {
				o.Set("namespace", spec.Namespace)
			}
			return o
		}
		if spec.Kind == CustomTool {
			in := ""
			if v := args.Val("input"); v != nil {
				in = text(v)
			}
			final, added := mk("custom_tool_call"), mk("custom_tool_call")
			final.Set("input", in)
			added.Set("input", "")
			items = append(items, responsesItem{kind: "custom_tool_call", id: id, text: in, final: final, added: added})
			continue
		}
		a := string(ojson.Marshal(args))
		final, added := mk("function_call"), mk("function_call")
		final.Set("arguments", a)
		final.Set("status", "completed")
		added.Set("arguments", "")
		added.Set("status", "in_progress")
		items = append(items, responsesItem{kind: "function_call", id: id, text: a, final: final, added: added})
	}
	return items
}

func responseObject(req *Request, rep *Reply, id string, created int64, output []any) *ojson.Object {
	status, incomplete := "completed", any(nil)
	if rep.FinishReason == "length" {
		status, incomplete = "incomplete", ojson.Obj("reason", "max_output_tokens")
	}
	return ojson.Obj(
		"id", id,
		"object", "response",
		"created_at", created,
		"model", model(req),
		"status", status,
		"output", output,
		"error", nil,
		"incomplete_details", incomplete,
		"usage", ojson.Obj(
			"input_tokens", rep.PromptTokens,
			"output_tokens", rep.OutputTokens,
			"total_tokens", rep.PromptTokens+rep.OutputTokens,
			"input_tokens_details", ojson.Obj("cached_tokens", 0),
			"output_tokens_details", ojson.Obj("reasoning_tokens", 0),
		),
	)
}

// responseStart is the response object of response.created and
// response.in_progress: no output, status in_progress, no usage yet.
func responseStart(req *Request, id string, created int64) *ojson.Object {
	start := responseObject(req, &Reply{}, id, created, []any{})
	start.Set("status", "in_progress")
	start.Set("incomplete_details", nil)
	start.Set("usage", nil)
	return start
}

// WriteResponses writes the non-streaming response object (docs/adapter.md §5.4).
func WriteResponses(w io.Writer, req *Request, rep *Reply, opt ReplyOptions) error {
	ids := opt.ids()
	id := "resp_" + ids.Hex(24)
	var output []any
	for _, it := range responsesItems(req, rep, ids) {
		output = append(output, it.final)
	}
	return writeJSON(w, responseObject(req, rep, id, opt.created(), output))
}

// StreamResponses writes the SSE sequence of docs/adapter.md §5.5; every payload carries
// type and a contiguous sequence_number from 0. It ends with
// response.completed or response.incomplete; there is no [DONE] line.
func StreamResponses(w io.Writer, req *Request, rep *Reply, opt ReplyOptions) error {
	ids := opt.ids()
	return streamResponses(w, req, rep, ids, "resp_"+ids.Hex(24), opt.created(), 0)
}

// streamResponses writes the stream of response id from event number seq
// on: from 0 the whole stream; past 0 a Prelude sent response.created and
// its keep-alives already.
func streamResponses(w io.Writer, req *Request, rep *Reply, ids IDSource, id string, created int64, seq int) error {
	items := responsesItems(req, rep, ids)
	f := &frames{w: w}
	emit := func(typ string, kv ...any) {
		o := ojson.Obj("type", typ, "sequence_number", seq)
		for i := 0; i+1 < len(kv); i += 2 {
			o.Set(kv[i].(string), kv[i+1])
		}
		seq++
		f.event(typ, o)
	}
	final := responseObject(req, rep, id, created, nil)
	var output []any
	for _, it := range items {
		output = append(output, it.final)
	}
	final.Set("output", output)
	if seq == 0 {
		emit("response.created", "response", responseStart(req, id, created))
	}
	for i, it := range items {
		emit("response.output_item.added", "output_index", i, "item", it.added)
		switch it.kind {
		case "message":
			emit("response.content_part.added", "item_id", it.id, "output_index", i, "content_index", 0,
				"part", ojson.Obj("type", "output_text", "text", "", "annotations", []any{}))
			emit("response.output_text.delta", "item_id", it.id, "output_index", i, "content_index", 0, "delta", it.text)
			emit("response.output_text.done", "item_id", it.id, "output_index", i, "content_index", 0, "text", it.text)
			emit("response.content_part.done", "item_id", it.id, "output_index", i, "content_index", 0,
				"part", ojson.Obj("type", "output_text", "text", it.text, "annotations", []any{}))
		case "function_call":
			emit("response.function_call_arguments.delta", "item_id", it.id, "output_index", i, "delta", it.text)
			emit("response.function_call_arguments.done", "item_id", it.id, "output_index", i, "arguments", it.text)
		case "custom_tool_call":
			emit("response.custom_tool_call_input.delta", "item_id", it.id, "output_index", i, "delta", it.text)
			emit("response.custom_tool_call_input.done", "item_id", it.id, "output_index", i, "input", it.text)
		}
		emit("response.output_item.done", "output_index", i, "item", it.final)
	}
	terminal := "response.completed"
	if final.Val("status") == "incomplete" {
		terminal = "response.incomplete"
	}
	emit(terminal, "response", final)
	return f.err
}
