package engine

import (
	"encoding/json"
	"fmt"
	"os"
	"path/filepath"
	"strconv"
	"strings"
	"testing"

	"github.com/stretchr/testify/assert"
)

// scanTokenize agrees with encoding/json wherever it answers and declines
// what it cannot vouch for.
func TestScanTokenize(t *testing.T) {
	cases := []struct {
		body string
		ok   bool
	}{
		{`{"count":3,"max_model_len":4096,"tokens":[1,22,333],"token_strs":null}`, true},
		{` { "tokens" : [ ] , "count" : 0 } `, true},
		{`{"tokens":[5],"extra":{"a":["]",{"b":"}"}]},"max_model_len":null}`, true},
		{`{"tokens":[2147483647]}`, true},
		{`{"tokens":[2147483648]}`, false},
		{`{"tokens":[-1]}`, false},
		{`{"tokens":[1.0]}`, false},
		{`{"tokens":[01]}`, false},
		{`{"tokens":[1,]}`, false},
		{`{"tokens":[1]`, false},
		{`{"count":2}`, false},
		{`{"tokens":[1]} x`, false},
		{`[1,2]`, false},
		{`{"tokens":[0,9,10,99999999]}`, true},
		{"{\"tokens\":[ 1 ,\n2\t, 3 ]}", true},
		{`{"tokens":[00000000001]}`, false},
		{`{"tokens":[99999999999]}`, false},
		{`{"tokens":[4294967297]}`, false},
		{`{"tokens":[1e3]}`, false},
		{`{"tokens":[1,,2]}`, false},
		{`{"tokens":[,1]}`, false},
		{`{"tokens":[1 2]}`, false},
		{`{"tokens":[1,"2"]}`, false},
		{`{"tokens":[1,2`, false},
	}
	for _, c := range cases {
		ids, count, hasCount, maxLen, ok := scanTokenize([]byte(c.body), nil)
		assert.Equal(t, c.ok, ok, c.body)
		if !ok {
			continue
		}
		var want struct {
			Count       *int    `json:"count"`
			MaxModelLen *int    `json:"max_model_len"`
			Tokens      []int32 `json:"tokens"`
		}
		if !assert.NoError(t, json.Unmarshal([]byte(c.body), &want), c.body) {
			continue
		}
		assert.Equal(t, want.Tokens, ids, c.body)
		assert.Equal(t, want.Count != nil, hasCount, c.body)
		if want.Count != nil {
			assert.Equal(t, *want.Count, count)
		}
		if want.MaxModelLen != nil {
			assert.Equal(t, *want.MaxModelLen, maxLen)
		}
	}
}

