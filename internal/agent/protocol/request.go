package protocol

import (
	"bytes"
	"encoding/json"
	"net/http"
	"strconv"
	"strings"

	"github.com/kilnrl/kiln/internal/ojson"
)

// Protocol names one of the adapter's three client protocols.
type Protocol string

const (
	Anthropic Protocol = "anthropic" // Anthropic Messages, POST /v1/messages
	Responses Protocol = "responses" // OpenAI Responses, POST /v1/responses
	Chat      Protocol = "chat"      // OpenAI Chat Completions, POST /v1/chat/completions
)

// DefaultSessionID is the session of a request that names none (docs/adapter.md §2.1).
const DefaultSessionID = "default"

// DefaultModel is the model name replies carry when the request names none.
const DefaultModel = "kiln-actor"

// ToolKind is the kind of a tool as the client declared it.
type ToolKind string

const (
	FunctionTool ToolKind = "function"
	CustomTool   ToolKind = "custom" // Responses freeform tool: one string input
)

// ToolSpec maps a schema name (what the model sees and calls) back to the
// tool the client declared; the Responses encoder needs it for namespaced
// and custom tools (docs/adapter.md §5.4).
type ToolSpec struct {
	SchemaName string   // "ns.name" for namespaced tools, else Name
	Name       string   // the tool's own name
	Namespace  string   // "" unless declared inside a namespace tool
	Kind       ToolKind // function or custom
}

// Sampling holds the client's sampling overrides (docs/adapter.md §1.4 steps 3–5). The
// engine side overlays them on the session defaults.
type Sampling struct {
	// MaxTokens is the first non-null of the protocol's max-token keys
	// (Anthropic max_tokens; OpenAI max_completion_tokens, max_tokens,
	// max_output_tokens); nil when none. It caps, never raises.
	MaxTokens *int
	// Temperature, TopP and TopK are set when the key is present, even
	// with null (which clears the default).
	Temperature, TopP, TopK Override
	// Stop is the first truthy stop key (Anthropic stop_sequences, OpenAI
	// stop; a lone string becomes one element); nil when none.
	Stop []string
}

// Override is a sampling key the client sent. Value is nil for JSON null.
type Override struct {
	Set   bool
	Value *float64
}

// Request is a client request in kiln's neutral form.
type Request struct {
	Protocol  Protocol
	SessionID string
	Model     string // body.model when a string, else ""
	// Messages are chat-template messages: {role, content, reasoning_content?,
	// tool_calls?: [{type:function, function:{name, arguments:{...}}}]}, key
	// order kept, compact, no HTML escaping.
	Messages []json.RawMessage
	// Tools are OpenAI function schemas {type:function, function:{name,
	// description, parameters}} in request order; nil when there are none.
	Tools    []json.RawMessage
	Specs    []ToolSpec // one per entry of Tools, same order
	Sampling Sampling
	// Stream is body.stream === true or an Accept header naming
	// text/event-stream (docs/adapter.md §2.3 step 9).
	Stream bool
}

// Spec returns the declared tool behind a schema name.
func (r *Request) Spec(schemaName string) (ToolSpec, bool) {
	for _, s := range r.Specs {
		if s.SchemaName == schemaName {
			return s, true
		}
	}
	return ToolSpec{}, false
}

// ToolNames lists the schema names, in order.
func (r *Request) ToolNames() []string {
	out := make([]string, len(r.Specs))
	for i, s := range r.Specs {
		out[i] = s.SchemaName
	}
	return out
}

// BearerToken returns the trimmed token of an "Authorization: Bearer"
// header (scheme matched case-insensitively), or "".
func BearerToken(h http.Header) string {
	a := strings.TrimSpace(h.Get("Authorization"))
	if len(a) < 7 || !strings.EqualFold(a[:7], "bearer ") {
		return ""
	}
	return strings.TrimSpace(a[7:])
}

// AnthropicSessionID is the session id of an Anthropic Messages request
// with these headers (docs/adapter.md §2.1): the Bearer token, else X-Api-Key, else
// DefaultSessionID. The body is not consulted.
func AnthropicSessionID(h http.Header) string { return anthropicSession(h) }

func anthropicSession(h http.Header) string {
	if t := BearerToken(h); t != "" {
		return t
	}
	if k := strings.TrimSpace(h.Get("X-Api-Key")); k != "" {
		return k
	}
	return DefaultSessionID
}

