package protocol

import (
	"encoding/json"
	"maps"
	"net/http"
	"sort"

	"github.com/kilnrl/kiln/internal/ojson"
)

// DecodeAnthropic translates an Anthropic Messages request body (docs/adapter.md §4.2–4.4)
// into neutral form. header supplies the session id (docs/adapter.md §2.1) and the Accept
// header (streaming). Failures are *Error with status 400.
func DecodeAnthropic(header http.Header, body []byte) (Request, error) {
	return decodeAnthropic(header, body, nil)
}

// decodeAnthropic decodes with a session's history (hd), or without (nil).
func decodeAnthropic(header http.Header, body []byte, hd *historyDecode) (Request, error) {
	b, err := decodeBodyCached(body, historyTop("messages", hd))
	if err != nil {
		return Request{}, err
	}
	hist, _ := b.Val("messages").(*historyList)
	var msgs []any
	if hist == nil {
		if msgs, err = listField(b, "messages"); err != nil {
			return Request{}, err
		}
	}
	tools, err := listField(b, "tools")
	if err != nil {
		return Request{}, err
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
	r.Model, _ = b.Str("model")
	var sys json.RawMessage
	if v := b.Val("system"); truthy(v) {
		sys = ojson.Marshal(ojson.Obj("role", "system", "content", flatten(v)))
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
	if sys != nil {
		r.Messages = append([]json.RawMessage{sys}, r.Messages...)
	}
	for _, e := range tools {
		to, ok := e.(*ojson.Object)
		if !ok || deferred(to) {
			continue
		}
		name, ok := to.Str("name")
		if !ok || name == "" {
			continue
		}
		params := to.Val("input_schema")
		if !truthy(params) {
			params = to.Val("parameters")
		}
		r.Tools = append(r.Tools, ojson.Marshal(functionSchema(name, to.Val("description"), params)))
		r.Specs = append(r.Specs, ToolSpec{SchemaName: name, Name: name, Kind: FunctionTool})
	}
	return r, nil
}

// foldSystem is docs/adapter.md §4.3: every role:"system" message after index 0 becomes a
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
		mo, ok := m.(*ojson.Object)
		if !ok {
			out = append(out, m)
			origin = append(origin, i)
			continue
		}
		role := mo.Val("role")
		if i > 0 && role == "system" {
			block := ojson.Obj("type", "text", "text", "<system-reminder>\n"+flatten(mo.Val("content"))+"\n</system-reminder>\n")
			if u := lastUser(out); u != nil {
				u.Set("content", withBlocks(u.Val("content"), nil, []any{block}))
				continue
			}
			if hasUser(msgs[i+1:]) {
				forward = append(forward, block)
				continue
			}
			out = append(out, ojson.Obj("role", "user", "content", []any{block}))
			origin = append(origin, i)
			continue
		}
		if role == "user" && len(forward) > 0 {
			mo.Set("content", withBlocks(mo.Val("content"), forward, nil))
			forward = nil
		}
		out = append(out, mo)
		origin = append(origin, i)
	}
	return out, origin
}

func lastUser(msgs []any) *ojson.Object {
	for i := len(msgs) - 1; i >= 0; i-- {
		if mo, ok := msgs[i].(*ojson.Object); ok && mo.Val("role") == "user" {
			return mo
		}
	}
	return nil
}

func hasUser(msgs []any) bool {
	for _, m := range msgs {
		if mo, ok := m.(*ojson.Object); ok && mo.Val("role") == "user" {
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
		mid = []any{ojson.Obj("type", "text", "text", c)}
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
	out     []*ojson.Object
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

// translate is docs/adapter.md §4.4 after the top-level system message.
func (t *anthropicTranslator) translate(msgs []any) {
	for j, m := range msgs {
		mo, ok := m.(*ojson.Object)
		if !ok {
			continue
		}
		switch mo.Val("role") {
		case "user":
			t.user(mo.Val("content"))
		case "assistant":
			t.flush()
			t.assistant(mo.Val("content"))
			if t.snapOn && j == t.snapAt {
				t.snap = &translatorSnap{outLen: len(t.out), pos: t.pos, calls: t.calls}
				t.posShared = true
			}
		case "system":
			t.flush()
			t.out = append(t.out, ojson.Obj("role", "system", "content", flatten(mo.Val("content"))))
		}
	}
	t.flush()
}

func (t *anthropicTranslator) user(content any) {
	blocks, ok := content.([]any)
	if !ok {
		blocks = []any{ojson.Obj("type", "text", "text", flatten(content))}
	}
	for _, b := range blocks {
		bo, _ := b.(*ojson.Object)
		switch bo.Val("type") {
		case "tool_result":
			t.pending = append(t.pending, pendingResult{id: bo.Val("tool_use_id"), content: flatten(bo.Val("content"))})
		case "text":
			t.flush()
			t.out = append(t.out, ojson.Obj("role", "user", "content", textField(bo)))
		default:
			// Images, documents and anything else: one user message of
			// their own ([image omitted] for images, else the block's JSON).
			t.flush()
			t.out = append(t.out, ojson.Obj("role", "user", "content", flatten(b)))
		}
	}
}

func (t *anthropicTranslator) assistant(content any) {
	blocks, ok := content.([]any)
	if !ok {
		blocks = []any{ojson.Obj("type", "text", "text", flatten(content))}
	}
	var text, reasoning []byte
	thinking := false
	var calls []any
	for _, b := range blocks {
		bo, ok := b.(*ojson.Object)
		if !ok {
			continue
		}
		switch bo.Val("type") {
		case "text":
			text = append(text, textField(bo)...)
		case "thinking":
			thinking = true
			if v := bo.Val("thinking"); v != nil {
				reasoning = append(reasoning, flattenScalar(v)...)
			}
		case "tool_use":
			name, _ := bo.Str("name")
			if name == "" {
				name = "tool"
			}
			input := bo.Val("input")
			if !truthy(input) {
				input = nil
			}
			calls = append(calls, toolCall(name, coerceArguments(input)))
			if id, ok := bo.Str("id"); ok {
				if t.posShared {
					t.pos, t.posShared = maps.Clone(t.pos), false
				}
				t.pos[id] = t.calls
			}
			t.calls++
		}
	}
	m := ojson.Obj("role", "assistant", "content", string(text))
	if thinking {
		m.Set("reasoning_content", string(reasoning))
	}
	if len(calls) > 0 {
		m.Set("tool_calls", calls)
	}
	t.out = append(t.out, m)
}

func flattenScalar(v any) string { return text(v) }

// flush emits the pending tool results: in call order when every
// tool_use_id is a known call id, else in arrival order (docs/adapter.md §4.4).
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
		t.out = append(t.out, ojson.Obj("role", "tool", "content", p.content))
	}
	t.pending = t.pending[:0]
}
