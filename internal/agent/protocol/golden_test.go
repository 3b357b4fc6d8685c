package protocol

import (
	"bytes"
	"encoding/json"
	"flag"
	"fmt"
	"net/http"
	"os"
	"path/filepath"
	"strings"
	"testing"
)

var update = flag.Bool("update", false, "rewrite testdata/golden files")

func golden(t *testing.T, name string, got []byte) {
	t.Helper()
	path := filepath.Join("testdata", "golden", name)
	if *update {
		if err := os.WriteFile(path, got, 0o644); err != nil {
			t.Fatal(err)
		}
		return
	}
	want, err := os.ReadFile(path)
	if err != nil {
		t.Fatalf("%v (run go test -update)", err)
	}
	if !bytes.Equal(got, want) {
		t.Errorf("%s differs from golden:\n got: %s\nwant: %s", name, got, want)
	}
}

// TestGoldenRequests decodes request bodies shaped like what Claude Code,
// Codex and a Chat client send (docs/clients-wire.md) and compares the neutral
// form with golden files.
func TestGoldenRequests(t *testing.T) {
	for _, c := range []struct {
		file string
		dec  func(http.Header, []byte) (Request, error)
		h    http.Header
	}{
		{"claude_code_turn2.json", DecodeAnthropic, hdr("Authorization", "Bearer cagent-x-0-1", "anthropic-version", "2023-06-01", "X-Claude-Code-Session-Id", "ignored")},
		{"codex_turn2.json", DecodeResponses, hdr("Authorization", "Bearer sess-cx", "session-id", "ignored")},
		{"chat_legacy.json", DecodeChat, hdr("Authorization", "Bearer chat-1")},
	} {
		t.Run(c.file, func(t *testing.T) {
			body, err := os.ReadFile(filepath.Join("testdata", "requests", c.file))
			if err != nil {
				t.Fatal(err)
			}
			r, err := c.dec(c.h, body)
			if err != nil {
				t.Fatal(err)
			}
			var b bytes.Buffer
			fmt.Fprintf(&b, "protocol: %s\nsession: %s\nmodel: %s\nstream: %v\nspecs: %+v\n", r.Protocol, r.SessionID, r.Model, r.Stream, r.Specs)
			if r.Sampling.MaxTokens != nil {
				fmt.Fprintf(&b, "max_tokens: %d\n", *r.Sampling.MaxTokens)
			}
			b.WriteString("messages:\n")
			for _, m := range r.Messages {
				if !json.Valid(m) {
					t.Errorf("invalid message JSON %s", m)
				}
				b.Write(m)
				b.WriteByte('\n')
			}
			b.WriteString("tools:\n")
			for _, m := range r.Tools {
				b.Write(m)
				b.WriteByte('\n')
			}
			golden(t, strings.TrimSuffix(c.file, ".json")+".decoded", b.Bytes())
		})
	}
}

var replies = map[string]Reply{
	// row 13: reasoning, text and one tool use
	"mixed": {Reasoning: "r", Content: "t <ok> & é", Calls: []Call{{Name: "lookup", Arguments: json.RawMessage(`{"z":"vime","a":[1,2]}`)}},
		FinishReason: "stop", PromptTokens: 12, OutputTokens: 7},
	// row 1 / 27
	"text": {Content: "done now", FinishReason: "stop", PromptTokens: 3, OutputTokens: 2},
	// row 4 / 26: no room, finish length, empty output
	"length": {FinishReason: "length", PromptTokens: 16},
	// row 21 / 22 / 28: text and two parallel calls, one with non-object arguments
	"parallel": {Content: "Inspecting.", Calls: []Call{{Name: "read", Arguments: json.RawMessage(`{"path":"a"}`)}, {Name: "read", Arguments: json.RawMessage(`"b"`)}},
		FinishReason: "stop", PromptTokens: 5, OutputTokens: 9},
	// row 24: namespaced custom tool
	"custom": {Calls: []Call{{Name: "edit.patch", Arguments: json.RawMessage(`{"input":"a\nb"}`)}, {Name: "unknown", Arguments: json.RawMessage(`{}`)}},
		FinishReason: "stop", PromptTokens: 4, OutputTokens: 6},
}

