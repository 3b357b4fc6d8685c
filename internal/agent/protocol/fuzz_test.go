package protocol

import (
	"bytes"
	"encoding/json"
	"errors"
	"fmt"
	"net/http"
	"os"
	"path/filepath"
	"reflect"
	"strings"
	"testing"
)

func fuzzDecode(f *testing.F, dec func(http.Header, []byte) (Request, error), seedFile string, seeds ...string) {
	if b, err := os.ReadFile(filepath.Join("testdata", "requests", seedFile)); err == nil {
		f.Add(b)
	}
	for _, s := range seeds {
		f.Add([]byte(s))
	}
	f.Fuzz(func(t *testing.T, body []byte) {
		r, err := dec(http.Header{"Authorization": {"Bearer s"}}, body)
		if err != nil {
			var pe *Error
			if !errors.As(err, &pe) || pe.Status < 400 || pe.Status > 499 || pe.Message == "" {
				t.Fatalf("rejection %v is not a 4xx *Error with a message", err)
			}
			return
		}
		for _, m := range append(append([]json.RawMessage{}, r.Messages...), r.Tools...) {
			if !json.Valid(m) {
				t.Fatalf("invalid JSON out: %s", m)
			}
		}
		// Every reply encodes without error for any decoded request.
		rep := Reply{Reasoning: "r", Content: "c", Calls: []Call{{Name: "x", Arguments: body}}, FinishReason: "length"}
		for _, s := range []bool{false, true} {
			r.Stream = s
			var b bytes.Buffer
			if err := WriteReply(&b, &r, &rep, ReplyOptions{IDs: SeededIDs(1), Created: 1}); err != nil {
				t.Fatal(err)
			}
		}
		if !json.Valid(AssistantMessage(&r, &rep)) {
			t.Fatal("invalid assistant message")
		}
	})
}

func FuzzDecodeAnthropic(f *testing.F) {
	fuzzDecode(f, DecodeAnthropic, "claude_code_turn2.json",
		`{"messages":[{"role":"user","content":"hello"},{"role":"system","content":"s"},{"role":"user","content":"next"}]}`,
		`{"messages":[{"role":"assistant","content":[{"type":"tool_use","id":"a","name":"f","input":"x"}]},{"role":"user","content":[{"type":"tool_result","tool_use_id":"a","content":[{"type":"image"}]}]}]}`,
		`{"max_tokens":1e3,"temperature":"x"}`, `[`, `{"system":5,"messages":null}`)
}

func FuzzDecodeResponses(f *testing.F) {
	fuzzDecode(f, DecodeResponses, "codex_turn2.json",
		`{"input":[{"type":"custom_tool_call","call_id":"c","namespace":"n","name":"p","input":"x"},{"type":"custom_tool_call_output","call_id":"c","output":"ok"}],"tools":[{"type":"namespace","name":"n","tools":[{"type":"custom","name":"p","format":{"type":"grammar","definition":"é"}}]}]}`,
		`{"input":[{"role":"developer","content":"a"},{"role":"user","content":"b"},{"role":"developer","content":"c"}]}`,
		`{"input":"x","tools":[{"type":"web_search"}]}`, `{"store":true}`, `{"input":5}`)
}

func FuzzDecodeChat(f *testing.F) {
	fuzzDecode(f, DecodeChat, "chat_legacy.json",
		`{"messages":[{"role":"assistant","content":null,"tool_calls":[{"function":{"name":"f","arguments":"[1]"}}]}],"stop":"x"}`,
		`{"messages":[{"role":"developer","content":[{"type":"text","text":"r"}]}],"tools":[{"name":"flat"}]}`,
		`{"messages":"x"}`, `null`)
}

// A decode with a History gives what a plain one gives, whatever the
// History holds: a session of requests (a, b, a, b, b) decoded both ways.
func FuzzHistoryDecodeAnthropic(f *testing.F) {
	if b, err := os.ReadFile(filepath.Join("testdata", "requests", "claude_code_full_turn2.json")); err == nil {
		f.Add(b, []byte(`{"system":"other","tools":[],"messages":[{"role":"user","content":"x"}]}`))
	}
	f.Add([]byte(`{"system":[{"type":"text","text":"s"}],"tools":[{"name":"a","input_schema":{"type":"object"}}],"messages":[{"role":"user","content":"x"}]}`),
		[]byte(`{"system":"s2","system":[{"type":"text","text":"s"}],"tools":[{"name":"a","input_schema":{"type":"object"}}],"tools":5,"messages":[]}`))
	f.Add([]byte(`{"system":"","tools":null,"messages":[{"role":"user","content":"x"}]}`), []byte(`{"system":"" ,"tools":null}`))
	turn1 := `{"system":"s","messages":[{"role":"user","content":"go"},{"role":"assistant","content":[{"type":"text","text":"a"},{"type":"tool_use","id":"t1","name":"Bash","input":{"command":"ls"}},{"type":"tool_use","id":"t2","name":"Bash","input":{}}]},{"role":"user","content":[{"type":"tool_result","tool_use_id":"t2","content":"two"},{"type":"tool_result","tool_use_id":"t1","content":"one"}]}]}`
	turn2 := `{"system":"s","messages":[{"role":"user","content":"go"},{"role":"assistant","content":[{"type":"text","text":"a"},{"type":"tool_use","id":"t1","name":"Bash","input":{"command":"ls"}},{"type":"tool_use","id":"t2","name":"Bash","input":{}}]},{"role":"user","content":[{"type":"tool_result","tool_use_id":"t2","content":"two"},{"type":"tool_result","tool_use_id":"t1","content":"one"}]},{"role":"assistant","content":[{"type":"thinking","thinking":"hm"},{"type":"tool_use","id":"t3","name":"Read","input":{"p":1}}]},{"role":"user","content":[{"type":"tool_result","tool_use_id":"t3","content":"three"},{"type":"text","text":"more"}]}]}`
	f.Add([]byte(turn1), []byte(turn2))
	f.Add([]byte(turn2), []byte(turn1))
	f.Add([]byte(turn1), []byte(turn2[:len(turn2)-3]+`,{"role":"system","content":"late"}]}`))
	f.Fuzz(fuzzWithHistory(DecodeAnthropic, DecodeAnthropicHistory))
}

