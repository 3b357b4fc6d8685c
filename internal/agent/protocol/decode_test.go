package protocol

import (
	"errors"
	"net/http"
	"strings"
	"testing"

	"github.com/kilnrl/kiln/internal/ojson"
)

func hdr(kv ...string) http.Header {
	h := http.Header{}
	for i := 0; i+1 < len(kv); i += 2 {
		h.Add(kv[i], kv[i+1])
	}
	return h
}

func joinRaw(rs [][]byte) string {
	parts := make([]string, len(rs))
	for i, r := range rs {
		parts[i] = string(r)
	}
	return "[" + strings.Join(parts, ",") + "]"
}

func msgs(r Request) string {
	rs := make([][]byte, len(r.Messages))
	for i, m := range r.Messages {
		rs[i] = m
	}
	return joinRaw(rs)
}

func tools(r Request) string {
	rs := make([][]byte, len(r.Tools))
	for i, m := range r.Tools {
		rs[i] = m
	}
	return joinRaw(rs)
}

type decodeCase struct {
	name, body string
	msgs       string // expected Messages as a JSON array, "" = don't check
	tools      string // expected Tools, "" = don't check
	err        string // expected error message substring
}

func runDecode(t *testing.T, dec func(http.Header, []byte) (Request, error), cases []decodeCase) {
	t.Helper()
	for _, c := range cases {
		t.Run(c.name, func(t *testing.T) {
			r, err := dec(http.Header{}, []byte(c.body))
			if c.err != "" {
				var pe *Error
				if !errors.As(err, &pe) || pe.Status != 400 || !strings.Contains(pe.Message, c.err) {
					t.Fatalf("err = %v, want 400 containing %q", err, c.err)
				}
				return
			}
			if err != nil {
				t.Fatal(err)
			}
			if c.msgs != "" && msgs(r) != c.msgs {
				t.Errorf("messages\n got %s\nwant %s", msgs(r), c.msgs)
			}
			if c.tools != "" && tools(r) != c.tools {
				t.Errorf("tools\n got %s\nwant %s", tools(r), c.tools)
			}
		})
	}
}

