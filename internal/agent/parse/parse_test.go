package parse

import (
	"encoding/json"
	"reflect"
	"strings"
	"testing"
)

func TestReasoning(t *testing.T) {
	cases := []struct {
		name, in           string
		opts               []ReasoningOption
		reasoning, content string
	}{
		// docs/adapter.md §8 case 31
		{name: "both tags", in: "<think>reason here</think>visible", reasoning: "reason here", content: "visible"},
		{name: "prompt opened think", in: "r</think>\n\nv", reasoning: "r", content: "\n\nv"},
		{name: "no tags is truncated thinking", in: "only thoughts", reasoning: "only thoughts"},
		{name: "implicit end at tool_call+function", in: "plan <tool_call>\n<function=read>\n<parameter=p>\na\n</parameter>\n</function>\n</tool_call>",
			reasoning: "plan ", content: "<tool_call>\n<function=read>\n<parameter=p>\na\n</parameter>\n</function>\n</tool_call>"},
		// docs/adapter.md §6.1 details
		{name: "function then whitespace", in: "x<tool_call>  <function name=\"a\">", reasoning: "x", content: "<tool_call>  <function name=\"a\">"},
		{name: "bare tool_call mention stays reasoning", in: "I could use <tool_call> here", reasoning: "I could use <tool_call> here"},
		{name: "only the first tool_call is checked", in: "a <tool_call> b <tool_call>\n<function=f>", reasoning: "a <tool_call> b <tool_call>\n<function=f>"},
		{name: "function prefix alone", in: "a<tool_call><function", reasoning: "a<tool_call><function"},
		{name: "tool_call at start", in: "<tool_call><function=f>", content: "<tool_call><function=f>"},
		{name: "text before think is dropped", in: "pre<think>r</think>c", reasoning: "r", content: "c"},
		{name: "only first think stripped", in: "<think>a<think>b</think>c", reasoning: "a<think>b", content: "c"},
		{name: "think without close", in: "<think>x", reasoning: "x"},
		{name: "first close splits", in: "a</think>b</think>c", reasoning: "a", content: "b</think>c"},
		{name: "empty reasoning fallback splits content", in: "</think>a</think>b", reasoning: "a", content: "b"},
		{name: "empty reasoning no second close", in: "</think>only", content: "only"},
		{name: "empty output", in: ""},
		{name: "thinking disabled no close", in: "no tags", opts: []ReasoningOption{ThinkingDisabled()}, content: "no tags"},
		{name: "thinking disabled with close", in: "r</think>c", opts: []ReasoningOption{ThinkingDisabled()}, reasoning: "r", content: "c"},
		{name: "thinking disabled tool_call", in: "a<tool_call>\n<function=f>", opts: []ReasoningOption{ThinkingDisabled()}, content: "a<tool_call>\n<function=f>"},
	}
	for _, c := range cases {
		t.Run(c.name, func(t *testing.T) {
			r, b := Reasoning(c.in, c.opts...)
			if r != c.reasoning || b != c.content {
				t.Fatalf("Reasoning(%q) = (%q, %q), want (%q, %q)", c.in, r, b, c.reasoning, c.content)
			}
		})
	}
}

func tool(name, params string) Tool {
	return Tool{Name: name, Parameters: json.RawMessage(params)}
}

