package protocol

import (
	"encoding/json"
	"net/http"

	"github.com/kilnrl/kiln/internal/ojson"
)

// DecodeChat translates an OpenAI Chat Completions request (docs/adapter.md §5.6):
// developer becomes system, tool results keep their order (no
// reordering), assistant tool calls lose their ids and get docs/adapter.md §5.7 argument
// coercion.
func DecodeChat(header http.Header, body []byte) (Request, error) {
	return decodeChat(header, body, nil)
}

// DecodeChatHistory is DecodeChat that reuses what h holds of the
// session's previous request (see History) and leaves in h what the next
// one can reuse. Each message is translated on its own, so every boundary
// is clean: the checkpoint is the whole list. A nil h decodes without.
func DecodeChatHistory(header http.Header, body []byte, h *History) (Request, error) {
	return decodeChat(header, body, h.decode())
}

func decodeChat(header http.Header, body []byte, hd *historyDecode) (Request, error) {
	b, err := decodeBodyCached(body, historyTop("messages", hd))
	if err != nil {
		return Request{}, err
	}
	hist, _ := b.Val("messages").(*historyList)
	msgs, ok := b.Val("messages").([]any)
	if !ok && hist == nil {
		return Request{}, badRequest("messages must be a list")
	}
	tools, err := listField(b, "tools")
	if err != nil {
		return Request{}, err
	}
	s, err := sampling(b, openAIMaxKeys(), "stop")
	if err != nil {
		return Request{}, err
	}
	r := Request{
		Protocol:  Chat,
		SessionID: openAISession(header, b),
		Sampling:  s,
		Stream:    wantsStream(header, b),
	}
	r.Model, _ = b.Str("model")
	if hist != nil {
		r.Messages = hd.translateChat(body, hist)
	} else {
		r.Messages = rawAll(chatMessages(msgs))
	}
	for _, e := range tools {
		to, ok := e.(*ojson.Object)
		if !ok || deferred(to) {
			continue
		}
		if typ, ok := to.Get("type"); ok && typ != "function" {
			continue
		}
		fn := to
		if f, ok := to.Val("function").(*ojson.Object); ok {
			fn = f
		}
		if deferred(fn) {
			continue
		}
		name, ok := fn.Str("name")
		if !ok || name == "" {
			continue
		}
		r.Tools = append(r.Tools, ojson.Marshal(functionSchema(name, fn.Val("description"), fn.Val("parameters"))))
		r.Specs = append(r.Specs, ToolSpec{SchemaName: name, Name: name, Kind: FunctionTool})
	}
	return r, nil
}

// chatMessages translates each message on its own (non-objects and
// unknown roles are dropped).
func chatMessages(msgs []any) []*ojson.Object {
	var out []*ojson.Object
	for _, m := range msgs {
		if o := chatMessage(m); o != nil {
			out = append(out, o)
		}
	}
	return out
}

// chatMessage is docs/adapter.md §5.6 for one message; nil drops it.
func chatMessage(m any) *ojson.Object {
	mo, ok := m.(*ojson.Object)
	if !ok {
		return nil
	}
	switch role := mo.Val("role"); role {
	case "system", "developer":
		return ojson.Obj("role", "system", "content", flatten(mo.Val("content")))
	case "user", "tool":
		return ojson.Obj("role", role, "content", flatten(mo.Val("content")))
	case "assistant":
		a := ojson.Obj("role", "assistant", "content", flatten(mo.Val("content")))
		if rc := mo.Val("reasoning_content"); truthy(rc) {
			a.Set("reasoning_content", flatten(rc))
		}
		var calls []any
		tcs, _ := mo.Val("tool_calls").([]any)
		for _, c := range tcs {
			co, ok := c.(*ojson.Object)
			if !ok {
				continue
			}
			fn, _ := co.Val("function").(*ojson.Object)
			name := fn.Val("name")
			if !truthy(name) {
				name = co.Val("name")
			}
			if !truthy(name) {
				name = "tool"
			}
			args, ok := fn.Get("arguments")
			if !ok {
				args = co.Val("arguments")
			}
			calls = append(calls, toolCall(text(name), coerceArguments(args)))
		}
		if len(calls) > 0 {
			a.Set("tool_calls", calls)
		}
		return a
	}
	return nil
}

// translateChat is docs/adapter.md §5.6 over l: the messages the checkpoint covers take
// its translation, the rest are translated, and the whole list becomes the
// next checkpoint (a message's translation depends on it alone).
func (d *historyDecode) translateChat(body []byte, l *historyList) []json.RawMessage {
	from := l.skipped
	var prefix []json.RawMessage
	if from > 0 {
		prefix = d.ck.out
		d.reused = from
	}
	out := rawAll(chatMessages(l.elems[from:]))
	if len(prefix) > 0 {
		out = append(append(make([]json.RawMessage, 0, len(prefix)+len(out)), prefix...), out...)
	}
	if k := len(l.elems); k > 0 {
		span, spanSum, rel := d.checkpointSpan(body, l, k)
		d.h.store(&historyCheckpoint{sums: l.sums[:k:k], span: span, spanSum: spanSum, rel: rel, out: out[:len(out):len(out)]})
	} else {
		d.h.store(nil)
	}
	return out
}