// The one-pass generate reader takes exactly the well-formed replies and
// reads them as encoding/json does; everything else goes to the slow path.
func TestFastGenerate(t *testing.T) {
	ids := []int32{101, 102}
	reply := func(content string) string {
		return `{"request_id":"r","choices":[{"index":0,"token_ids":[101,102],"logprobs":{"content":` + content +
			`},"finish_reason":"stop"}],"prompt_token_ids":[1,2,3]}`
	}
	entries := []struct {
		name    string
		content string
		ok      bool
		intIDs  bool
	}{
		{"integer ids", `[{"token_id":101,"logprob":-0.1},{"token_id":102,"logprob":-0.25}]`, true, true},
		{"labels", `[{"token":"token_id:101","logprob":-0.1,"bytes":[1,2]},{"token":"token_id:102","logprob":-0.25,"top_logprobs":[]}]`, true, false},
		{"both, spaced, reordered", ` [ { "logprob" : -0.1 , "token" : "token_id:101", "token_id" : 101 } , {"rank":1,"logprob":-2.5e-1,"token_id":102} ] `, true, true},
		{"no ids", `[{"logprob":-0.1,"token":"a"},{"logprob":-0.25,"token":"b"}]`, true, false},
		{"id mismatch", `[{"token_id":101,"logprob":-0.1},{"token_id":103,"logprob":-0.25}]`, false, false},
		{"label mismatch", `[{"token":"token_id:101","logprob":-0.1},{"token":"token_id:7","logprob":-0.25}]`, false, false},
		{"label vs id", `[{"token_id":101,"token":"token_id:102","logprob":-0.1},{"token_id":102,"logprob":-0.25}]`, false, false},
		{"missing logprob", `[{"token_id":101},{"token_id":102,"logprob":-0.25}]`, false, false},
		{"null logprob", `[{"token_id":101,"logprob":null},{"token_id":102,"logprob":-0.25}]`, false, false},
		{"NaN string", `[{"token_id":101,"logprob":"NaN"},{"token_id":102,"logprob":-0.25}]`, false, false},
		{"bare NaN", `[{"token_id":101,"logprob":NaN},{"token_id":102,"logprob":-0.25}]`, false, false},
		{"overflow float32", `[{"token_id":101,"logprob":-1e300},{"token_id":102,"logprob":-0.25}]`, false, false},
		{"case-folded key", `[{"token_id":101,"Logprob":-0.1},{"token_id":102,"logprob":-0.25}]`, false, false},
		{"escaped token", `[{"token":"token_id:10\u0031","logprob":-0.1},{"token_id":102,"logprob":-0.25}]`, false, false},
		{"too few", `[{"token_id":101,"logprob":-0.1}]`, false, false},
		{"too many", `[{"token_id":101,"logprob":-0.1},{"token_id":102,"logprob":-0.25},{"logprob":-1}]`, false, false},
		{"negative id", `[{"token_id":-101,"logprob":-0.1},{"token_id":102,"logprob":-0.25}]`, false, false},
		{"not a list", `{"token_id":101}`, false, false},
		{"shape C", `[{"token_id":101,"logprob":-0.1,"rank":1,"top_logprobs":[{"token_id":101,"logprob":-0.1,"rank":1}]},` +
			`{"token_id":102,"logprob":-0.25,"rank":2,"top_logprobs":[{"token_id":102,"logprob":-0.25,"rank":2},{"token_id":7,"logprob":-0.5,"rank":1}]}]`, true, true},
		{"shape C, top entries not the sampled one", `[{"token_id":101,"logprob":-0.1,"rank":null,"top_logprobs":[{"token_id":9,"logprob":-0.01,"rank":1}]},` +
			`{"token_id":102,"logprob":-0.25,"rank":1,"top_logprobs":[]}]`, true, true},
		{"shape C, sampled top entry unclosed", `[{"token_id":101,"logprob":-0.1,"rank":1,"top_logprobs":[{"token_id":101,"logprob":-0.1,"rank":1]},` +
			`{"token_id":102,"logprob":-0.25,"rank":2,"top_logprobs":[]}]`, false, false},
	}
	for _, c := range entries {
		t.Run(c.name, func(t *testing.T) {
			r, ok := fastGenerate([]byte(reply(c.content)))
			ok = ok && !namesOtherIDs(r.entryIDs, r.ids)
			if ok != c.ok {
				t.Fatalf("ok = %v, want %v", ok, c.ok)
			}
			if !ok {
				return
			}
			assert.Equal(t, ids, r.ids)
			// The ids are kept as the turn's output: their array holds
			// them and not room for every comma of the reply after them.
			assert.Equal(t, len(ids), cap(r.ids), "capacity of the output ids")
			if r.intIDs != c.intIDs || len(r.lps) != 2 || r.lps[0] != float32(-0.1) || r.lps[1] != float32(-0.25) {
				t.Fatalf("got %v intIDs=%v", r.lps, r.intIDs)
			}
			assert.Equal(t, `"stop"`, string(r.ch.FinishReason))
			assert.Equal(t, `[1,2,3]`, string(r.resp.PromptTokenIDs))
		})
	}
	good := `[{"token_id":101,"logprob":-0.1},{"token_id":102,"logprob":-0.25}]`
	shapes := []struct {
		name, body string
		ok         bool
	}{
		{"every field", `{"choices":[{"token_ids":[101,102],"logprobs":{"content":` + good + `},"finish_reason":"length","stop_reason":null,"sampling_mask":null,"routed_experts":null}],"usage":{"prompt_tokens":3},"model":"m","created":1,"output_mode":"tokens"}`, true},
		{"two choices", `{"choices":[{"token_ids":[101,102],"logprobs":{"content":` + good + `}},{"token_ids":[101,102],"logprobs":{"content":` + good + `}}]}`, false},
		{"no choices", `{"choices":[]}`, false},
		{"case-folded choices", `{"Choices":[{"token_ids":[101,102],"logprobs":{"content":` + good + `}}]}`, false},
		{"case-folded token_ids", `{"choices":[{"Token_ids":[101,102],"logprobs":{"content":` + good + `}}]}`, false},
		{"null token_ids", `{"choices":[{"token_ids":null,"logprobs":{"content":` + good + `}}]}`, false},
		{"no logprobs", `{"choices":[{"token_ids":[]}]}`, false},
		{"null content", `{"choices":[{"token_ids":[],"logprobs":{"content":null}}]}`, false},
		{"empty output", `{"choices":[{"token_ids":[],"logprobs":{"content":[]}}]}`, true},
		{"trailing bytes", `{"choices":[{"token_ids":[101,102],"logprobs":{"content":` + good + `}}]} x`, false},
		{"escaped key", `{"choices":[{"token_ids":[101,102],"logprobs":{"content":` + good + `}}],"u\u0073age":null}`, false},
		{"truncated", `{"choices":[{"token_ids":[101,102],"logprobs":{"content":` + good, false},
	}
	for _, c := range shapes {
		t.Run(c.name, func(t *testing.T) {
			_, ok := fastGenerate([]byte(c.body))
			assert.Equal(t, c.ok, ok)
		})
	}
}