var (
	lookupTool = tool("lookup", `{"type":"object","properties":{"q":{"type":"string"}}}`)
	calcTool   = tool("calc", `{"type":"object","properties":{"n":{"type":"integer"},"f":{"type":"boolean"},"o":{"type":"object"},"s":{"type":"string"}}}`)
	grepTool   = tool("grep", `{"type":"object","properties":{"pattern":{"type":"string"}}}`)
	writeTool  = tool("write", `{"type":"object","properties":{"path":{"type":"string"},"content":{"type":"string"}}}`)
	readTool   = tool("read", `{"type":"object","properties":{"path":{"type":"string"}}}`)
	typedTool  = tool("typed", `{"type":"object","properties":{
		"i":{"type":"integer"},"u":{"type":"uint32"},"num":{"type":"number"},"fl":{"type":"float"},
		"b":{"type":"boolean"},"o":{"type":"object"},"a":{"type":"array"},"d":{"type":"dict"},
		"s":{"type":"string"},"ns":{"anyOf":[{"type":"string"},{"type":"null"}]},
		"ni":{"anyOf":[{"type":"null"},{"type":"integer"}]},"tl":{"type":["integer","null"]},
		"x":{"type":"tuple"},"e":{"enum":["a","b"]},"T":{"type":" Integer "}}}`)
)

type tc struct {
	name    string
	in      string
	tools   []Tool
	format  Format
	content string
	calls   []string // "name ARGS"
	ill     bool
}

func runToolCases(t *testing.T, cases []tc) {
	t.Helper()
	for _, c := range cases {
		t.Run(c.name, func(t *testing.T) {
			r := ToolCalls(c.in, c.tools, c.format)
			var got []string
			for _, call := range r.Calls {
				got = append(got, call.Name+" "+string(call.Arguments))
				if !json.Valid(call.Arguments) || call.Arguments[0] != '{' {
					t.Errorf("arguments not a JSON object: %s", call.Arguments)
				}
			}
			if r.Content != c.content || !reflect.DeepEqual(got, c.calls) || r.IllFormed != c.ill {
				t.Fatalf("ToolCalls(%q, %v)\n got content=%q calls=%q ill=%v\nwant content=%q calls=%q ill=%v",
					c.in, c.format, r.Content, got, r.IllFormed, c.content, c.calls, c.ill)
			}
		})
	}
}

func TestToolCallsNoToolsOrFallback(t *testing.T) {
	xml := "lead <tool_call><function=lookup><parameter=q>vime</parameter></function></tool_call> tail"
	runToolCases(t, []tc{
		// row 30
		{name: "no parsers plain text", in: "just text", content: "just text"},
		// row 36
		{name: "no tools leaves markup", in: " a <tool_call>\n<function=lookup>\n<parameter=q>\nx\n</parameter>\n</function>\n</tool_call> ", format: Qwen3CoderXML,
			content: "a <tool_call>\n<function=lookup>\n<parameter=q>\nx\n</parameter>\n</function>\n</tool_call>"},
		{name: "no tools hermes", in: `<tool_call>{"name":"lookup","arguments":{}}</tool_call>`, format: HermesJSON,
			content: `<tool_call>{"name":"lookup","arguments":{}}</tool_call>`},
		// row 32
		{name: "xml fallback", in: xml, tools: []Tool{lookupTool}, content: "lead  tail", calls: []string{`lookup {"q":"vime"}`}},
		{name: "xml fallback unknown name", in: strings.Replace(xml, "=lookup", "=unknown", 1), tools: []Tool{lookupTool},
			content: strings.Replace(xml, "=lookup", "=unknown", 1)},
		{name: "xml fallback strings only, trimmed, dup keys", tools: []Tool{calcTool},
			in:    "<tool_call>\n <function=calc>\n<parameter=n>\n 5 \n</parameter><parameter=s>a</parameter><parameter=n>6</parameter></function>\n</tool_call>",
			calls: []string{`calc {"n":"6","s":"a"}`}},
		{name: "xml fallback keeps unknown, cuts known", tools: []Tool{lookupTool},
			in:      "<tool_call><function=other></function></tool_call>x<tool_call><function=lookup></function> </tool_call>y",
			content: "<tool_call><function=other></function></tool_call>xy", calls: []string{`lookup {}`}},
		{name: "xml fallback needs closing tags", tools: []Tool{lookupTool},
			in: "<tool_call><function=lookup><parameter=q>v</parameter>", content: "<tool_call><function=lookup><parameter=q>v</parameter>"},
		{name: "xml fallback lazy body spans a broken block", tools: []Tool{lookupTool, readTool},
			in:    "<tool_call><function=lookup><parameter=q>a</parameter></tool_call><tool_call><function=read><parameter=path>p</parameter></function></tool_call>",
			calls: []string{`lookup {"q":"a","path":"p"}`}},
		{name: "hermes config falls back to xml", format: HermesJSON, tools: []Tool{lookupTool}, in: xml,
			content: "lead  tail", calls: []string{`lookup {"q":"vime"}`}},
	})
}