func TestDecodeAnthropic(t *testing.T) {
	results := func(order ...string) string {
		var b []string
		for _, o := range order {
			b = append(b, `{"type":"tool_result","tool_use_id":"`+o+`","content":"`+o+` out"}`)
		}
		return strings.Join(b, ",")
	}
	calls := `{"role":"assistant","content":[{"type":"tool_use","id":"EI.py","name":"read","input":{"p":"EI"}},{"type":"tool_use","id":"PI.py","name":"read","input":{"p":"PI"}},{"type":"tool_use","id":"LogEI.py","name":"read","input":{"p":"LogEI"}},{"type":"tool_use","id":"base.py","name":"read","input":{"p":"base"}}]}`
	callsMsg := `{"role":"assistant","content":"","tool_calls":[{"type":"function","function":{"name":"read","arguments":{"p":"EI"}}},{"type":"function","function":{"name":"read","arguments":{"p":"PI"}}},{"type":"function","function":{"name":"read","arguments":{"p":"LogEI"}}},{"type":"function","function":{"name":"read","arguments":{"p":"base"}}}]}`
	tool := func(s string) string { return `{"role":"tool","content":"` + s + ` out"}` }
	runDecode(t, DecodeAnthropic, []decodeCase{
		{name: "row9 translate",
			body:  `{"system":"sys","messages":[{"role":"user","content":"hi"},{"role":"assistant","content":[{"type":"thinking","thinking":"plan","signature":"sig"},{"type":"text","text":"ok"},{"type":"tool_use","id":"u1","name":"lookup","input":{"q":"vime"}}]},{"role":"user","content":[{"type":"tool_result","tool_use_id":"u1","content":"result"}]}],"tools":[{"name":"lookup","input_schema":{"type":"object","properties":{"q":{"type":"string"}}}}]}`,
			msgs:  `[{"role":"system","content":"sys"},{"role":"user","content":"hi"},{"role":"assistant","content":"ok","reasoning_content":"plan","tool_calls":[{"type":"function","function":{"name":"lookup","arguments":{"q":"vime"}}}]},{"role":"tool","content":"result"}]`,
			tools: `[{"type":"function","function":{"name":"lookup","description":"","parameters":{"type":"object","properties":{"q":{"type":"string"}}}}}]`},
		{name: "row10a results reordered in one message",
			body: `{"messages":[` + calls + `,{"role":"user","content":[` + results("LogEI.py", "base.py", "EI.py", "PI.py") + `,{"type":"text","text":"Continue with the fix."}]}]}`,
			msgs: `[` + callsMsg + `,` + tool("EI.py") + `,` + tool("PI.py") + `,` + tool("LogEI.py") + `,` + tool("base.py") + `,{"role":"user","content":"Continue with the fix."}]`},
		{name: "row10b results reordered across messages",
			body: `{"messages":[` + calls + `,{"role":"user","content":[` + results("LogEI.py") + `]},{"role":"user","content":[` + results("base.py") + `]},{"role":"user","content":[` + results("EI.py") + `]},{"role":"user","content":[` + results("PI.py") + `]},{"role":"user","content":"Continue with the fix."}]}`,
			msgs: `[` + callsMsg + `,` + tool("EI.py") + `,` + tool("PI.py") + `,` + tool("LogEI.py") + `,` + tool("base.py") + `,{"role":"user","content":"Continue with the fix."}]`},
		{name: "row11 unknown id keeps arrival order",
			body: `{"messages":[` + calls + `,{"role":"user","content":[` + results("LogEI.py", "nope", "EI.py") + `]}]}`,
			msgs: `[` + callsMsg + `,` + tool("LogEI.py") + `,` + tool("nope") + `,` + tool("EI.py") + `]`},
		{name: "row12 fold into preceding user",
			body: `{"messages":[{"role":"user","content":"hello"},{"role":"system","content":"skills list"},{"role":"user","content":"next"}]}`,
			msgs: `[{"role":"user","content":"hello"},{"role":"user","content":"<system-reminder>\nskills list\n</system-reminder>\n"},{"role":"user","content":"next"}]`},
		{name: "row12 fold prepends to next user",
			body: `{"messages":[{"role":"assistant","content":"a"},{"role":"system","content":[{"type":"text","text":"env"}]},{"role":"user","content":[{"type":"text","text":"go"}]}]}`,
			msgs: `[{"role":"assistant","content":"a"},{"role":"user","content":"<system-reminder>\nenv\n</system-reminder>\n"},{"role":"user","content":"go"}]`},
		{name: "row12 fold without user becomes user",
			body: `{"messages":[{"role":"assistant","content":"a"},{"role":"system","content":"env"}]}`,
			msgs: `[{"role":"assistant","content":"a"},{"role":"user","content":"<system-reminder>\nenv\n</system-reminder>\n"}]`},
		{name: "index-0 system kept after top-level system",
			body: `{"system":[{"type":"text","text":"a","cache_control":{"type":"ephemeral"}},{"type":"text","text":"b"}],"messages":[{"role":"system","content":"first"},{"role":"user","content":"u"}]}`,
			msgs: `[{"role":"system","content":"a\nb"},{"role":"system","content":"first"},{"role":"user","content":"u"}]`},
		{name: "images and documents",
			body: `{"messages":[{"role":"user","content":[{"type":"image","source":{"type":"base64","data":"AAAA"}},{"type":"document","title":"d"},{"type":"tool_result","tool_use_id":"x","content":[{"type":"text","text":"t"},{"type":"image"}]}]}]}`,
			msgs: `[{"role":"user","content":"[image omitted]"},{"role":"user","content":"{\"type\":\"document\",\"title\":\"d\"}"},{"role":"tool","content":"t\n[image omitted]"}]`},
		{name: "tools: defer_loading dropped, nameless dropped, order kept, no html escape",
			body:  `{"messages":[],"tools":[{"name":"Bash","description":"run <cmd> & wait","input_schema":{"type":"object","properties":{"z":{"type":"string"},"a":{"type":"integer"}},"required":["z"]}},{"name":"DeferredToolPlaceholder","defer_loading":true,"input_schema":{"type":"object"}},{"description":"no name"},{"name":"Empty"}]}`,
			tools: `[{"type":"function","function":{"name":"Bash","description":"run <cmd> & wait","parameters":{"type":"object","properties":{"z":{"type":"string"},"a":{"type":"integer"}},"required":["z"]}}},{"type":"function","function":{"name":"Empty","description":"","parameters":{"type":"object","properties":{}}}}]`},
		{name: "tool_use input order kept, missing name and input",
			body: `{"messages":[{"role":"assistant","content":[{"type":"tool_use","id":"a","name":"w","input":{"z":1,"a":{"y":2,"b":3}}},{"type":"tool_use","id":"b"},{"type":"redacted_thinking","data":"x"}]}]}`,
			msgs: `[{"role":"assistant","content":"","tool_calls":[{"type":"function","function":{"name":"w","arguments":{"z":1,"a":{"y":2,"b":3}}}},{"type":"function","function":{"name":"tool","arguments":{}}}]}]`},
		{name: "unknown roles and non-objects skipped",
			body: `{"messages":[1,"x",{"role":"bot","content":"b"},{"role":"user","content":"u"}]}`,
			msgs: `[{"role":"user","content":"u"}]`},
		{name: "invalid json", body: `{"messages":[}`, err: "invalid JSON body"},
		{name: "trailing data", body: `{} {}`, err: "invalid JSON body"},
		{name: "not an object", body: `[1]`, err: "must be a JSON object"},
		{name: "messages not a list", body: `{"messages":{}}`, err: "messages must be a list"},
		{name: "bad max_tokens", body: `{"max_tokens":"7"}`, err: "max_tokens must be a positive integer"},
		{name: "bad temperature", body: `{"temperature":"hot"}`, err: "temperature must be a number"},
	})
}