// OpenAISessionID is the session id a Chat Completions or Responses
// request names (docs/adapter.md §2.1) — the one its decode finds — known before decoding
// it, so that a session named in the body can have its History too: the
// Bearer token, else body.metadata.session_id or body.user as a skim of
// the body's top level finds them. ok is false where the skim cannot vouch
// for the decode's answer (a body that is not one well-formed object, a
// top-level key written with escapes); the decode then reports any error.
func OpenAISessionID(h http.Header, body []byte) (id string, ok bool) {
	if t := BearerToken(h); t != "" {
		return t, true
	}
	top := ojson.NewObject(2)
	end := ojson.WalkObject(body, ojson.Space(body, 0), func(key []byte, v int) int {
		e := ojson.ValueEnd(body, v)
		if e < 0 || bytes.IndexByte(key, '\\') >= 0 {
			return -1
		}
		if k := string(key); k == "metadata" || k == "user" {
			val, err := ojson.Decode(body[v:e])
			if err != nil {
				return -1
			}
			top.Set(k, val) // the last of duplicate keys, as the decode
		}
		return e
	})
	if end < 0 || ojson.Space(body, end) != len(body) {
		return "", false
	}
	return openAISession(h, top), true
}

// openAISession is docs/adapter.md §2.1 for Chat and Responses: Bearer, else a truthy
// body.metadata.session_id, else a truthy body.user (stringified), else
// "default". X-Slime-Session-Id and X-Api-Key are ignored.
func openAISession(h http.Header, body *ojson.Object) string {
	if t := BearerToken(h); t != "" {
		return t
	}
	if md, ok := body.Val("metadata").(*ojson.Object); ok {
		if v := md.Val("session_id"); truthy(v) {
			return text(v)
		}
	}
	if v := body.Val("user"); truthy(v) {
		return text(v)
	}
	return DefaultSessionID
}

func wantsStream(h http.Header, body *ojson.Object) bool {
	if b, ok := body.Val("stream").(bool); ok && b {
		return true
	}
	for _, a := range h.Values("Accept") {
		if strings.Contains(a, "text/event-stream") {
			return true
		}
	}
	return false
}

// decodeBodyCached is decodeBody that offers the top-level values to top
// (nil: none).
func decodeBodyCached(body []byte, top ojson.TopHook) (*ojson.Object, error) {
	v, err := ojson.DecodeWith(body, top)
	if err != nil {
		return nil, badRequest("invalid JSON body: " + err.Error())
	}
	o, ok := v.(*ojson.Object)
	if !ok {
		return nil, badRequest("request body must be a JSON object")
	}
	return o, nil
}

// sampling reads the overrides of docs/adapter.md §1.4 steps 3–5.
func sampling(body *ojson.Object, maxKeys []string, stopKey string) (Sampling, error) {
	var s Sampling
	for _, k := range maxKeys {
		v := body.Val(k)
		if v == nil {
			continue
		}
		n, ok := v.(json.Number)
		i, err := strconv.ParseInt(string(n), 10, 64)
		if !ok || err != nil || i < 1 || i > 1<<31-1 {
			return s, badRequest(k + " must be a positive integer")
		}
		m := int(i)
		s.MaxTokens = &m
		break
	}
	for _, p := range []struct {
		key string
		dst *Override
	}{{"temperature", &s.Temperature}, {"top_p", &s.TopP}, {"top_k", &s.TopK}} {
		v, present := body.Get(p.key)
		if !present {
			continue
		}
		p.dst.Set = true
		if v == nil {
			continue
		}
		n, ok := v.(json.Number)
		f, err := n.Float64()
		if !ok || err != nil {
			return s, badRequest(p.key + " must be a number")
		}
		p.dst.Value = &f
	}
	if v := body.Val(stopKey); truthy(v) {
		switch t := v.(type) {
		case string:
			s.Stop = []string{t}
		case []any:
			for _, e := range t {
				str, ok := e.(string)
				if !ok {
					return s, badRequest(stopKey + " must be a string or a list of strings")
				}
				s.Stop = append(s.Stop, str)
			}
		default:
			return s, badRequest(stopKey + " must be a string or a list of strings")
		}
	}
	return s, nil
}