func TestQwen3Coder(t *testing.T) {
	call := func(fn string, params ...string) string {
		var b strings.Builder
		b.WriteString("<tool_call>\n<function=" + fn + ">\n")
		for i := 0; i+1 < len(params); i += 2 {
			b.WriteString("<parameter=" + params[i] + ">\n" + params[i+1] + "\n</parameter>\n")
		}
		b.WriteString("</function>\n</tool_call>")
		return b.String()
	}
	typed := func(p, v string) string { return call("typed", p, v) }
	q := func(name, in string, content string, calls ...string) tc {
		return tc{name: name, in: in, tools: []Tool{typedTool, calcTool, lookupTool, readTool, writeTool}, format: Qwen3CoderXML, content: content, calls: calls}
	}
	runToolCases(t, []tc{
		// row 33
		{name: "row 33", format: Qwen3CoderXML, tools: []Tool{calcTool},
			in: "Intro\n<tool_call>\n<function=calc>\n<parameter=n>\n\n5\n\n</parameter>\n<parameter=f>\ntrue\n</parameter>\n<parameter=o>\n{\"a\":1}\n</parameter>\n<parameter=s>\nkeep\n</parameter>\n</function>\n</tool_call>\n" +
				call("calc", "n", "7"),
			content: "Intro",
			calls:   []string{`calc {"n":5,"f":true,"o":{"a":1},"s":"keep"}`, `calc {"n":7}`}},
		// type conversion rules
		q("int", typed("i", "42"), "", `typed {"i":42}`),
		q("int python spellings", typed("i", " +0_07 "), "", `typed {"i":7}`),
		q("int negative zero", typed("i", "-000"), "", `typed {"i":0}`),
		q("int not a number stays string", typed("i", "4.5"), "", `typed {"i":"4.5"}`),
		q("uint", typed("u", "-3"), "", `typed {"u":-3}`),
		q("type is trimmed and lowered", typed("T", "8"), "", `typed {"T":8}`),
		q("number integral becomes int", typed("num", "5.0"), "", `typed {"num":5}`),
		q("number exponent integral", typed("num", "1e3"), "", `typed {"num":1000}`),
		q("number fraction", typed("num", "0.1"), "", `typed {"num":0.1}`),
		q("number small uses python repr", typed("fl", "-1.5e-7"), "", `typed {"fl":-1.5e-07}`),
		q("number large integral", typed("num", "1e20"), "", `typed {"num":100000000000000000000}`),
		q("number bad stays string", typed("num", "abc"), "", `typed {"num":"abc"}`),
		q("number inf stays string", typed("num", "inf"), "", `typed {"num":"inf"}`),
		q("bool True", typed("b", "True"), "", `typed {"b":true}`),
		q("bool other is false", typed("b", "yes"), "", `typed {"b":false}`),
		q("object json", typed("o", `{"z":1,"a":[true,null],"h":"<&>"}`), "", `typed {"o":{"z":1,"a":[true,null],"h":"<&>"}}`),
		q("object python literal", typed("o", `{'k': 'v', 'n': None, 't': (1, 2.50)}`), "", `typed {"o":{"k":"v","n":null,"t":[1,2.5]}}`),
		q("object json-encoded python repr", typed("o", `"{'k': 'v'}"`), "", `typed {"o":{"k":"v"}}`),
		q("object unparseable stays string", typed("o", `{not json`), "", `typed {"o":"{not json"}`),
		q("object non-container json kept", typed("o", `5`), "", `typed {"o":5}`),
		q("array json", typed("a", `[1, "two"]`), "", `typed {"a":[1,"two"]}`),
		q("array python", typed("a", `['x', True]`), "", `typed {"a":["x",true]}`),
		q("dict prefix type", typed("d", `{"a": 1}`), "", `typed {"d":{"a":1}}`),
		q("string keeps null word", typed("s", "null"), "", `typed {"s":"null"}`),
		q("string keeps whitespace", typed("s", "  a\n"), "", `typed {"s":"  a\n"}`),
		q("nullable string null", typed("ns", "None"), "", `typed {"ns":null}`),
		q("nullable string value", typed("ns", "x"), "", `typed {"ns":"x"}`),
		q("anyOf picks first non-null", typed("ni", "3"), "", `typed {"ni":3}`),
		q("type list read like anyOf", typed("tl", "NULL"), "", `typed {"tl":null}`),
		q("non-string null word", typed("i", "none"), "", `typed {"i":null}`),
		q("other type literal", typed("x", "(1, 'a')"), "", `typed {"x":[1,"a"]}`),
		q("other type literal fails to string", typed("x", "hello world"), "", `typed {"x":"hello world"}`),
		q("no type is string", typed("e", "5"), "", `typed {"e":"5"}`),
		q("unknown param is string", typed("zzz", "5"), "", `typed {"zzz":"5"}`),
		q("unknown tool all strings, name not filtered", call("nosuch", "i", "5"), "", `nosuch {"i":"5"}`),
		// structure
		q("one newline trimmed each side", typed("s", "\nx\n"), "", `typed {"s":"\nx\n"}`),
		q("param order kept, dup param last value first place", call("typed", "s", "1", "i", "2", "s", "3"), "", `typed {"s":"3","i":2}`),
		q("two calls and text between dropped", "a "+call("read", "path", "x")+" mid "+call("read", "path", "y")+" end",
			"a", `read {"path":"x"}`),
		q("literal close tag inside value", "t\n<tool_call>\n<function=write>\n<parameter=content>\nx</tool_call>y\n</parameter>\n</function>\n</tool_call>",
			"t", `write {"content":"x</tool_call>y"}`),
		q("literal function close inside value", "<tool_call>\n<function=write>\n<parameter=content>\na</function>\n</tool_call>b\n</parameter>\n<parameter=path>\np\n</parameter>\n</function>\n</tool_call>",
			"", `write {"content":"a</function>\n</tool_call>b","path":"p"}`),
		q("literal parameter close inside value", "<tool_call>\n<function=write>\n<parameter=content>\na</parameter>b\n</parameter>\n</function>\n</tool_call>",
			"", `write {"content":"a</parameter>b"}`),
		q("nested literal parameter", "<tool_call>\n<function=write>\n<parameter=content>\n<parameter=q>\nv\n</parameter>\n</parameter>\n<parameter=path>\np\n</parameter>\n</function>\n</tool_call>",
			"", `write {"content":"<parameter=q>\nv\n</parameter>","path":"p"}`),
		q("missing parameter close", "<tool_call>\n<function=write>\n<parameter=path>\np\n<parameter=content>\nc\n</parameter>\n</function>\n</tool_call>",
			"", `write {"path":"p","content":"c"}`),
		q("unclosed call runs to end", "x <tool_call>\n<function=read>\n<parameter=path>\np", "x", `read {"path":"p"}`),
		q("unclosed param ends at function", "<tool_call>\n<function=read>\n<parameter=path>\np\n</function>\n</tool_call>", "", `read {"path":"p"}`),
		q("no tool_call tag: whole text", "before <function=read>\n<parameter=path>\np\n</parameter>\n</function>", "before", `read {"path":"p"}`),
		q("content anchored at first tool_call holding a function",
			"say <tool_call>hi</tool_call> more\n"+call("read", "path", "p"), "say <tool_call>hi</tool_call> more", `read {"path":"p"}`),
		q("no parameters", "<tool_call>\n<function=read>\n</function>\n</tool_call>", "", `read {}`),
		q("parameter not at line start is text", "<tool_call>\n<function=read> <parameter=path>p</parameter>\n</function>\n</tool_call>", "", `read {}`),
		q("end token after call not in content", call("read", "path", "p")+"<|im_end|>", "", `read {"path":"p"}`),
		{name: "jinja name rejected, text kept", format: Qwen3CoderXML, tools: []Tool{readTool},
			in: "<tool_call>\n<function={{ tc.name }}>\n</function>\n</tool_call>", content: "<tool_call>\n<function={{ tc.name }}>\n</function>\n</tool_call>"},
		{name: "name with space rejected", format: Qwen3CoderXML, tools: []Tool{readTool},
			in: "<tool_call><function=read x></function></tool_call>", content: "<tool_call><function=read x></function></tool_call>"},
		{name: "no function at all", format: Qwen3CoderXML, tools: []Tool{readTool}, in: " plain <tool_call> ", content: "plain <tool_call>"},
		// recovery paths shared with hermes (docs/adapter.md §6.2 lenient recovery)
		{name: "hermes json under qwen3_coder is recovered", format: Qwen3CoderXML, tools: []Tool{grepTool},
			in:      "look <tool_call>\n{\"name\": \"grep\", \"arguments\": {\"pattern\": \"\\d+\"}}\n</tool_call> done",
			content: "look  done", calls: []string{`grep {"pattern":"\\d+"}`}, ill: true},
		{name: "recovery drops unknown names", format: Qwen3CoderXML, tools: []Tool{grepTool},
			in:      `<tool_call>{"name": "nope", "arguments": {}}</tool_call>`,
			content: `<tool_call>{"name": "nope", "arguments": {}}</tool_call>`},
		{name: "recovery removes every json block", format: Qwen3CoderXML, tools: []Tool{grepTool},
			in:      `a<tool_call>{"name":"nope"}</tool_call>b<tool_call>{"name":"grep","arguments":"{\"pattern\":\"x\"}"}</tool_call>c<tool_call>{bad}</tool_call>d`,
			content: "abcd", calls: []string{`grep {"pattern":"x"}`}, ill: true},
	})
}

