package protocol

import (
	"encoding/json"
	"fmt"
	"math/rand/v2"
	"net/http"
	"reflect"
	"strings"
	"testing"
)

// A session's requests, each resending the history plus a turn: from the
// second on, everything up to and including the previous request's last
// assistant message is taken from the History, and every decode equals the plain one. A
// request that rewrites the history (compaction) or folds a late system
// message decodes whole, and the next one reuses again.
func TestHistoryReuse(t *testing.T) {
	var hist History
	h := http.Header{"Authorization": {"Bearer s"}}
	msgs := []any{map[string]any{"role": "user", "content": "fix the build"}}
	decode := func(msgs []any) (Request, *historyDecode) {
		t.Helper()
		body, err := json.Marshal(map[string]any{"system": "sys", "max_tokens": 100, "messages": msgs,
			"tools": []any{map[string]any{"name": "Bash", "input_schema": map[string]any{"type": "object"}}}})
		if err != nil {
			t.Fatal(err)
		}
		return decodeWithHistory(t, &hist, h, body)
	}
	prevLast := 0 // how far the previous request reaches: through its last assistant message (0: none)
	for k := range 30 {
		_, hd := decode(msgs)
		if hd.reused != prevLast {
			t.Fatalf("turn %d: reused %d messages, want %d (through the previous request's last assistant message)", k, hd.reused, prevLast)
		}
		if hd.bySpan != (prevLast > 0) {
			t.Fatalf("turn %d: reused prefix told by its span: %v, want %v (the same bytes resent)", k, hd.bySpan, prevLast > 0)
		}
		if k > 0 {
			prevLast = len(msgs) - 1
		}
		id := fmt.Sprintf("toolu_%d", k)
		msgs = append(msgs,
			map[string]any{"role": "assistant", "content": []any{
				map[string]any{"type": "thinking", "thinking": "step " + id},
				map[string]any{"type": "text", "text": "Looking."},
				map[string]any{"type": "tool_use", "id": id, "name": "Bash", "input": map[string]any{"command": "ls " + id}},
				map[string]any{"type": "tool_use", "id": id + "b", "name": "Bash", "input": map[string]any{"command": "pwd"}}}},
			// Results out of call order: the flush sorts them by call,
			// which for a late result of an older call needs the call
			// positions the checkpoint carries.
			map[string]any{"role": "user", "content": results(k, id)})
	}

	// Compaction: a shorter, rewritten history decodes whole.
	compacted := []any{map[string]any{"role": "user", "content": "summary of the work so far"},
		map[string]any{"role": "assistant", "content": "ok"}, map[string]any{"role": "user", "content": "go on"}}
	if _, hd := decode(compacted); hd.reused != 0 {
		t.Fatalf("compacted history reused %d messages", hd.reused)
	}
	compacted = append(compacted, map[string]any{"role": "assistant", "content": "done"}, map[string]any{"role": "user", "content": "thanks"})
	if _, hd := decode(compacted); hd.reused != 2 {
		t.Fatalf("after compaction: reused %d messages, want 2", hd.reused)
	}
	// Late system messages (docs/adapter.md §4.3 folds each into the user message before
	// it): one that folds into the tail leaves the prefix reusable...
	late := append(append([]any{}, compacted...), map[string]any{"role": "system", "content": "reminder"})
	if _, hd := decode(late); hd.reused != 4 {
		t.Fatalf("system message folding into the tail: reused %d, want 4", hd.reused)
	}
	// ...one right after the last assistant message folds into the prefix:
	// decoded whole, and no checkpoint is left.
	late = append(append([]any{}, compacted[:4]...), map[string]any{"role": "system", "content": "reminder"})
	if _, hd := decode(late); hd.reused != 0 {
		t.Fatalf("system message folding into the prefix: reused %d", hd.reused)
	}
	if hist.decode().ck != nil {
		t.Fatal("a request whose folding crosses its last assistant message left a checkpoint")
	}
	// A session shaped like Claude Code's (a system message at index 1).
	cc := []any{map[string]any{"role": "user", "content": "task"}, map[string]any{"role": "system", "content": "context"}}
	for k := range 5 {
		_, hd := decode(cc)
		if want := 2*k - 1; k > 1 && hd.reused != want {
			t.Fatalf("Claude Code shape, turn %d: reused %d, want %d", k, hd.reused, want)
		}
		cc = append(cc, map[string]any{"role": "assistant", "content": "step"}, map[string]any{"role": "user", "content": "result"})
	}
}