func TestDecodeResponses(t *testing.T) {
	runDecode(t, DecodeResponses, []decodeCase{
		{name: "row23 developer folding",
			body: `{"store":false,"input":[{"type":"message","role":"developer","content":"Use tools."},{"role":"developer","content":[{"type":"input_text","text":"Sandbox policy."}]},{"role":"user","content":"Fix it."},{"role":"developer","content":"Additional constraint."}]}`,
			msgs: `[{"role":"system","content":"Use tools.\n\nSandbox policy."},{"role":"user","content":"Fix it."},{"role":"user","content":"<developer_message>\nAdditional constraint.\n</developer_message>"}]`},
		{name: "instructions first, string input",
			body: `{"instructions":"be brief","input":"hi"}`,
			msgs: `[{"role":"system","content":"be brief"},{"role":"user","content":"hi"}]`},
		{name: "row21 outputs in call order",
			body: `{"input":[{"role":"user","content":"go"},{"type":"reasoning","id":"rs_1","summary":[{"type":"summary_text","text":"s"}],"encrypted_content":"e"},{"type":"message","role":"assistant","content":[{"type":"output_text","text":"Inspecting."}]},{"type":"function_call","call_id":"ca","name":"read","arguments":"{\"path\": \"a\"}"},{"type":"function_call","call_id":"cb","name":"read","arguments":"{\"path\":\"b\"}"},{"type":"function_call_output","call_id":"cb","output":"contents b"},{"type":"function_call_output","call_id":"ca","output":"contents a"}]}`,
			msgs: `[{"role":"user","content":"go"},{"role":"assistant","content":"Inspecting.","tool_calls":[{"type":"function","function":{"name":"read","arguments":{"path":"a"}}},{"type":"function","function":{"name":"read","arguments":{"path":"b"}}}]},{"role":"tool","content":"contents a"},{"role":"tool","content":"contents b"}]`},
		{name: "row24 namespaced custom tool round trip",
			body:  `{"tools":[{"type":"namespace","name":"edit","tools":[{"type":"custom","name":"patch","description":"Apply a patch.","format":{"type":"text"}}]}],"input":[{"role":"user","content":"x"},{"type":"custom_tool_call","call_id":"c1","namespace":"edit","name":"patch","input":"a\nb"},{"type":"custom_tool_call_output","call_id":"c1","output":"applied"}]}`,
			msgs:  `[{"role":"user","content":"x"},{"role":"assistant","content":"","tool_calls":[{"type":"function","function":{"name":"edit.patch","arguments":{"input":"a\nb"}}}]},{"role":"tool","content":"applied"}]`,
			tools: `[{"type":"function","function":{"name":"edit.patch","description":"Apply a patch.\nPass the tool's raw text as the input string.\nInput format: {\"type\": \"text\"}","parameters":{"type":"object","properties":{"input":{"type":"string"}},"required":["input"]}}}]`},
		{name: "function tools: missing type, strict dropped, defer_loading dropped",
			body:  `{"input":"x","tools":[{"type":"function","name":"exec_command","description":"Run","strict":false,"parameters":{"type":"object","properties":{"cmd":{"type":"string"},"workdir":{"type":"string"}},"required":["cmd"]}},{"name":"plain"},{"type":"function","name":"later","defer_loading":true}]}`,
			tools: `[{"type":"function","function":{"name":"exec_command","description":"Run","parameters":{"type":"object","properties":{"cmd":{"type":"string"},"workdir":{"type":"string"}},"required":["cmd"]}}},{"type":"function","function":{"name":"plain","description":"","parameters":{"type":"object","properties":{}}}}]`},
		{name: "unanswered call produces nothing", body: `{"input":[{"type":"function_call","call_id":"a","name":"f","arguments":""},{"role":"user","content":"u"}]}`,
			msgs: `[{"role":"assistant","content":"","tool_calls":[{"type":"function","function":{"name":"f","arguments":{}}}]},{"role":"user","content":"u"}]`},
		{name: "row25 previous_response_id", body: `{"previous_response_id":"x","input":"hi"}`, err: "store=false"},
		{name: "row25 store true", body: `{"store":true,"input":"hi"}`, err: "stored responses are unsupported"},
		{name: "row25 item_reference", body: `{"input":[{"type":"item_reference","id":"x"}]}`, err: "Unsupported Responses input type: item_reference"},
		{name: "row25 unknown call_id", body: `{"input":[{"type":"function_call_output","call_id":"zz","output":"o"}]}`, err: "Duplicate or unknown tool output call_id"},
		{name: "row25 duplicate output", body: `{"input":[{"type":"function_call","call_id":"a","name":"f"},{"type":"function_call_output","call_id":"a","output":"1"},{"type":"function_call_output","call_id":"a","output":"2"}]}`, err: "Duplicate or unknown tool output call_id"},
		{name: "row25 hosted web_search", body: `{"input":"x","tools":[{"type":"web_search","external_web_access":true}]}`, err: "Unsupported Responses tool type: web_search"},
		{name: "row25 role tool", body: `{"input":[{"type":"message","role":"tool","content":"x"}]}`, err: "Unsupported Responses message role: tool"},
		{name: "input missing", body: `{}`, err: "input must be a string or list"},
		{name: "background", body: `{"background":true,"input":"x"}`, err: "background"},
		{name: "invalid json", body: `{"input":`, err: "invalid JSON body"},
	})
}