// flatten is the shared content flattener of docs/adapter.md §4.4 [C flatten_content]:
// null -> "", string -> itself, list -> the non-empty parts joined by "\n",
// a single object -> "[image omitted]" for images, its flattened text part
// for text-like blocks, else its JSON (the spec's recommended fix for the
// reference's Python repr); other scalars -> their JSON text.
func flatten(v any) string {
	switch t := v.(type) {
	case nil:
		return ""
	case string:
		return t
	case []any:
		var b strings.Builder
		n := 0
		for _, e := range t {
			p := flattenPart(e)
			if p == "" {
				continue
			}
			if n > 0 {
				b.WriteByte('\n')
			}
			b.WriteString(p)
			n++
		}
		return b.String()
	case *ojson.Object:
		if isImage(t) {
			return imageOmitted
		}
		return string(ojson.Marshal(t))
	}
	return text(v)
}

const imageOmitted = "[image omitted]"

func isImage(o *ojson.Object) bool {
	switch o.Val("type") {
	case "image", "image_url", "input_image":
		return true
	}
	return false
}

func flattenPart(e any) string {
	o, ok := e.(*ojson.Object)
	if !ok {
		return text(e) // strings kept, other values stringified
	}
	switch o.Val("type") {
	case "text", "input_text", "output_text":
		return textField(o)
	case "tool_result":
		return flatten(o.Val("content"))
	case "image", "image_url", "input_image":
		return imageOmitted
	}
	if c, ok := o.Get("content"); ok {
		return flatten(c)
	}
	if _, ok := o.Get("text"); ok {
		return textField(o)
	}
	return ""
}

// textField is a block's text: a string as is, missing or null as "",
// anything else as JSON text.
func textField(o *ojson.Object) string {
	v := o.Val("text")
	if v == nil {
		return ""
	}
	return text(v)
}

// coerceArguments is docs/adapter.md §5.7: an object as is; null -> {}; a string is trimmed,
// "" -> {}, a JSON object -> it, anything else -> {"_raw_arguments": the
// original string}; other values -> {"_raw_arguments": their JSON text}.
func coerceArguments(v any) *ojson.Object {
	switch t := v.(type) {
	case *ojson.Object:
		return t
	case nil:
		return &ojson.Object{}
	case string:
		s := strings.TrimSpace(t)
		if s == "" {
			return &ojson.Object{}
		}
		if p, err := ojson.Decode([]byte(s)); err == nil {
			if o, ok := p.(*ojson.Object); ok {
				return o
			}
		}
		return ojson.Obj("_raw_arguments", t)
	}
	return ojson.Obj("_raw_arguments", text(v))
}

// functionSchema is one OpenAI function tool schema.
func functionSchema(name string, description any, parameters any) *ojson.Object {
	if description == nil {
		description = ""
	}
	if !truthy(parameters) {
		parameters = ojson.Obj("type", "object", "properties", &ojson.Object{})
	}
	return ojson.Obj("type", "function", "function", ojson.Obj("name", name, "description", description, "parameters", parameters))
}

// deferred reports a tool marked defer_loading: a placeholder the client
// loads on demand, not a callable tool, so the model is not shown it.
func deferred(t *ojson.Object) bool {
	b, _ := t.Val("defer_loading").(bool)
	return b
}

func toolCall(name string, args *ojson.Object) *ojson.Object {
	return ojson.Obj("type", "function", "function", ojson.Obj("name", name, "arguments", args))
}

func rawAll(msgs []*ojson.Object) []json.RawMessage {
	if len(msgs) == 0 {
		return nil
	}
	out := make([]json.RawMessage, len(msgs))
	for i, m := range msgs {
		out[i] = ojson.Marshal(m)
	}
	return out
}

func listField(body *ojson.Object, key string) ([]any, error) {
	v := body.Val(key)
	if v == nil {
		return nil, nil
	}
	l, ok := v.([]any)
	if !ok {
		return nil, badRequest(key + " must be a list")
	}
	return l, nil
}

// truthy is Python truthiness of a decoded JSON value.
func truthy(v any) bool {
	switch t := v.(type) {
	case nil:
		return false
	case bool:
		return t
	case string:
		return t != ""
	case json.Number:
		f, err := t.Float64()
		return err != nil || f != 0
	case []any:
		return len(t) > 0
	case *ojson.Object:
		return t.Len() > 0
	}
	return true
}

// text renders a scalar as text: strings as themselves, anything else as
// its compact JSON (the Go port's stand-in for Python's str()).
func text(v any) string {
	if s, ok := v.(string); ok {
		return s
	}
	return string(ojson.Marshal(v))
}
