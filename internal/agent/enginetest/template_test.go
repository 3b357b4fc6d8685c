package enginetest

import (
	"flag"
	"os"
	"path/filepath"
	"strings"
	"testing"
)

var update = flag.Bool("update", false, "rewrite testdata golden files")

const goldenTools = `[{"type":"function","function":{"name":"read_file","description":"Read a file & show <it>","parameters":{"type":"object","properties":{"path":{"type":"string"},"limit":{"type":"integer"}},"required":["path"]}}},{"function":{"name":"bash","parameters":{"type":"object","properties":{"cmd":{"type":"string"}}}}}]`

var goldenCases = []struct {
	name     string
	tmpl     ChatTemplate
	messages string
	tools    string
	opts     RenderOptions
}{
	{"simple", ChatTemplate{}, `[{"role":"system","content":"You are terse."},{"role":"user","content":"Hi"}]`, "", RenderOptions{AddGenerationPrompt: true}},
	{"no_thinking", ChatTemplate{}, `[{"role":"user","content":[{"type":"text","text":"a"},{"type":"text","text":"b"}]}]`, "", RenderOptions{AddGenerationPrompt: true, Kwargs: map[string]any{"enable_thinking": false}}},
	{"reasoning_dropped_before_last_query", ChatTemplate{}, `[{"role":"user","content":"q1"},{"role":"assistant","content":"a1","reasoning_content":"r1"},{"role":"user","content":"q2"},{"role":"assistant","content":"a2","reasoning_content":"\nr2\n"}]`, "", RenderOptions{}},
	{"think_in_content", ChatTemplate{}, `[{"role":"user","content":"q"},{"role":"assistant","content":"<think>\nplan\n</think>\n\nanswer"}]`, "", RenderOptions{}},
	{"tools_hermes", ChatTemplate{}, `[{"role":"system","content":"sys"},{"role":"user","content":"Read it"},{"role":"assistant","content":"","reasoning_content":"need files","tool_calls":[{"id":"c1","type":"function","function":{"name":"read_file","arguments":"{\"path\": \"a.go\", \"limit\": 1.0}"}},{"type":"function","function":{"name":"bash","arguments":{"cmd":"ls <dir> && echo é"}}}]},{"role":"tool","content":"package a"},{"role":"tool","content":"a.go"},{"role":"assistant","content":"Done.","reasoning":"all read"}]`, goldenTools, RenderOptions{}},
	{"tools_xml", ChatTemplate{ToolCallStyle: Qwen3CoderXML}, `[{"role":"user","content":"Read it"},{"role":"assistant","content":"Reading.","tool_calls":[{"type":"function","function":{"name":"read_file","arguments":{"path":"a.go","limit":5,"opts":{"x":[1,true,null]},"flag":true}}}]},{"role":"tool","content":"package a"}]`, goldenTools, RenderOptions{AddGenerationPrompt: true}},
	{"continue_final", ChatTemplate{}, `[{"role":"user","content":"q"},{"role":"assistant","content":"partial ans"}]`, "", RenderOptions{ContinueFinalMessage: true}},
	{"open_think_prompt", ChatTemplate{OpenThinkInGenerationPrompt: true}, `[{"role":"user","content":"Read the files."},{"role":"assistant","content":"Reading."},{"role":"tool","content":"file contents"}]`, "", RenderOptions{AddGenerationPrompt: true}},
}

func TestTemplateGoldens(t *testing.T) {
	for _, c := range goldenCases {
		t.Run(c.name, func(t *testing.T) {
			got, err := c.tmpl.Render([]byte(c.messages), []byte(c.tools), c.opts)
			if err != nil {
				t.Fatal(err)
			}
			path := filepath.Join("testdata", c.name+".golden")
			if *update {
				if err := os.WriteFile(path, []byte(got), 0o644); err != nil {
					t.Fatal(err)
				}
				return
			}
			want, err := os.ReadFile(path)
			if err != nil {
				t.Fatalf("%v (run with -update)", err)
			}
			if got != string(want) {
				t.Errorf("rendering differs from %s:\n--- got\n%s\n--- want\n%s", path, got, want)
			}
			if Decode(Encode(got)) != got {
				t.Errorf("tokenizer round trip changed the rendering")
			}
		})
	}
}

