package protocol

import (
	"encoding/json"
	"maps"
	"net/http"
	"sort"
)

// DecodeAnthropic translates an Anthropic Messages request body (§4.2–4.4)
// into neutral form. header supplies the session id (§2.1) and the Accept
// header (streaming). Failures are *Error with status 400.
func DecodeAnthropic(header http.Header, body []byte) (Request, error) {
	return decodeAnthropic(header, body, nil)
}

// DecodeAnthropic is the package's DecodeAnthropic, taking the system
// prompt's and the tool list's translations from c when their bytes were
// seen before.
func (c *Cache) DecodeAnthropic(header http.Header, body []byte) (Request, error) {
	return decodeAnthropic(header, body, newCachedParts(c, "anthropic", "system", "tools"))
}

// anthropicSystem is the cached translation of a system prompt: the
// system message, nil when the prompt is empty.
type anthropicSystem struct{ msg json.RawMessage }

func decodeAnthropic(header http.Header, body []byte, cp *cachedParts) (Request, error) {
	return decodeAnthropicWith(header, body, cp, nil)
}

// decodeAnthropicWith decodes with the cache's parts (cp) and a session's
// history (hd), either nil.
func decodeAnthropicWith(header http.Header, body []byte, cp *cachedParts, hd *historyDecode) (Request, error) {
	b, err := decodeBodyCached(body, historyTop("messages", cp, hd))
	if err != nil {
		return Request{}, err
	}
	hist, _ := b.val("messages").(*historyList)
	var msgs []any
	if hist == nil {
		if msgs, err = listField(b, "messages"); err != nil {
			return Request{}, err
		}
	}
	toolsV, toolsHit := cp.hit("tools")
	var tools []any
	if !toolsHit {
		if tools, err = listField(b, "tools"); err != nil {
			return Request{}, err
		}
	}
	s, err := sampling(b, []string{"max_tokens"}, "stop_sequences")
	if err != nil {
		return Request{}, err
	}
	r := Request{
		Protocol:  Anthropic,
		SessionID: anthropicSession(header),
		Sampling:  s,
		Stream:    wantsStream(header, b),
	}
	r.Model, _ = b.str("model")
	var sys anthropicSystem
	if v, ok := cp.hit("system"); ok {
		sys = v.(anthropicSystem)
	} else {
		if v := b.val("system"); truthy(v) {
			sys.msg = marshal(obj("role", "system", "content", flatten(v)))
		}
		cp.store("system", sys)
	}
	if hist != nil {
		if r.Messages, err = hd.translateAnthropic(body, hist); err != nil {
			return Request{}, err
		}
	} else {
		t := anthropicTranslator{pos: map[string]int{}}
		t.translate(foldSystem(msgs))
		r.Messages = rawAll(t.out)
	}
	if sys.msg != nil {
		r.Messages = append([]json.RawMessage{sys.msg}, r.Messages...)
	}
	if toolsHit {
		ct := toolsV.(cachedTools)
		r.Tools, r.Specs = ct.tools, ct.specs
		return r, nil
	}
	for _, e := range tools {
		to, ok := e.(*object)
		if !ok || deferred(to) {
			continue
		}
		name, ok := to.str("name")
		if !ok || name == "" {
			continue
		}
		params := to.val("input_schema")
		if !truthy(params) {
			params = to.val("parameters")
		}
		r.Tools = append(r.Tools, marshal(functionSchema(name, to.val("description"), params)))
		r.Specs = append(r.Specs, ToolSpec{SchemaName: name, Name: name, Kind: FunctionTool})
	}
	cp.store("tools", cachedTools{tools: r.Tools, specs: r.Specs})
	return r, nil
}

// foldSystem is §4.3: every role:"system" message after index 0 becomes a
// <system-reminder> text block appended to the nearest preceding user
// message, else prepended to the next user message, else a user message of
// its own in its place. The index-0 system message stays.
func foldSystem(msgs []any) []any {
	out, _ := foldSystemOrigin(msgs)
	return out
}

// foldSystemOrigin is foldSystem that also says, for each message out, the
// index in msgs it came from.
func foldSystemOrigin(msgs []any) (out []any, origin []int) {
	out = make([]any, 0, len(msgs))
	origin = make([]int, 0, len(msgs))
	var forward []any // reminder blocks waiting for the next user message
	for i, m := range msgs {
		mo, ok := m.(*object)
		if !ok {
			out = append(out, m)
			origin = append(origin, i)
			continue
		}
		role := mo.val("role")
		if i > 0 && role == "system" {
			block := obj("type", "text", "text", "<system-reminder>\n"+flatten(mo.val("content"))+"\n</system-reminder>\n")
			if u := lastUser(out); u != nil {
				u.set("content", withBlocks(u.val("content"), nil, []any{block}))
				continue
			}
			if hasUser(msgs[i+1:]) {
				forward = append(forward, block)
				continue
			}
			out = append(out, obj("role", "user", "content", []any{block}))
			origin = append(origin, i)
			continue
		}
		if role == "user" && len(forward) > 0 {
			mo.set("content", withBlocks(mo.val("content"), forward, nil))
			forward = nil
		}
		out = append(out, mo)
		origin = append(origin, i)
	}
	return out, origin
}

