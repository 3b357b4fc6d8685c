package protocol

import (
	"encoding/base64"
	"net/http"
	"strings"

	"github.com/kilnrl/kiln/internal/ojson"
)

// openAIMaxKeys are the OpenAI protocols' max-token keys, in precedence order:
// the first non-null one counts.
func openAIMaxKeys() []string {
	return []string{"max_completion_tokens", "max_tokens", "max_output_tokens"}
}

// DecodeResponses translates a stateless OpenAI Responses request
// (docs/adapter.md §5.1–5.3): the client sends its full history with store=false. Stored
// responses, previous_response_id, background and conversation requests,
// hosted tools and unknown input items are 400 *Error values naming what is
// not implemented. Fields that change nothing here (include, reasoning,
// tool_choice, parallel_tool_calls, text, prompt_cache_key, ...) are ignored.
func DecodeResponses(header http.Header, body []byte) (Request, error) {
	return decodeResponses(header, body, nil)
}

// DecodeResponsesHistory is DecodeResponses that reuses what h holds of the
// session's previous request (see History) and leaves in h what the next
// one can reuse. A nil h decodes without.
func DecodeResponsesHistory(header http.Header, body []byte, h *History) (Request, error) {
	return decodeResponses(header, body, h.decode())
}

func decodeResponses(header http.Header, body []byte, hd *historyDecode) (Request, error) {
	b, err := decodeBodyCached(body, historyTop("input", hd))
	if err != nil {
		return Request{}, err
	}
	if truthy(b.Val("previous_response_id")) || b.Val("store") == true {
		return Request{}, badRequest("Send full input history with store=false; stored responses are unsupported")
	}
	if truthy(b.Val("background")) {
		return Request{}, badRequest("background responses are unsupported")
	}
	if truthy(b.Val("conversation")) {
		return Request{}, badRequest("conversations are unsupported; send full input history with store=false")
	}
	s, err := sampling(b, openAIMaxKeys(), "stop")
	if err != nil {
		return Request{}, err
	}
	r := Request{
		Protocol:  Responses,
		SessionID: openAISession(header, b),
		Sampling:  s,
		Stream:    wantsStream(header, b),
	}
	r.Model, _ = b.Str("model")
	tools, err := listField(b, "tools")
	if err != nil {
		return Request{}, err
	}
	if err := r.responsesTools(tools, ""); err != nil {
		return Request{}, err
	}
	var instr *ojson.Object
	if in := b.Val("instructions"); truthy(in) {
		instr = ojson.Obj("role", "system", "content", flatten(in))
	}
	if l, ok := b.Val("input").(*historyList); ok {
		if r.Messages, err = hd.translateResponses(body, l, instr); err != nil {
			return Request{}, err
		}
		return r, nil
	}
	t := responsesTranslator{}
	if instr != nil {
		t.out = append(t.out, instr)
	}
	switch in := b.Val("input").(type) {
	case string:
		t.out = append(t.out, ojson.Obj("role", "user", "content", in))
	case []any:
		if err := t.translate(in); err != nil {
			return Request{}, err
		}
	default:
		return Request{}, badRequest("input must be a string or list")
	}
	r.Messages = rawAll(t.out)
	return r, nil
}

// responsesTools is docs/adapter.md §5.2: a missing type is function; namespace tools
// recurse with their name as namespace; function and custom tools become
// function schemas named ns.name; any other type is a 400.
func (r *Request) responsesTools(tools []any, ns string) error {
	for _, e := range tools {
		to, ok := e.(*ojson.Object)
		if !ok {
			return badRequest("each tool must be an object")
		}
		typ := "function"
		if v, ok := to.Get("type"); ok && v != nil {
			typ = text(v)
		}
		switch typ {
		case "function", "custom", "namespace":
		default:
			return badRequest("Unsupported Responses tool type: " + typ)
		}
		name, ok := to.Str("name")
		if !ok || name == "" {
			return badRequest("Responses " + typ + " tool has no name")
		}
		if typ == "namespace" {
			inner, ok := to.Val("tools").([]any)
			if !ok && to.Val("tools") != nil {
				return badRequest("namespace tool " + name + ": tools must be a list")
			}
			if err := r.responsesTools(inner, name); err != nil {
				return err
			}
			continue
		}
		if deferred(to) {
			continue
		}
		schema := name
		if ns != "" {
			schema = ns + "." + name
		}
		var fn *ojson.Object
		kind := FunctionTool
		if typ == "function" {
			fn = functionSchema(schema, to.Val("description"), to.Val("parameters"))
		} else {
			kind = CustomTool
			desc := ""
			if d := to.Val("description"); d != nil {
				desc = text(d)
			}
			desc += "\nPass the tool's raw text as the input string."
			if f, ok := to.Get("format"); ok {
				desc += "\nInput format: " + string(ojson.AppendPy(nil, f, true))
			}
			fn = functionSchema(schema, desc, ojson.Obj("type", "object",
				"properties", ojson.Obj("input", ojson.Obj("type", "string")),
				"required", []any{"input"}))
		}
		r.Tools = append(r.Tools, ojson.Marshal(fn))
		r.Specs = append(r.Specs, ToolSpec{SchemaName: schema, Name: name, Namespace: ns, Kind: kind})
	}
	return nil
}

type responsesTranslator struct {
	out       []*ojson.Object
	assistant *ojson.Object // the assistant message being built, or nil
	calls     []any         // its tool calls
	callIDs   []string      // their call ids, in call order
	outputs   map[string]string

	// prior counts the messages translated before out (a History's
	// checkpoint): message() merges into a lone first system message.
	prior int
	// snapOn asks translate to note in snap the last item boundary where
	// nothing is pending and what is translated is final (History).
	snapOn bool
	snap   *responsesSnap
}