// Properties the goldens must show, checked independently of the files.
func TestTemplateQwen3Semantics(t *testing.T) {
	render := func(tm ChatTemplate, msgs, tools string, o RenderOptions) string {
		t.Helper()
		s, err := tm.Render([]byte(msgs), []byte(tools), o)
		if err != nil {
			t.Fatal(err)
		}
		return s
	}
	s := render(ChatTemplate{}, goldenCases[2].messages, "", RenderOptions{})
	if strings.Contains(s, "r1") || !strings.Contains(s, "<|im_start|>assistant\n<think>\nr2\n</think>\n\na2<|im_end|>\n") {
		t.Errorf("reasoning handling:\n%s", s)
	}
	s = render(ChatTemplate{}, `[{"role":"user","content":"q"}]`, "", RenderOptions{AddGenerationPrompt: true})
	if s != "<|im_start|>user\nq<|im_end|>\n<|im_start|>assistant\n" {
		t.Errorf("generation prompt: %q", s)
	}
	s = render(ChatTemplate{}, `[{"role":"user","content":"q"}]`, "", RenderOptions{AddGenerationPrompt: true, Kwargs: map[string]any{"enable_thinking": false}})
	if !strings.HasSuffix(s, "<|im_start|>assistant\n<think>\n\n</think>\n\n") {
		t.Errorf("enable_thinking false: %q", s)
	}
	s = render(ChatTemplate{}, goldenCases[4].messages, goldenTools, RenderOptions{})
	for _, want := range []string{
		`{"type": "function", "function": {"name": "read_file", "description": "Read a file & show <it>", "parameters": {"type": "object", "properties": {"path": {"type": "string"}, "limit": {"type": "integer"}}, "required": ["path"]}}}`,
		`{"type": "function", "function": {"name": "bash", "description": null, "parameters": {"type": "object", "properties": {"cmd": {"type": "string"}}}}}`,
		"<|im_start|>assistant\n<think>\nneed files\n</think>\n\n<tool_call>\n{\"name\": \"read_file\", \"arguments\": {\"path\": \"a.go\", \"limit\": 1.0}}\n</tool_call>\n<tool_call>\n{\"name\": \"bash\", \"arguments\": {\"cmd\": \"ls <dir> && echo é\"}}\n</tool_call><|im_end|>\n",
		"<|im_start|>user\n<tool_response>\npackage a\n</tool_response>\n<tool_response>\na.go\n</tool_response><|im_end|>\n",
		"<|im_start|>assistant\n<think>\nall read\n</think>\n\nDone.<|im_end|>\n",
		"<|im_start|>system\nsys\n\n# Tools\n",
	} {
		if !strings.Contains(s, want) {
			t.Errorf("hermes render lacks %q:\n%s", want, s)
		}
	}
	s = render(ChatTemplate{ToolCallStyle: Qwen3CoderXML}, goldenCases[5].messages, goldenTools, RenderOptions{AddGenerationPrompt: true})
	if !strings.Contains(s, "Reading.\n<tool_call>\n<function=read_file>\n<parameter=path>\na.go\n</parameter>\n<parameter=limit>\n5\n</parameter>\n<parameter=opts>\n{\"x\": [1, true, null]}\n</parameter>\n<parameter=flag>\nTrue\n</parameter>\n</function>\n</tool_call><|im_end|>\n") {
		t.Errorf("xml render:\n%s", s)
	}
	if s := render(ChatTemplate{}, goldenCases[6].messages, "", goldenCases[6].opts); !strings.HasSuffix(s, "<think>\n\n</think>\n\npartial ans") {
		t.Errorf("continue_final_message: %q", s)
	}
	if _, err := (ChatTemplate{}).Render([]byte(`[{"role":"user","content":"q"}]`), nil, RenderOptions{AddGenerationPrompt: true, ContinueFinalMessage: true}); err == nil {
		t.Error("both flags accepted")
	}
	if _, err := (ChatTemplate{}).Render([]byte(`[{"role":"assistant","content":"","tool_calls":[{"function":{"name":"x","arguments":"{bad"}}]}]`), nil, RenderOptions{}); err == nil {
		t.Error("invalid arguments JSON accepted")
	}
}