// entryC reads shape (C) entries itself (entry is the fallback): the
// sampled token's own top entry by its bytes, others skimmed.
func TestEntryC(t *testing.T) {
	for _, c := range []struct {
		entry string
		ok    bool
	}{
		{`{"token_id":101,"logprob":-0.1,"rank":1,"top_logprobs":[{"token_id":101,"logprob":-0.1,"rank":1}]}`, true},
		{`{"token_id":101,"logprob":-0.1,"rank":1,"top_logprobs":[{"token_id":101,"logprob":-0.1,"rank":1},{"token_id":5,"logprob":-3,"rank":2}]}`, true},
		{`{"token_id":101,"logprob":-0.1,"rank":3,"top_logprobs":[{"token_id":5,"logprob":-0.01,"rank":1},{"token_id":101,"logprob":-0.1,"rank":3}]}`, true},
		{`{"token_id":101,"logprob":-0.1,"rank":null,"top_logprobs":[]}`, true},
		{`{"token_id":101,"logprob":-1.2345678901234567e-05,"rank":1,"top_logprobs":[{"token_id":101,"logprob":-1.2345678901234567e-05,"rank":1}]}`, true},
		{`{"token_id":101,"logprob":-0.1,"rank":1,"top_logprobs":[{"token_id":101,"logprob":-0.1,"rank":1}`, false},
		{`{"token_id":101,"logprob":-0.1,"rank":1,"top_logprobs":[{"token_id":101,"logprob":-0.1,"rank":1}]`, false},
		{`{"token_id":101,"logprob":-0.1,"rank":1,"top_logprobs":[{"token_id":101,"logprob":-0.1,"rank":1},]}`, false},
		{`{"token_id":101,"logprob":-0.1,"rank":1,"top_logprobs":[{"token_id":101,"logprob":,"rank":1}]}`, false},
		{`{"token_id":101,"logprob":-0.1,"rank":1,"top_logprobs":[{"token_id":101,"logprob":-0.1,"rank":1X]}`, false},
		{`{"token_id":101,"logprob":-0.1,"rank":1,"top_logprobs":[{"token_id":101,"logprob":-0.1,"rank":12}]}`, true},
	} {
		var r genReply
		end := r.entryC([]byte(c.entry+",next"), 0)
		if c.ok {
			assert.Equal(t, len(c.entry), end, "%s", c.entry)
			assert.Equal(t, []int32{101}, r.entryIDs)
		} else {
			assert.Equal(t, -1, end, "%s", c.entry)
			assert.Empty(t, r.lps)
		}
	}
}

func TestAppendUint32(t *testing.T) {
	for _, v := range []uint32{0, 1, 9, 10, 11, 99, 100, 101, 999, 1000, 65535, 151643, 999999, 1000000, 2147483647, 4294967295} {
		assert.Equal(t, strconv.FormatUint(uint64(v), 10), string(appendUint32([]byte("x"), v))[1:], v)
	}
	assert.Equal(t, "[0,7,-3,151645]", string(appendIDs(nil, []int32{0, 7, -3, 151645})))
	assert.Equal(t, "null", string(appendIDs(nil, nil)))
}