// The same for Responses requests decoded with a History.
func FuzzHistoryDecodeResponses(f *testing.F) {
	if b, err := os.ReadFile(filepath.Join("testdata", "requests", "codex_full_turn2.json")); err == nil {
		f.Add(b, b)
	}
	turn1 := `{"store":false,"input":[{"type":"message","role":"developer","content":"d"},{"type":"message","role":"user","content":"u"},{"type":"function_call","call_id":"a","name":"f","arguments":"{}"},{"type":"function_call_output","call_id":"a","output":"o"}]}`
	turn2 := `{"store":false,"input":[{"type":"message","role":"developer","content":"d"},{"type":"message","role":"user","content":"u"},{"type":"function_call","call_id":"a","name":"f","arguments":"{}"},{"type":"function_call_output","call_id":"a","output":"o"},{"type":"reasoning","encrypted_content":"x"},{"type":"message","role":"developer","content":"late"},{"type":"function_call","call_id":"b","name":"f","arguments":"{}"},{"type":"function_call_output","call_id":"b","output":"o"}]}`
	f.Add([]byte(turn1), []byte(turn2))
	f.Add([]byte(turn2), []byte(turn1))
	f.Add([]byte(turn1), []byte(strings.Replace(turn2, `"store":false`, `"store":false,"instructions":"i"`, 1)))
	f.Fuzz(fuzzWithHistory(DecodeResponses, DecodeResponsesHistory))
}

// The same for Chat Completions requests decoded with a History.
func FuzzHistoryDecodeChat(f *testing.F) {
	turn1 := `{"model":"m","messages":[{"role":"system","content":"s"},{"role":"user","content":"u"},{"role":"assistant","content":"","tool_calls":[{"id":"a","type":"function","function":{"name":"f","arguments":"{\"x\":1}"}}]},{"role":"tool","tool_call_id":"a","content":"o"}],"tools":[{"type":"function","function":{"name":"f","parameters":{"type":"object"}}}]}`
	turn2 := `{"model":"m","messages":[{"role":"system","content":"s"},{"role":"user","content":"u"},{"role":"assistant","content":"","tool_calls":[{"id":"a","type":"function","function":{"name":"f","arguments":"{\"x\":1}"}}]},{"role":"tool","tool_call_id":"a","content":"o"},{"role":"assistant","content":"done","reasoning_content":"r"},{"role":"developer","content":"d"},7,{"role":"user","content":[{"type":"text","text":"more"}]}],"tools":[]}`
	f.Add([]byte(turn1), []byte(turn2))
	f.Add([]byte(turn2), []byte(turn1))
	f.Add([]byte(turn1), []byte(strings.Replace(turn2, `},{"role"`, `}, {"role"`, -1)))
	f.Fuzz(fuzzWithHistory(DecodeChat, DecodeChatHistory))
}

// fuzzWithHistory decodes a session of requests (a, b, a, b, b) with a
// History and without: the same requests, the same errors.
func fuzzWithHistory(plain func(http.Header, []byte) (Request, error),
	withHistory func(http.Header, []byte, *History) (Request, error)) func(*testing.T, []byte, []byte) {
	h := http.Header{"Authorization": {"Bearer s"}}
	return func(t *testing.T, a, b []byte) {
		var hist History
		for _, body := range [][]byte{a, b, a, b, b} {
			want, wantErr := plain(h, body)
			got, gotErr := withHistory(h, body, &hist)
			if fmt.Sprint(wantErr) != fmt.Sprint(gotErr) {
				t.Fatalf("plain err %v, err %v", wantErr, gotErr)
			}
			if wantErr == nil && !reflect.DeepEqual(want, got) {
				t.Fatalf("plain %+v\nwith history %+v", want, got)
			}
		}
	}
}

// Wherever OpenAISessionID answers, it names the session the decode finds.
func FuzzOpenAISessionID(f *testing.F) {
	for _, s := range []string{`{"input":"x","metadata":{"session_id":7},"user":"u"}`,
		`{"messages":[],"user":"a","user":"b"}`, `{"input":"x","metadata":{"session_id":""},"user":[1]}`,
		`{"us\u0065r":"u","input":"x"}`, `{"messages":[{"role":"user","content":"hi"}],"metadata":null}`} {
		f.Add([]byte(s))
	}
	f.Fuzz(func(t *testing.T, body []byte) {
		id, ok := OpenAISessionID(http.Header{}, body)
		if !ok {
			return
		}
		for _, dec := range []func(http.Header, []byte) (Request, error){DecodeResponses, DecodeChat} {
			if r, err := dec(http.Header{}, body); err == nil && r.SessionID != id {
				t.Fatalf("OpenAISessionID %q, decode %q", id, r.SessionID)
			}
		}
	})
}