// decodeWithHistory decodes an Anthropic request body with hist and
// checks it decodes as without: what the adapter does with a session's
// request, and what it must come to.
func decodeWithHistory(t *testing.T, hist *History, h http.Header, body []byte) (Request, *historyDecode) {
	t.Helper()
	want, err := DecodeAnthropic(h, body)
	if err != nil {
		t.Fatal(err)
	}
	hd := hist.decode()
	got, err := decodeAnthropic(h, body, hd)
	if err != nil {
		t.Fatal(err)
	}
	if !reflect.DeepEqual(want, got) {
		t.Fatalf("with history:\n%+v\nwithout:\n%+v", got, want)
	}
	return got, hd
}

func results(k int, id string) []any {
	out := []any{
		map[string]any{"type": "tool_result", "tool_use_id": id + "b", "content": "/repo"},
		map[string]any{"type": "tool_result", "tool_use_id": id, "content": "a b c"}}
	if k%5 == 4 {
		out = append(out, map[string]any{"type": "tool_result", "tool_use_id": fmt.Sprintf("toolu_%d", k-3), "content": "late"})
	}
	return out
}

// Random sessions — user, assistant and system messages in any order, tool
// calls answered late or out of order, edits of earlier messages, dropped
// tails — decode with a History exactly as without one, request after
// request.
func TestHistoryRandomSessions(t *testing.T) {
	h := http.Header{"Authorization": {"Bearer s"}}
	reused := 0
	for seed := range 300 {
		r := rand.New(rand.NewPCG(uint64(seed), 11))
		var hist History
		var msgs []any
		calls := 0
		for turn := range 15 {
			msgs = reviseHistory(r, msgs, map[string]any{"role": "user", "content": fmt.Sprintf("edited %d", turn)})
			for range 1 + r.IntN(3) {
				switch x := r.IntN(10); {
				case x < 4:
					var blocks []any
					for range r.IntN(3) {
						blocks = append(blocks, map[string]any{"type": "tool_use", "id": fmt.Sprintf("c%d", calls), "name": "Bash",
							"input": map[string]any{"command": fmt.Sprint(calls)}})
						calls++
					}
					blocks = append(blocks, map[string]any{"type": "text", "text": "t"})
					msgs = append(msgs, map[string]any{"role": "assistant", "content": blocks})
				case x < 8:
					var blocks []any
					for range r.IntN(3) {
						blocks = append(blocks, map[string]any{"type": "tool_result", "tool_use_id": fmt.Sprintf("c%d", r.IntN(calls+1)), "content": "r"})
					}
					if r.IntN(2) == 0 || len(blocks) == 0 {
						blocks = append(blocks, map[string]any{"type": "text", "text": fmt.Sprintf("u%d", turn)})
					}
					msgs = append(msgs, map[string]any{"role": "user", "content": blocks})
				default:
					msgs = append(msgs, map[string]any{"role": "system", "content": fmt.Sprintf("s%d", turn)})
				}
			}
			body, err := json.Marshal(map[string]any{"system": "sys", "messages": msgs})
			if err != nil {
				t.Fatal(err)
			}
			want, wantErr := DecodeAnthropic(h, body)
			hd := hist.decode()
			got, gotErr := decodeAnthropic(h, body, hd)
			if (wantErr == nil) != (gotErr == nil) || !reflect.DeepEqual(want, got) {
				t.Fatalf("seed %d turn %d (reused %d): with history %v\n%s\nwithout %v\n%s", seed, turn, hd.reused, gotErr, dump(got), wantErr, dump(want))
			}
			reused += hd.reused
		}
	}
	if reused == 0 {
		t.Fatal("no request reused a history: the generator never exercises the History")
	}
	t.Logf("%d messages reused", reused)
}

// reviseHistory is a random session's occasional rewrite before a turn:
// a dropped tail (compaction-like) or an earlier message replaced by
// edited.
func reviseHistory(r *rand.Rand, msgs []any, edited any) []any {
	switch x := r.IntN(20); {
	case x == 0 && len(msgs) > 2:
		return msgs[:r.IntN(len(msgs))]
	case x == 1 && len(msgs) > 0:
		msgs[r.IntN(len(msgs))] = edited
	}
	return msgs
}