// On any valid JSON reply, parseGenerate (the one-pass reader first) gives
// what the encoding/json path gives. Values the one-pass reader skips are
// checked for structure only, so a reply whose skipped parts break the
// grammar may be read rather than refused; on such input it must still not
// fail where the slow path succeeds.
func FuzzParseGenerate(f *testing.F) {
	for _, name := range []string{"generate_a.json", "generate_b.json", "generate_c.json"} {
		b, err := os.ReadFile(filepath.Join("testdata", name))
		if err != nil {
			f.Fatal(err)
		}
		f.Add(b)
	}
	f.Add([]byte(`{"choices":[{"token_ids":[],"logprobs":{"content":[]}}]}`))
	// Shape C as vLLM lays it out (entryC's fast path), with a rank null,
	// an empty top list and two top entries.
	f.Add([]byte(`{"choices":[{"index":0,"finish_reason":"stop","token_ids":[5,6,7],"logprobs":{"content":[` +
		`{"token_id":5,"logprob":-0.10000000149011612,"rank":1,"top_logprobs":[{"token_id":5,"logprob":-0.10000000149011612,"rank":1}]},` +
		`{"token_id":6,"logprob":-2.5e-05,"rank":null,"top_logprobs":[]},` +
		`{"token_id":7,"logprob":-0.0,"rank":2,"top_logprobs":[{"token_id":9,"logprob":-1,"rank":1},{"token_id":7,"logprob":-0.0,"rank":2}]}]}}]}`))
	f.Add([]byte(`{"choices":[{"token_ids":[5],"logprobs":{"content":[{"token":"token_id:5","logprob":-1}]},"finish_reason":"length","stop_reason":7}],"usage":{"prompt_tokens":2,"completion_tokens":1,"total_tokens":3}}`))
	f.Fuzz(func(t *testing.T, body []byte) {
		req := &GenerateRequest{PromptIDs: []int32{1, 2}}
		fast, fastErr := parseGenerate(body, req)
		slow, slowErr := parseGenerateSlow(body, req)
		if !json.Valid(body) {
			if fastErr != nil && slowErr == nil {
				t.Fatalf("fast err %v where the slow path reads the reply", fastErr)
			}
			return
		}
		if (fastErr == nil) != (slowErr == nil) {
			t.Fatalf("fast err %v, slow err %v", fastErr, slowErr)
		}
		if fastErr == nil {
			assert.Equal(t, slow, fast)
		}
	})
}

// BenchmarkScanTokenize reads a /tokenize reply of 5,000 ids.
func BenchmarkScanTokenize(b *testing.B) {
	ids := make([]int32, 5000)
	for i := range ids {
		ids[i] = int32((i * 7919) % 151643)
	}
	body := append(append([]byte(`{"count":5000,"max_model_len":32768,"tokens":`), appendIDs(nil, ids)...), `,"token_strs":null}`...)
	b.SetBytes(int64(len(body)))
	for b.Loop() {
		if got, _, _, _, ok := scanTokenize(body, nil); !ok || len(got) != len(ids) {
			b.Fatal("scan failed")
		}
	}
}

// BenchmarkParseGenerate reads a newest-shape generate reply of 148
// sampled tokens, each with its sampled-token top entry (logprobs: 0), the
// reply the adapter reads every turn.
func BenchmarkParseGenerate(b *testing.B) {
	var sb strings.Builder
	sb.WriteString(`{"request_id":"generate-tokens-r1","output_mode":"tokens","model":"m","created":1700000000,"choices":[{"index":0,"finish_reason":"stop","stop_reason":null,"token_ids":[`)
	ids := make([]int32, 148)
	for i := range ids {
		ids[i] = int32((i * 7919) % 151643)
		if i > 0 {
			sb.WriteByte(',')
		}
		fmt.Fprint(&sb, ids[i])
	}
	sb.WriteString(`],"logprobs":{"content":[`)
	for i, id := range ids {
		if i > 0 {
			sb.WriteByte(',')
		}
		lp := -float64(i%17)*0.0731234567891 - 0.000012338161468505859
		fmt.Fprintf(&sb, `{"token_id":%d,"logprob":%v,"rank":1,"top_logprobs":[{"token_id":%d,"logprob":%v,"rank":1}]}`, id, lp, id, lp)
	}
	sb.WriteString(`]},"routed_experts":null,"sampling_mask":null,"weight_versions":null}],"usage":{"prompt_tokens":4000,"total_tokens":4148,"completion_tokens":148,"prompt_tokens_details":null},"prompt_token_ids":null,"mm_placeholders":null,"metrics":null,"prompt_logprobs":null,"prompt_token_id_logprobs":null,"kv_transfer_params":null,"ec_transfer_params":null}`)
	body := []byte(sb.String())
	req := &GenerateRequest{PromptIDs: make([]int32, 4000)}
	b.SetBytes(int64(len(body)))
	for b.Loop() {
		g, err := parseGenerate(body, req)
		if err != nil || len(g.OutputIDs) != len(ids) {
			b.Fatal(err)
		}
	}
}