type responsesSnap struct{ item, outLen int }

// itemType is an input item's type ("message" when absent).
func itemType(io *ojson.Object) string {
	if v, ok := io.Get("type"); ok && v != nil {
		return text(v)
	}
	return "message"
}

// translate is docs/adapter.md §5.3's walk over input items.
func (t *responsesTranslator) translate(items []any) error {
	for j, it := range items {
		io, ok := it.(*ojson.Object)
		if !ok {
			return badRequest("each input item must be an object")
		}
		typ := itemType(io)
		if t.snapOn && j > 0 {
			if err := t.boundary(j, io, typ); err != nil {
				return err
			}
		}
		switch typ {
		case "function_call_output", "custom_tool_call_output":
			id := text(io.Val("call_id"))
			if !t.isOpenCall(id) {
				return badRequest("Duplicate or unknown tool output call_id")
			}
			if t.outputs == nil {
				t.outputs = map[string]string{}
			}
			t.outputs[id] = flatten(io.Val("output"))
			continue
		}
		if len(t.outputs) > 0 {
			if err := t.flush(); err != nil {
				return err
			}
		}
		switch typ {
		case "reasoning":
			// Wire summaries are not sampled reasoning; kiln's own handle
			// (see reasoningHandle) carries the reasoning it returned.
			if r, ok := decodeReasoningHandle(text(io.Val("encrypted_content"))); ok {
				t.open()
				prev, _ := t.assistant.Str("reasoning_content")
				t.assistant.Set("reasoning_content", prev+r)
			}
		case "function_call", "custom_tool_call":
			t.open()
			name := text(io.Val("name"))
			if ns := io.Val("namespace"); truthy(ns) {
				name = text(ns) + "." + name
			}
			var args *ojson.Object
			if typ == "custom_tool_call" {
				in := io.Val("input")
				if !truthy(in) {
					in = ""
				}
				args = ojson.Obj("input", in)
			} else {
				args = coerceArguments(io.Val("arguments"))
			}
			t.calls = append(t.calls, toolCall(name, args))
			t.callIDs = append(t.callIDs, text(io.Val("call_id")))
		case "message":
			role := io.Val("role")
			switch role {
			case "assistant":
				t.open()
				c, _ := t.assistant.Str("content")
				t.assistant.Set("content", c+flatten(io.Val("content")))
			case "system", "developer", "user":
				if err := t.flush(); err != nil {
					return err
				}
				t.message(role.(string), flatten(io.Val("content")))
			default:
				r := "null"
				if role != nil {
					r = text(role)
				}
				return badRequest("Unsupported Responses message role: " + r)
			}
		default:
			return badRequest("Unsupported Responses input type: " + typ)
		}
	}
	return t.flush()
}

func decodeReasoningHandle(s string) (string, bool) {
	rest, ok := strings.CutPrefix(s, reasoningHandle)
	if !ok {
		return "", false
	}
	b, err := base64.StdEncoding.DecodeString(rest)
	if err != nil {
		return "", false
	}
	return string(b), true
}

// boundary is called before item j (of type typ): where item j flushes
// anyway (tool outputs pending, or a system, developer or user message) or
// nothing is pending, it flushes now — the same flush, earlier — and notes
// the point when at least two messages stand (so no later developer
// message can merge into an earlier one).
func (t *responsesTranslator) boundary(j int, io *ojson.Object, typ string) error {
	empty := t.assistant == nil && len(t.calls) == 0 && len(t.callIDs) == 0 && len(t.outputs) == 0
	flushes := len(t.outputs) > 0 && typ != "function_call_output" && typ != "custom_tool_call_output"
	if typ == "message" {
		switch io.Val("role") {
		case "system", "developer", "user":
			flushes = true
		}
	}
	if !empty && !flushes {
		return nil
	}
	if err := t.flush(); err != nil {
		return err
	}
	if t.prior+len(t.out) >= 2 {
		t.snap = &responsesSnap{item: j, outLen: len(t.out)}
	}
	return nil
}

func (t *responsesTranslator) message(role, content string) {
	if role == "user" {
		t.out = append(t.out, ojson.Obj("role", "user", "content", content))
		return
	}
	switch {
	case t.prior+len(t.out) == 0:
		t.out = append(t.out, ojson.Obj("role", "system", "content", content))
	case t.prior+len(t.out) == 1 && t.out[0].Val("role") == "system":
		c, _ := t.out[0].Str("content")
		t.out[0].Set("content", c+"\n\n"+content)
	default:
		t.out = append(t.out, ojson.Obj("role", "user", "content", "<"+role+"_message>\n"+content+"\n</"+role+"_message>"))
	}
}

func (t *responsesTranslator) open() {
	if t.assistant == nil {
		t.assistant = ojson.Obj("role", "assistant", "content", "")
	}
}

func (t *responsesTranslator) isOpenCall(id string) bool {
	if _, done := t.outputs[id]; done {
		return false
	}
	for _, c := range t.callIDs {
		if c == id {
			return true
		}
	}
	return false
}

// flush appends the assistant message, then one tool message per answered
// call in call order; unanswered calls produce nothing.
func (t *responsesTranslator) flush() error {
	if t.assistant != nil {
		if len(t.calls) > 0 {
			t.assistant.Set("tool_calls", t.calls)
		}
		t.out = append(t.out, t.assistant)
	}
	for _, id := range t.callIDs {
		if out, ok := t.outputs[id]; ok {
			t.out = append(t.out, ojson.Obj("role", "tool", "content", out))
			delete(t.outputs, id)
		}
	}
	if len(t.outputs) > 0 {
		return badRequest("Tool output has no matching call_id")
	}
	t.assistant, t.calls, t.callIDs, t.outputs = nil, nil, nil, nil
	return nil
}