func TestGoldenReplies(t *testing.T) {
	req := map[Protocol]*Request{Anthropic: {Protocol: Anthropic, Model: "m"}, Responses: {Protocol: Responses}, Chat: {Protocol: Chat, Model: "m"}}
	rr, err := DecodeResponses(nil, []byte(`{"input":"x","tools":[{"type":"namespace","name":"edit","tools":[{"type":"custom","name":"patch","format":{"type":"text"}}]},{"type":"function","name":"read"}]}`))
	if err != nil {
		t.Fatal(err)
	}
	req[Responses] = &rr
	for _, p := range []Protocol{Anthropic, Responses, Chat} {
		for name, rep := range replies {
			for _, stream := range []bool{false, true} {
				r := *req[p]
				r.Stream = stream
				var b bytes.Buffer
				if err := WriteReply(&b, &r, &rep, ReplyOptions{IDs: SeededIDs(1), Created: 1700000000}); err != nil {
					t.Fatal(err)
				}
				checkFraming(t, p, stream, b.Bytes())
				b.WriteString("\n-- assistant message --\n")
				b.Write(AssistantMessage(&r, &rep))
				b.WriteByte('\n')
				kind := "json"
				if stream {
					kind = "sse"
				}
				golden(t, fmt.Sprintf("%s_%s.%s", p, name, kind), b.Bytes())
			}
		}
	}
}

// checkFraming parses every frame: valid JSON payloads, event names equal
// to the payload type, contiguous Responses sequence numbers.
func checkFraming(t *testing.T, p Protocol, stream bool, out []byte) {
	t.Helper()
	if !stream {
		if !json.Valid(out) {
			t.Fatalf("invalid JSON %s", out)
		}
		return
	}
	if !bytes.HasSuffix(out, []byte("\n\n")) {
		t.Fatalf("stream does not end with a blank line")
	}
	seq := 0
	for _, fr := range strings.Split(strings.TrimSuffix(string(out), "\n\n"), "\n\n") {
		lines := strings.Split(fr, "\n")
		data := lines[len(lines)-1]
		if !strings.HasPrefix(data, "data: ") {
			t.Fatalf("frame %q", fr)
		}
		data = data[6:]
		if p == Chat {
			if len(lines) != 1 {
				t.Fatalf("chat frame with event line %q", fr)
			}
			if data == "[DONE]" {
				continue
			}
		}
		var v struct {
			Type string `json:"type"`
			Seq  *int   `json:"sequence_number"`
		}
		if err := json.Unmarshal([]byte(data), &v); err != nil {
			t.Fatalf("frame %q: %v", fr, err)
		}
		if p != Chat && lines[0] != "event: "+v.Type {
			t.Fatalf("event line %q, payload type %q", lines[0], v.Type)
		}
		if p == Responses {
			if v.Seq == nil || *v.Seq != seq {
				t.Fatalf("sequence_number %v, want %d", v.Seq, seq)
			}
			seq++
		}
	}
}

// eventTypes lists the event names of an SSE transcript.
func eventTypes(out string) []string {
	var ev []string
	for _, l := range strings.Split(out, "\n") {
		if strings.HasPrefix(l, "event: ") {
			ev = append(ev, l[7:])
		}
	}
	return ev
}