// TestScanDetokenize: the fast reader gives what encoding/json gives, or
// declines.
func TestScanDetokenize(t *testing.T) {
	for _, body := range []string{
		`{"prompt":"hello <|im_end|>"}`,
		` {"prompt" : "a b" , "other": [1,{"x":"y"}]} `,
		`{"prompt":"caf\u00e9 \n"}`,
		`{"prompt":"tab	raw"}`,
		"{\"prompt\":\"bad \xff utf8\"}",
		`{"prompt":"é ünïcödé"}`,
		`{"prompt":null}`,
		`{"prompt":1}`,
		`{"Prompt":"folded"}`,
		`{"prompt":"one","prompt":"two"}`,
		`{"prompt":"x"} trailing`,
		`{"prompt":"unterminated}`,
		`{}`,
		`[]`,
	} {
		var want struct {
			Prompt *string `json:"prompt"`
		}
		werr := json.Unmarshal([]byte(body), &want)
		got, ok := scanDetokenize([]byte(body))
		if !ok {
			continue // declined: encoding/json decides
		}
		if werr != nil || want.Prompt == nil || *want.Prompt != got {
			t.Errorf("%q: fast %q, encoding/json %v %v", body, got, want.Prompt, werr)
		}
	}
	// What a model's output looks like on the wire: taken, not declined.
	for body, want := range map[string]string{
		`{"prompt":"ok"}`: "ok",
		`{"prompt":"<think>\nx\n</think>\n\n<tool_call>\n{\"name\": \"f\"}\n</tool_call><|im_end|>"}`: "<think>\nx\n</think>\n\n<tool_call>\n{\"name\": \"f\"}\n</tool_call><|im_end|>",
		`{"prompt":"\u003cb\u003e caf\u00e9 \ud83d\ude00"}`:                                           "<b> caf\u00e9 \U0001F600",
	} {
		if got, ok := scanDetokenize([]byte(body)); !ok || got != want {
			t.Errorf("%s: fast reader gave %q, %v; want %q", body, got, ok, want)
		}
	}
}

// FuzzCheckUsage: the usage check reads every value as its encoding/json
// path does — the same error or none, the same counts — whether or not the
// fast reader takes it: what scanUsage accepts, usageJSON reads alike.
func FuzzCheckUsage(f *testing.F) {
	for _, s := range []string{
		`{"prompt_tokens":4000,"total_tokens":4148,"completion_tokens":148,"prompt_tokens_details":null}`,
		`{}`, ` { "completion_tokens" : 148 } `, `{"completion_tokens":null}`, `{"completion_tokens":5,"completion_tokens":null}`,
		`{"completion_tokens":148,"prompt_tokens":null}`, `{"completion_tokens":148.0}`, `{"completion_tokens":1e2}`,
		`{"completion_tokens":"148"}`, `{"completion_tokens":-148}`, `{"completion_tokens":0148}`, `{"completion_tokens":148x}`,
		`{"completion_tokens":nul}`, `{"completion_tokens":nullx}`, `{"Completion_Tokens":148}`, `{"completion\u005ftokens":148}`,
		`{"completion_tokens":148,"prompt_tokens_details":{"cached_tokens":64}}`, `{"completion_tokens":148,"prompt_tokens_details":{"Cached_Tokens":64}}`,
		`{"completion_tokens":148,"x":"\u00e9"}`, "{\"completion_tokens\":148,\"k\x01\":1}", "{\"completion_tokens\":148,\"\xff\":1}",
		`[148]`, `148`, `{"completion_tokens":148`, `{"completion_tokens":148}}`, `{"completion_tokens":123456789012345678901}`,
	} {
		f.Add(s, 148)
	}
	if u, ok := scanUsage([]byte(`{"prompt_tokens":4000,"total_tokens":4148,"completion_tokens":148,"prompt_tokens_details":null}`)); !ok || u.completion != 148 || u.prompt != 4000 {
		f.Fatalf("vLLM's usage object not read by the fast reader: %+v %v", u, ok)
	}
	f.Fuzz(func(t *testing.T, raw string, n int) {
		var g Generation
		errCheck := checkUsage("generate", json.RawMessage(raw), n, &g)
		fast, ok := scanUsage([]byte(raw))
		if !ok {
			return
		}
		slow, err := usageJSON("generate", json.RawMessage(raw))
		if err != nil {
			t.Fatalf("%q: the fast reader took it, encoding/json refuses it: %v", raw, err)
		}
		if fast != slow {
			t.Fatalf("%q: fast reader %+v, encoding/json %+v", raw, fast, slow)
		}
		if mismatch := fast.fields && fast.completion != n; (errCheck != nil) != mismatch {
			t.Fatalf("%q n=%d: checkUsage says %v", raw, n, errCheck)
		}
	})
}