func TestDecodeChat(t *testing.T) {
	runDecode(t, DecodeChat, []decodeCase{
		{name: "row29 translate",
			body: `{"messages":[{"role":"developer","content":"rules"},{"role":"user","content":[{"type":"text","text":"hello"}]},{"role":"assistant","content":null,"tool_calls":[{"id":"call_1","type":"function","function":{"name":"lookup","arguments":"{\"q\": \"vime\"}"}}]},{"role":"tool","tool_call_id":"call_1","content":"found"}]}`,
			msgs: `[{"role":"system","content":"rules"},{"role":"user","content":"hello"},{"role":"assistant","content":"","tool_calls":[{"type":"function","function":{"name":"lookup","arguments":{"q":"vime"}}}]},{"role":"tool","content":"found"}]`},
		{name: "row29 invalid arguments",
			body: `{"messages":[{"role":"assistant","content":"x","reasoning_content":"r","tool_calls":[{"function":{"name":"f","arguments":"not json"}},{"name":"g","arguments":[1]},{"function":{"arguments":"  "}}]}]}`,
			msgs: `[{"role":"assistant","content":"x","reasoning_content":"r","tool_calls":[{"type":"function","function":{"name":"f","arguments":{"_raw_arguments":"not json"}}},{"type":"function","function":{"name":"g","arguments":{"_raw_arguments":"[1]"}}},{"type":"function","function":{"name":"tool","arguments":{}}}]}]`},
		{name: "tool results keep arrival order",
			body: `{"messages":[{"role":"tool","tool_call_id":"b","content":"B"},{"role":"tool","tool_call_id":"a","content":"A"},{"role":"function","content":"dropped"}]}`,
			msgs: `[{"role":"tool","content":"B"},{"role":"tool","content":"A"}]`},
		{name: "tools nested and flat, non-function skipped",
			body:  `{"messages":[],"tools":[{"type":"function","function":{"name":"a","parameters":{"type":"object","properties":{"y":{},"x":{}}}}},{"name":"b","description":"flat"},{"type":"retrieval"},{"type":"function","function":{}}]}`,
			tools: `[{"type":"function","function":{"name":"a","description":"","parameters":{"type":"object","properties":{"y":{},"x":{}}}}},{"type":"function","function":{"name":"b","description":"flat","parameters":{"type":"object","properties":{}}}}]`},
		{name: "messages must be a list", body: `{"messages":"hi"}`, err: "messages must be a list"},
		{name: "stop must be strings", body: `{"messages":[],"stop":[1]}`, err: "stop must be"},
		{name: "invalid json", body: `nope`, err: "invalid JSON body"},
	})
}