func TestStreamEventOrder(t *testing.T) {
	// row 13
	var b bytes.Buffer
	rep := replies["mixed"]
	if err := StreamAnthropic(&b, &Request{Protocol: Anthropic}, &rep, ReplyOptions{IDs: SeededIDs(2)}); err != nil {
		t.Fatal(err)
	}
	want := "message_start content_block_start content_block_delta content_block_stop content_block_start content_block_delta content_block_stop content_block_start content_block_delta content_block_stop message_delta message_stop"
	if got := strings.Join(eventTypes(b.String()), " "); got != want {
		t.Errorf("anthropic events %s", got)
	}
	for _, s := range []string{`"content_block":{"type":"tool_use","id":"toolu_`, `"input":{}}`, `"partial_json":"{\"z\":\"vime\",\"a\":[1,2]}"`, `"stop_reason":"tool_use"`, `"usage":{"input_tokens":12,"output_tokens":0}`, `"usage":{"input_tokens":12,"output_tokens":7}`, `t <ok> & é`} {
		if !strings.Contains(b.String(), s) {
			t.Errorf("anthropic stream lacks %s", s)
		}
	}
	// row 22
	b.Reset()
	rep = Reply{Content: "x", Calls: []Call{{Name: "f", Arguments: json.RawMessage(`{}`)}}}
	if err := StreamResponses(&b, &Request{Protocol: Responses}, &rep, ReplyOptions{IDs: SeededIDs(3), Created: 1}); err != nil {
		t.Fatal(err)
	}
	want = "response.created response.output_item.added response.content_part.added response.output_text.delta response.output_text.done response.content_part.done response.output_item.done response.output_item.added response.function_call_arguments.delta response.function_call_arguments.done response.output_item.done response.completed"
	if got := strings.Join(eventTypes(b.String()), " "); got != want {
		t.Errorf("responses events %s", got)
	}
	if !strings.Contains(b.String(), `"status":"in_progress","output":[],"error":null,"incomplete_details":null,"usage":null`) {
		t.Errorf("response.created payload: %s", b.String())
	}
	// row 26
	b.Reset()
	rep = replies["length"]
	_ = StreamResponses(&b, &Request{Protocol: Responses}, &rep, ReplyOptions{IDs: SeededIDs(3), Created: 1})
	if ev := eventTypes(b.String()); ev[len(ev)-1] != "response.incomplete" || !strings.Contains(b.String(), `"incomplete_details":{"reason":"max_output_tokens"}`) {
		t.Errorf("incomplete: %v", ev)
	}
	// row 27/28
	b.Reset()
	rep = replies["parallel"]
	_ = StreamChat(&b, &Request{Protocol: Chat}, &rep, ReplyOptions{IDs: SeededIDs(4), Created: 1})
	out := b.String()
	if strings.Count(out, `"tool_calls":[`) != 1 || strings.Count(out, `"index":0,"id":"call_`) != 1 || strings.Contains(out, "Inspecting.") ||
		!strings.Contains(out, `"finish_reason":"tool_calls"}],"usage":{"prompt_tokens":5,"completion_tokens":9,"total_tokens":14}`) || !strings.HasSuffix(out, "data: [DONE]\n\n") {
		t.Errorf("chat stream:\n%s", out)
	}
}

func TestAnthropicEchoMatchesAssistantMessage(t *testing.T) {
	// docs/adapter.md §4.5: decoding the client's echo of our reply gives AssistantMessage.
	rep := replies["mixed"]
	req := &Request{Protocol: Anthropic}
	var b bytes.Buffer
	if err := WriteAnthropic(&b, req, &rep, ReplyOptions{IDs: SeededIDs(9)}); err != nil {
		t.Fatal(err)
	}
	var msg struct {
		Content json.RawMessage `json:"content"`
	}
	if err := json.Unmarshal(b.Bytes(), &msg); err != nil {
		t.Fatal(err)
	}
	echo := `{"messages":[{"role":"assistant","content":` + string(msg.Content) + `}]}`
	r, err := DecodeAnthropic(nil, []byte(echo))
	if err != nil {
		t.Fatal(err)
	}
	if got, want := string(r.Messages[0]), string(AssistantMessage(req, &rep)); got != want {
		t.Errorf("echo %s\nwant %s", got, want)
	}
}

func TestErrors(t *testing.T) {
	e := ContextOverflow(Anthropic, 20001, 20000)
	if e.Status != 400 || string(e.Body(Anthropic)) != `{"type":"error","error":{"type":"invalid_request_error","message":"prompt is too long: 20001 tokens > 20000 maximum"}}` {
		t.Errorf("%s", e.Body(Anthropic))
	}
	e = ContextOverflow(Responses, 9, 8)
	if e.Status != 400 || !strings.Contains(string(e.Body(Responses)), `"type":"invalid_request_error","param":"input","code":"context_length_exceeded"`) ||
		!strings.Contains(e.Message, "maximum context length is 8 tokens") {
		t.Errorf("%s", e.Body(Responses))
	}
	if got := string(AnthropicError(429, "", "turn cap")); got != `{"type":"error","error":{"type":"rate_limit_error","message":"turn cap"}}` {
		t.Error(got)
	}
	if got := string(OpenAIError(503, "", "", "session closed")); got != `{"error":{"message":"session closed","type":"server_error","param":null,"code":null}}` {
		t.Error(got)
	}
}