func lastUser(msgs []any) *object {
	for i := len(msgs) - 1; i >= 0; i-- {
		if mo, ok := msgs[i].(*object); ok && mo.val("role") == "user" {
			return mo
		}
	}
	return nil
}

func hasUser(msgs []any) bool {
	for _, m := range msgs {
		if mo, ok := m.(*object); ok && mo.val("role") == "user" {
			return true
		}
	}
	return false
}

// withBlocks returns content as a block list with before and after added;
// string content is first promoted to one text block.
func withBlocks(content any, before, after []any) []any {
	var mid []any
	switch c := content.(type) {
	case nil:
	case string:
		mid = []any{obj("type", "text", "text", c)}
	case []any:
		mid = c
	default:
		mid = []any{c}
	}
	out := make([]any, 0, len(before)+len(mid)+len(after))
	out = append(out, before...)
	out = append(out, mid...)
	return append(out, after...)
}

type pendingResult struct {
	id      any
	content string
}

type anthropicTranslator struct {
	out     []*object
	pending []pendingResult
	pos     map[string]int // tool_use id -> global call position
	calls   int
	// posShared: pos is also a History checkpoint's, so it is copied
	// before it is written (a checkpoint is immutable once stored).
	posShared bool

	// snapAt asks for snap: the state right after msgs[snapAt], an
	// assistant message, is translated — what came before it was flushed
	// there, and nothing after it is pending yet (History's checkpoint).
	// snapOn false: none.
	snapOn bool
	snapAt int
	snap   *translatorSnap
}

type translatorSnap struct {
	outLen int
	pos    map[string]int
	calls  int
}

// translate is §4.4 after the top-level system message.
func (t *anthropicTranslator) translate(msgs []any) {
	for j, m := range msgs {
		mo, ok := m.(*object)
		if !ok {
			continue
		}
		switch mo.val("role") {
		case "user":
			t.user(mo.val("content"))
		case "assistant":
			t.flush()
			t.assistant(mo.val("content"))
			if t.snapOn && j == t.snapAt {
				t.snap = &translatorSnap{outLen: len(t.out), pos: t.pos, calls: t.calls}
				t.posShared = true
			}
		case "system":
			t.flush()
			t.out = append(t.out, obj("role", "system", "content", flatten(mo.val("content"))))
		}
	}
	t.flush()
}

func (t *anthropicTranslator) user(content any) {
	blocks, ok := content.([]any)
	if !ok {
		blocks = []any{obj("type", "text", "text", flatten(content))}
	}
	for _, b := range blocks {
		bo, _ := b.(*object)
		switch bo.val("type") {
		case "tool_result":
			t.pending = append(t.pending, pendingResult{id: bo.val("tool_use_id"), content: flatten(bo.val("content"))})
		case "text":
			t.flush()
			t.out = append(t.out, obj("role", "user", "content", textField(bo)))
		default:
			// Images, documents and anything else: one user message of
			// their own ([image omitted] for images, else the block's JSON).
			t.flush()
			t.out = append(t.out, obj("role", "user", "content", flatten(b)))
		}
	}
}

func (t *anthropicTranslator) assistant(content any) {
	blocks, ok := content.([]any)
	if !ok {
		blocks = []any{obj("type", "text", "text", flatten(content))}
	}
	var text, reasoning []byte
	thinking := false
	var calls []any
	for _, b := range blocks {
		bo, ok := b.(*object)
		if !ok {
			continue
		}
		switch bo.val("type") {
		case "text":
			text = append(text, textField(bo)...)
		case "thinking":
			thinking = true
			if v := bo.val("thinking"); v != nil {
				reasoning = append(reasoning, flattenScalar(v)...)
			}
		case "tool_use":
			name, _ := bo.str("name")
			if name == "" {
				name = "tool"
			}
			input := bo.val("input")
			if !truthy(input) {
				input = nil
			}
			calls = append(calls, toolCall(name, coerceArguments(input)))
			if id, ok := bo.str("id"); ok {
				if t.posShared {
					t.pos, t.posShared = maps.Clone(t.pos), false
				}
				t.pos[id] = t.calls
			}
			t.calls++
		}
	}
	m := obj("role", "assistant", "content", string(text))
	if thinking {
		m.set("reasoning_content", string(reasoning))
	}
	if len(calls) > 0 {
		m.set("tool_calls", calls)
	}
	t.out = append(t.out, m)
}

func flattenScalar(v any) string { return text(v) }

// flush emits the pending tool results: in call order when every
// tool_use_id is a known call id, else in arrival order (§4.4).
func (t *anthropicTranslator) flush() {
	if len(t.pending) == 0 {
		return
	}
	known := true
	for _, p := range t.pending {
		id, ok := p.id.(string)
		if _, seen := t.pos[id]; !ok || !seen {
			known = false
			break
		}
	}
	if known {
		sort.SliceStable(t.pending, func(i, j int) bool {
			return t.pos[t.pending[i].id.(string)] < t.pos[t.pending[j].id.(string)]
		})
	}
	for _, p := range t.pending {
		t.out = append(t.out, obj("role", "tool", "content", p.content))
	}
	t.pending = t.pending[:0]
}