func TestCoerceArguments(t *testing.T) {
	for in, want := range map[string]string{
		`{"b":1,"a":2}`:     `{"b":1,"a":2}`,
		`null`:              `{}`,
		`"  "`:              `{}`,
		`" {\"x\":1} "`:     `{"x":1}`,
		`"[1,2]"`:           `{"_raw_arguments":"[1,2]"}`,
		`"not json"`:        `{"_raw_arguments":"not json"}`,
		`5`:                 `{"_raw_arguments":"5"}`,
		`[1,{"a":"<&>"}]`:   `{"_raw_arguments":"[1,{\"a\":\"<&>\"}]"}`,
		`"{\"a\":\"é\"}"`:   `{"a":"é"}`,
		`"{\"a\":1} extra"`: `{"_raw_arguments":"{\"a\":1} extra"}`,
	} {
		v, err := ojson.Decode([]byte(in))
		if err != nil {
			t.Fatal(in, err)
		}
		if got := string(ojson.Marshal(coerceArguments(v))); got != want {
			t.Errorf("coerce(%s) = %s, want %s", in, got, want)
		}
	}
}

func TestSessionID(t *testing.T) {
	cases := []struct {
		p    Protocol
		h    http.Header
		body string
		want string
	}{
		{Anthropic, hdr("X-Api-Key", " key "), `{}`, "key"},
		{Anthropic, hdr("Authorization", "Bearer bsid", "X-Api-Key", "key"), `{}`, "bsid"},
		{Anthropic, hdr("Authorization", "bearer   "), `{"metadata":{"session_id":"m"}}`, "default"},
		{Anthropic, hdr("Authorization", "BEARER cc-sess"), `{}`, "cc-sess"},
		{Chat, hdr(), `{"messages":[],"metadata":{"session_id":"meta"},"user":"u"}`, "meta"},
		{Chat, hdr(), `{"messages":[],"user":"u"}`, "u"},
		{Chat, hdr("Authorization", "Bearer b", "X-Slime-Session-Id", "s"), `{"messages":[],"user":"u"}`, "b"},
		{Chat, hdr("X-Api-Key", "k", "X-Slime-Session-Id", "s"), `{"messages":[]}`, "default"},
		{Responses, hdr(), `{"input":"x","metadata":{"session_id":7}}`, "7"},
		{Responses, hdr(), `{"input":"x","metadata":{"session_id":""},"user":""}`, "default"},
		{Responses, hdr("Authorization", "Bearer cx"), `{"input":"x","user":"u"}`, "cx"},
		{Responses, hdr(), `{"user":"first","input":"x","user":"last"}`, "last"},
		{Responses, hdr(), ` {"metadata":{"session_id":true,"session_id":false},"input":"x","user":{"a":1}} `, `{"a":1}`},
		{Responses, hdr(), `{"metadata":[1],"input":"x","user":12.50}`, "12.50"},
		{Chat, hdr(), `{"messages":[{"role":"user","content":"{\"user\":\"no\"}"}],"metadata":{"user":"no"}}`, "default"},
	}
	for i, c := range cases {
		r, err := decodeFor(c.p)(c.h, []byte(c.body))
		if err != nil {
			t.Fatal(i, err)
		}
		if r.SessionID != c.want {
			t.Errorf("%d: sid %q, want %q", i, r.SessionID, c.want)
		}
		if c.p != Anthropic {
			id, ok := OpenAISessionID(c.h, []byte(c.body))
			if !ok || id != c.want {
				t.Errorf("%d: OpenAISessionID %q (ok %v), want %q", i, id, ok, c.want)
			}
		}
	}

	// Where the skim cannot vouch for the decode's answer it says so.
	for _, body := range []string{`{"us\u0065r":"u","input":"x"}`, `{"user":"u"`, `{"user":"u"} {}`, `[]`, `{"user":}`} {
		if id, ok := OpenAISessionID(hdr(), []byte(body)); ok {
			t.Errorf("OpenAISessionID(%s) = %q, want not ok", body, id)
		}
	}
}