func TestHermes(t *testing.T) {
	h := func(name, in, content string, ill bool, calls ...string) tc {
		return tc{name: name, in: in, tools: []Tool{grepTool, writeTool}, format: HermesJSON, content: content, calls: calls, ill: ill}
	}
	runToolCases(t, []tc{
		// row 34
		h("invalid escape repaired", `<tool_call>{"name":"grep","arguments":{"pattern":"\d+"}}</tool_call>`, "", false, `grep {"pattern":"\\d+"}`),
		h("raw newline in string", "<tool_call>{\"name\":\"write\",\"arguments\":{\"path\":\"a.py\",\"content\":\"line1\nline2\"}}</tool_call>", "", false,
			`write {"path":"a.py","content":"line1\nline2"}`),
		// issue: \u without four hex digits is an invalid escape too
		h("bad unicode escape repaired", `<tool_call>{"name":"write","arguments":{"path":"C:\users\x","content":"\u00e9\u12"}}</tool_call>`, "", false,
			`write {"path":"C:\\users\\x","content":"é\\u12"}`),
		h("valid escapes untouched", `<tool_call>{"name":"write","arguments":{"content":"a\tb\"c\/\u0041\ud83d\ude00"}}</tool_call>`, "", false,
			`write {"content":"a\tb\"c/A😀"}`),
		h("repair judges each backslash alone", `<tool_call>{"name":"grep","arguments":{"pattern":"\\d \s"}}</tool_call>`,
			`<tool_call>{"name":"grep","arguments":{"pattern":"\\d \s"}}</tool_call>`, false),
		// row 35
		h("unrecoverable json stays text", `pre <tool_call>{"name": "grep", "arguments": {"pattern": }}</tool_call>`,
			`pre <tool_call>{"name": "grep", "arguments": {"pattern": }}</tool_call>`, false),
		h("name not in schema is still a call", `<tool_call>{"name":"other","arguments":{"a":1}}</tool_call>`, "", false, `other {"a":1}`),
		// hermes details
		h("content is text before first call", "Sure.\n<tool_call>\n{\"name\": \"grep\", \"arguments\": {\"pattern\": \"a\"}}\n</tool_call>\ntrailing", "Sure.", false,
			`grep {"pattern":"a"}`),
		h("two calls, key order and no html escaping", `<tool_call>{"name":"write","arguments":{"z":"<b>&amp;</b>","a":1.50}}</tool_call><tool_call>{"arguments":{},"name":"grep"}</tool_call>`,
			"", false, `write {"z":"<b>&amp;</b>","a":1.50}`, `grep {}`),
		h("arguments as json string", `<tool_call>{"name":"grep","arguments":"{\"pattern\": \"x\"}"}</tool_call>`, "", false, `grep {"pattern":"x"}`),
		h("arguments string not json", `<tool_call>{"name":"grep","arguments":"x"}</tool_call>`, "", true, `grep {"_raw_arguments":"x"}`),
		h("arguments array wrapped", `<tool_call>{"name":"grep","arguments":[1,2]}</tool_call>`, "", true, `grep {"_raw_arguments":[1,2]}`),
		h("arguments null wrapped", `<tool_call>{"name":"grep","arguments":null}</tool_call>`, "", true, `grep {"_raw_arguments":null}`),
		h("empty name becomes tool", `<tool_call>{"name":"","arguments":{}}</tool_call>`, "", false, `tool {}`),
		h("unterminated block parsed strictly", `go <tool_call> {"name":"grep","arguments":{"pattern":"x"}}<|im_end|>`,
			`go <tool_call> {"name":"grep","arguments":{"pattern":"x"}}<|im_end|>`, false),
		h("unterminated block", "go <tool_call> {\"name\":\"grep\",\"arguments\":{\"pattern\":\"x\"}}\n", "go", false, `grep {"pattern":"x"}`),
		h("unterminated block is not repaired", `<tool_call>{"name":"grep","arguments":{"pattern":"\d"}}`, `<tool_call>{"name":"grep","arguments":{"pattern":"\d"}}`, false),
		h("missing arguments fails hermes, recovery fills {}", `<tool_call>{"name":"grep"}</tool_call>`, "", true, `grep {}`),
		h("one bad block fails hermes, recovery keeps good", `<tool_call>{"name":"grep","arguments":{}}</tool_call> <tool_call>{"name":"write","arguments":{</tool_call>`,
			`<tool_call>{"name":"write","arguments":{</tool_call>`, true, `grep {}`),
		h("non-string name fails", `<tool_call>{"name":5,"arguments":{}}</tool_call>`, `<tool_call>{"name":5,"arguments":{}}</tool_call>`, false),
		h("NaN is not JSON", `<tool_call>{"name":"grep","arguments":{"x":NaN}}</tool_call>`, `<tool_call>{"name":"grep","arguments":{"x":NaN}}</tool_call>`, false),
		h("trailing comma fails", `<tool_call>{"name":"grep","arguments":{},}</tool_call>`, `<tool_call>{"name":"grep","arguments":{},}</tool_call>`, false),
		h("duplicate keys: first place, last value", `<tool_call>{"name":"grep","arguments":{"a":1,"b":2,"a":3}}</tool_call>`, "", false, `grep {"a":3,"b":2}`),
		h("array body fails", `<tool_call>[{"name":"grep","arguments":{}}]</tool_call>`, `<tool_call>[{"name":"grep","arguments":{}}]</tool_call>`, false),
		h("empty block fails", `x<tool_call></tool_call>`, `x<tool_call></tool_call>`, false),
		h("no tool_call", "plain answer", "plain answer", false),
		h("qwen xml under hermes uses fallback", "<tool_call>\n<function=grep>\n<parameter=pattern>\nx\n</parameter>\n</function>\n</tool_call>", "", false, `grep {"pattern":"x"}`),
	})
}

