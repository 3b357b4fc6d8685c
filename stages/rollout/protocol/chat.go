package protocol

import "net/http"

// DecodeChat translates an OpenAI Chat Completions request (§5.6):
// developer becomes system, tool results keep their order (no
// reordering), assistant tool calls lose their ids and get §5.7 argument
// coercion.
func DecodeChat(header http.Header, body []byte) (Request, error) {
	b, err := decodeBody(body)
	if err != nil {
		return Request{}, err
	}
	msgs, ok := b.val("messages").([]any)
	if !ok {
		return Request{}, badRequest("messages must be a list")
	}
	tools, err := listField(b, "tools")
	if err != nil {
		return Request{}, err
	}
	s, err := sampling(b, openAIMaxKeys, "stop")
	if err != nil {
		return Request{}, err
	}
	r := Request{
		Protocol:  Chat,
		SessionID: openAISession(header, b),
		Sampling:  s,
		Stream:    wantsStream(header, b),
	}
	r.Model, _ = b.str("model")
	var out []*object
	for _, m := range msgs {
		mo, ok := m.(*object)
		if !ok {
			continue
		}
		switch role := mo.val("role"); role {
		case "system", "developer":
			out = append(out, obj("role", "system", "content", flatten(mo.val("content"))))
		case "user", "tool":
			out = append(out, obj("role", role, "content", flatten(mo.val("content"))))
		case "assistant":
			a := obj("role", "assistant", "content", flatten(mo.val("content")))
			if rc := mo.val("reasoning_content"); truthy(rc) {
				a.set("reasoning_content", flatten(rc))
			}
			var calls []any
			tcs, _ := mo.val("tool_calls").([]any)
			for _, c := range tcs {
				co, ok := c.(*object)
				if !ok {
					continue
				}
				fn, _ := co.val("function").(*object)
				name := fn.val("name")
				if !truthy(name) {
					name = co.val("name")
				}
				if !truthy(name) {
					name = "tool"
				}
				args, ok := fn.get("arguments")
				if !ok {
					args = co.val("arguments")
				}
				calls = append(calls, toolCall(text(name), coerceArguments(args)))
			}
			if len(calls) > 0 {
				a.set("tool_calls", calls)
			}
			out = append(out, a)
		}
	}
	r.Messages = rawAll(out)
	for _, e := range tools {
		to, ok := e.(*object)
		if !ok || deferred(to) {
			continue
		}
		if typ, ok := to.get("type"); ok && typ != "function" {
			continue
		}
		fn := to
		if f, ok := to.val("function").(*object); ok {
			fn = f
		}
		if deferred(fn) {
			continue
		}
		name, ok := fn.str("name")
		if !ok || name == "" {
			continue
		}
		r.Tools = append(r.Tools, marshal(functionSchema(name, fn.val("description"), fn.val("parameters"))))
		r.Specs = append(r.Specs, ToolSpec{SchemaName: name, Name: name, Kind: FunctionTool})
	}
	return r, nil
}