func dump(r Request) string {
	var b []byte
	for _, m := range r.Messages {
		b = append(append(b, m...), '\n')
	}
	return string(b)
}

// The same for Responses input: random sessions of messages in every role,
// reasoning, function and custom tool calls answered late, early, twice or
// never (some requests are 400s), instructions that change, edits and
// dropped tails — with a History exactly as without one.
func TestHistoryRandomResponsesSessions(t *testing.T) {
	h := http.Header{"Authorization": {"Bearer s"}}
	reused := 0
	for seed := range 300 {
		r := rand.New(rand.NewPCG(uint64(seed), 13))
		var hist History
		var items []any
		calls := 0
		instructions := any(nil)
		for turn := range 15 {
			switch x := r.IntN(20); {
			case x == 0 && len(items) > 2:
				items = items[:r.IntN(len(items))]
			case x == 1 && len(items) > 0:
				items[r.IntN(len(items))] = map[string]any{"type": "message", "role": "user", "content": fmt.Sprintf("edited %d", turn)}
			case x == 2:
				instructions = fmt.Sprintf("be brief %d", r.IntN(2))
			}
			for range 1 + r.IntN(4) {
				switch x := r.IntN(12); {
				case x < 2:
					role := []string{"user", "developer", "system", "assistant"}[r.IntN(4)]
					items = append(items, map[string]any{"type": "message", "role": role, "content": fmt.Sprintf("%s %d", role, turn)})
				case x < 3:
					items = append(items, map[string]any{"type": "reasoning", "summary": []any{},
						"encrypted_content": reasoningHandle + "dGhpbmtpbmc="})
				case x < 6:
					items = append(items, map[string]any{"type": "function_call", "call_id": fmt.Sprintf("c%d", calls), "name": "exec_command",
						"arguments": fmt.Sprintf(`{"cmd":"ls %d"}`, calls)})
					calls++
				case x < 7:
					items = append(items, map[string]any{"type": "custom_tool_call", "call_id": fmt.Sprintf("c%d", calls), "name": "apply_patch", "input": "*** Begin Patch"})
					calls++
				default:
					typ := "function_call_output"
					if r.IntN(4) == 0 {
						typ = "custom_tool_call_output"
					}
					// Mostly the latest call; sometimes an older or unknown one.
					id := calls - 1 - r.IntN(2)
					if r.IntN(15) == 0 {
						id = calls + 5
					}
					items = append(items, map[string]any{"type": typ, "call_id": fmt.Sprintf("c%d", id), "output": "out"})
				}
			}
			req := map[string]any{"model": "m", "store": false, "input": items}
			if instructions != nil {
				req["instructions"] = instructions
			}
			body, err := json.Marshal(req)
			if err != nil {
				t.Fatal(err)
			}
			want, wantErr := DecodeResponses(h, body)
			hd := hist.decode()
			got, gotErr := decodeResponses(h, body, hd)
			if fmt.Sprint(wantErr) != fmt.Sprint(gotErr) || !reflect.DeepEqual(want, got) {
				t.Fatalf("seed %d turn %d (reused %d): with history %v\n%s\nwithout %v\n%s", seed, turn, hd.reused, gotErr, dump(got), wantErr, dump(want))
			}
			reused += hd.reused
		}
	}
	if reused == 0 {
		t.Fatal("no request reused a history")
	}
	t.Logf("%d items reused", reused)
}