func TestParse(t *testing.T) {
	cases := []struct {
		name string
		raw  string
		o    Options
		want Output
	}{
		{name: "row 30 no parsers", raw: "just text", want: Output{Text: "just text"}},
		{name: "row 31 visible", raw: "<think>reason here</think>visible", o: Options{Qwen3Reasoning: true},
			want: Output{Reasoning: "reason here", Text: "visible"}},
		{name: "reasoning not trimmed, text trimmed", raw: "\nr\n</think>\n\nv\n", o: Options{Qwen3Reasoning: true},
			want: Output{Reasoning: "\nr\n", Text: "v"}},
		{name: "all reasoning", raw: "thinking...", o: Options{Qwen3Reasoning: true, Tools: []Tool{readTool}, ToolFormat: Qwen3CoderXML},
			want: Output{Reasoning: "thinking..."}},
		{name: "no reasoning parser keeps tags in text", raw: "<think>a</think>b", want: Output{Text: "<think>a</think>b"}},
		{name: "implicit reasoning end then call", raw: "plan <tool_call>\n<function=read>\n<parameter=path>\na\n</parameter>\n</function>\n</tool_call><|im_end|>",
			o:    Options{Qwen3Reasoning: true, Tools: []Tool{readTool}, ToolFormat: Qwen3CoderXML},
			want: Output{Reasoning: "plan ", Calls: []Call{{Name: "read", Arguments: json.RawMessage(`{"path":"a"}`)}}}},
		{name: "trailing special kept by default (reference)", raw: "r</think>done<|im_end|>", o: Options{Qwen3Reasoning: true},
			want: Output{Reasoning: "r", Text: "done<|im_end|>"}},
		{name: "trailing specials stripped when asked", raw: "r</think>done <|im_end|>\n<|endoftext|>", o: Options{Qwen3Reasoning: true, TrailingSpecials: QwenEndTokens()},
			want: Output{Reasoning: "r", Text: "done"}},
	}
	for _, c := range cases {
		t.Run(c.name, func(t *testing.T) {
			got := Parse(c.raw, c.o)
			if !reflect.DeepEqual(got, c.want) {
				t.Fatalf("Parse(%q)\n got %+v\nwant %+v", c.raw, got, c.want)
			}
		})
	}
}

func TestParseFormat(t *testing.T) {
	for _, f := range []Format{FallbackOnly, Qwen3CoderXML, HermesJSON} {
		if g, ok := ParseFormat(f.String()); !ok || g != f {
			t.Errorf("round trip %v", f)
		}
	}
	if _, ok := ParseFormat("mistral"); ok {
		t.Error("unknown parser accepted")
	}
}

func TestParamTypes(t *testing.T) {
	got := typedTool.ParamTypes()
	want := map[string]ParamType{
		"i": {Type: "integer"}, "ns": {Type: "string", Nullable: true}, "ni": {Type: "integer", Nullable: true},
		"tl": {Type: "integer", Nullable: true}, "e": {Type: "string"}, "T": {Type: "integer"},
	}
	for k, w := range want {
		if got[k] != w {
			t.Errorf("%s: got %+v want %+v", k, got[k], w)
		}
	}
	if n := len(tool("x", `not json`).ParamTypes()); n != 0 {
		t.Errorf("bad schema gave %d params", n)
	}
}
