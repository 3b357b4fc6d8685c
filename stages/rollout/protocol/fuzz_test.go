package protocol

import (
	"bytes"
	"encoding/json"
	"errors"
	"net/http"
	"os"
	"path/filepath"
	"reflect"
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

// A cached decode gives what an uncached one gives, whatever the cache
// holds: each body is decoded with a cache that has seen the previous
// bodies (hits on resent parts, misses on new ones) and without a cache.
func FuzzCachedDecodeAnthropic(f *testing.F) {
	if b, err := os.ReadFile(filepath.Join("testdata", "requests", "claude_code_full_turn2.json")); err == nil {
		f.Add(b, []byte(`{"system":"other","tools":[],"messages":[{"role":"user","content":"x"}]}`))
	}
	f.Add([]byte(`{"system":[{"type":"text","text":"s"}],"tools":[{"name":"a","input_schema":{"type":"object"}}],"messages":[{"role":"user","content":"x"}]}`),
		[]byte(`{"system":"s2","system":[{"type":"text","text":"s"}],"tools":[{"name":"a","input_schema":{"type":"object"}}],"tools":5,"messages":[]}`))
	f.Add([]byte(`{"system":"","tools":null,"messages":[{"role":"user","content":"x"}]}`), []byte(`{"system":"" ,"tools":null}`))
	h := http.Header{"Authorization": {"Bearer s"}}
	f.Fuzz(func(t *testing.T, a, b []byte) {
		c := NewCache()
		for _, body := range [][]byte{a, b, a, b} {
			want, wantErr := DecodeAnthropic(h, body)
			got, gotErr := c.DecodeAnthropic(h, body)
			if (wantErr == nil) != (gotErr == nil) {
				t.Fatalf("uncached err %v, cached err %v", wantErr, gotErr)
			}
			if wantErr == nil && !reflect.DeepEqual(want, got) {
				t.Fatalf("uncached %+v\ncached %+v", want, got)
			}
		}
	})
}