// A Codex-shaped session (developer instructions and two user messages,
// then rounds of reasoning, a call and its output): each request reuses
// everything up to the previous request's last answered call.
func TestHistoryResponsesCodexShape(t *testing.T) {
	var hist History
	h := http.Header{"Authorization": {"Bearer s"}}
	items := []any{
		map[string]any{"type": "message", "role": "developer", "content": []any{map[string]any{"type": "input_text", "text": "You are Codex."}}},
		map[string]any{"type": "message", "role": "user", "content": []any{map[string]any{"type": "input_text", "text": "<environment_context/>"}}},
		map[string]any{"type": "message", "role": "user", "content": []any{map[string]any{"type": "input_text", "text": "fix it"}}},
	}
	prev := 0
	for k := range 10 {
		body, _ := json.Marshal(map[string]any{"model": "m", "store": false, "stream": true, "input": items})
		want, err := DecodeResponses(h, body)
		if err != nil {
			t.Fatal(err)
		}
		hd := hist.decode()
		got, err := decodeResponses(h, body, hd)
		if err != nil || !reflect.DeepEqual(want, got) {
			t.Fatalf("turn %d: %v\n%s\nwant\n%s", k, err, dump(got), dump(want))
		}
		if hd.reused != prev {
			t.Fatalf("turn %d: reused %d items, want %d", k, hd.reused, prev)
		}
		// This request's last boundary, which the next one reuses up to: the
		// point before its last reasoning item (the output before it was
		// pending, and the reasoning flushes it); on the first, before the
		// last user message.
		prev = len(items) - 3
		if k == 0 {
			prev = 2
		}
		id := fmt.Sprintf("call_%d", k)
		items = append(items,
			map[string]any{"type": "reasoning", "summary": []any{}, "encrypted_content": reasoningHandle + "eA=="},
			map[string]any{"type": "function_call", "call_id": id, "name": "exec_command", "arguments": `{"cmd":"ls"}`},
			map[string]any{"type": "function_call_output", "call_id": id, "output": "ok"})
	}
}

// The same messages with other separators between them (a client that
// re-serializes its list differently) are not the previous span, and are
// told message by message; an edit inside the span is caught by both.
func TestHistorySpanAndSeparators(t *testing.T) {
	var hist History
	h := http.Header{"Authorization": {"Bearer s"}}
	var msgs []string
	add := func(role, content string) {
		b, _ := json.Marshal(map[string]any{"role": role, "content": content})
		msgs = append(msgs, string(b))
	}
	decode := func(sep string) *historyDecode {
		t.Helper()
		_, hd := decodeWithHistory(t, &hist, h, []byte(`{"max_tokens":100,"messages":[`+strings.Join(msgs, sep)+`]}`))
		return hd
	}
	add("user", "task")
	for k, sep := range []string{",", ",", ", ", ", ", ",\n", ","} {
		add("assistant", fmt.Sprintf("step %d", k))
		add("user", fmt.Sprintf("result %d", k))
		prevSep := []string{"", ",", ",", ", ", ", ", ",\n"}[k]
		hd := decode(sep)
		switch {
		case k == 0:
		case sep != prevSep && hd.bySpan:
			t.Fatalf("turn %d: separators %q after %q, yet told by the span", k, sep, prevSep)
		case sep == prevSep && !hd.bySpan:
			t.Fatalf("turn %d: the same bytes resent, not told by the span", k)
		case hd.reused != 2*k:
			t.Fatalf("turn %d: reused %d, want %d", k, hd.reused, 2*k)
		}
	}
	// An edit inside the span: nothing reused, and the decode is still
	// the plain one (checked in decode).
	msgs[1] = strings.Replace(msgs[1], "step 0", "step O", 1)
	add("assistant", "more")
	add("user", "ok")
	if hd := decode(","); hd.reused != 0 || hd.bySpan {
		t.Fatalf("edited history: reused %d (by span %v)", hd.reused, hd.bySpan)
	}
}