func decodeFor(p Protocol) func(http.Header, []byte) (Request, error) {
	switch p {
	case Anthropic:
		return DecodeAnthropic
	case Responses:
		return DecodeResponses
	}
	return DecodeChat
}

func TestSamplingAndStream(t *testing.T) {
	r, err := DecodeAnthropic(hdr("Accept", "text/event-stream"), []byte(`{"max_tokens":7,"stop_sequences":["X"],"temperature":null,"top_k":5,"model":"m"}`))
	if err != nil {
		t.Fatal(err)
	}
	s := r.Sampling
	if !r.Stream || r.Model != "m" || *s.MaxTokens != 7 || len(s.Stop) != 1 || s.Stop[0] != "X" ||
		!s.Temperature.Set || s.Temperature.Value != nil || s.TopP.Set || *s.TopK.Value != 5 {
		t.Fatalf("%+v", r)
	}
	r, err = DecodeResponses(nil, []byte(`{"input":"x","max_output_tokens":9,"max_tokens":null,"max_completion_tokens":5,"stop":"END","stream":true}`))
	if err != nil {
		t.Fatal(err)
	}
	if *r.Sampling.MaxTokens != 5 || r.Sampling.Stop[0] != "END" || !r.Stream {
		t.Fatalf("%+v", r.Sampling)
	}
	r, _ = DecodeChat(nil, []byte(`{"messages":[],"stream":"yes","max_tokens":3}`))
	if r.Stream || *r.Sampling.MaxTokens != 3 {
		t.Fatalf("%+v", r)
	}
}