// The same for Chat Completions: random sessions of every role (and
// messages that are not objects), tool calls with string, object or
// missing arguments, tool lists that change, edits and dropped tails,
// separators that change — with a History exactly as without one.
func TestHistoryRandomChatSessions(t *testing.T) {
	h := http.Header{"Authorization": {"Bearer s"}}
	reused, bySpan := 0, 0
	for seed := range 300 {
		r := rand.New(rand.NewPCG(uint64(seed), 13))
		var hist History
		var msgs []any
		for turn := range 15 {
			msgs = reviseHistory(r, msgs, map[string]any{"role": "user", "content": fmt.Sprintf("edited %d", turn)})
			for range 1 + r.IntN(3) {
				switch x := r.IntN(12); {
				case x < 4:
					a := map[string]any{"role": "assistant", "content": []any{map[string]any{"type": "text", "text": "t"}}}
					if r.IntN(3) == 0 {
						a["reasoning_content"] = "why"
					}
					var calls []any
					for k := range r.IntN(3) {
						args := []any{`{"command":"ls"}`, map[string]any{"n": k}, nil, "not json"}[r.IntN(4)]
						calls = append(calls, map[string]any{"id": fmt.Sprintf("c%d", k), "type": "function",
							"function": map[string]any{"name": "Bash", "arguments": args}})
					}
					if len(calls) > 0 {
						a["tool_calls"] = calls
					}
					msgs = append(msgs, a)
				case x < 7:
					msgs = append(msgs, map[string]any{"role": "tool", "tool_call_id": "c0", "content": fmt.Sprintf("r%d", turn)})
				case x < 10:
					msgs = append(msgs, map[string]any{"role": "user", "content": fmt.Sprintf("u%d", turn)})
				case x < 11:
					msgs = append(msgs, map[string]any{"role": []string{"system", "developer"}[r.IntN(2)], "content": "s"})
				default:
					msgs = append(msgs, []any{"not", "a", "message"}[r.IntN(3)])
				}
			}
			tools := []any{map[string]any{"type": "function", "function": map[string]any{"name": "Bash", "parameters": map[string]any{"type": "object"}}}}
			if r.IntN(4) == 0 {
				tools = append(tools, map[string]any{"type": "function", "function": map[string]any{"name": fmt.Sprint("t", turn)}})
			}
			body, err := json.Marshal(map[string]any{"model": "m", "messages": msgs, "tools": tools})
			if err != nil {
				t.Fatal(err)
			}
			if r.IntN(5) == 0 {
				body = []byte(strings.ReplaceAll(string(body), `},{"content"`, `}, {"content"`))
			}
			want, wantErr := DecodeChat(h, body)
			hd := hist.decode()
			got, gotErr := decodeChat(h, body, hd)
			if (wantErr == nil) != (gotErr == nil) || !reflect.DeepEqual(want, got) {
				t.Fatalf("seed %d turn %d (reused %d): with history %v\n%s\nwithout %v\n%s", seed, turn, hd.reused, gotErr, dump(got), wantErr, dump(want))
			}
			reused += hd.reused
			if hd.bySpan {
				bySpan++
			}
		}
	}
	if reused == 0 || bySpan == 0 {
		t.Fatalf("reused %d messages, %d requests by span: the generator never exercises the History", reused, bySpan)
	}
	t.Logf("%d messages reused, %d requests told by their span", reused, bySpan)
}

// A checkpoint is immutable once stored: a request that reuses it and
// translates further tool calls without leaving a checkpoint of its own (a
// late system message folds across its last assistant message) must not
// add them to the checkpoint's call positions, or a later request reusing
// the same checkpoint would sort its tool results by a call it never made.
func TestHistoryCheckpointImmutable(t *testing.T) {
	var hist History
	h := http.Header{"Authorization": {"Bearer s"}}
	const u0 = `{"role":"user","content":"go"}`
	const a1 = `{"role":"assistant","content":[{"type":"tool_use","id":"t1","name":"Bash","input":{"command":"ls"}}]}`
	const u2 = `{"role":"user","content":[{"type":"tool_result","tool_use_id":"t1","content":"one"}]}`
	decode := func(msgs ...string) *historyDecode {
		t.Helper()
		_, hd := decodeWithHistory(t, &hist, h, []byte(`{"max_tokens":10,"messages":[`+strings.Join(msgs, ",")+`]}`))
		return hd
	}
	decode(u0, a1, u2) // checkpoint through a1
	a3 := `{"role":"assistant","content":[{"type":"tool_use","id":"tX","name":"Bash","input":{}}]}`
	if hd := decode(u0, a1, u2, a3, `{"role":"system","content":"late"}`); hd.reused != 2 {
		t.Fatalf("the request with a late system message reused %d messages, want 2", hd.reused)
	}
	// tX is not a call of this request: its results keep their order.
	u2b := `{"role":"user","content":[{"type":"tool_result","tool_use_id":"tX","content":"x"},{"type":"tool_result","tool_use_id":"t1","content":"one"}]}`
	if hd := decode(u0, a1, u2b); hd.reused != 2 {
		t.Fatalf("reused %d messages, want 2 (the first checkpoint)", hd.reused)
	}
}
