package enginetest

import (
	"encoding/json"
	"errors"
	"fmt"
	"strings"

	"github.com/kilnrl/kiln/internal/ojson"
)

// ToolCallStyle selects how assistant tool calls (and the tool-use
// instructions in the system prompt) are rendered.
type ToolCallStyle int

const (
	// HermesJSON is Qwen3's own format, parsed by vLLM's hermes tool parser:
	// <tool_call>\n{"name": "NAME", "arguments": {...}}\n</tool_call>.
	HermesJSON ToolCallStyle = iota
	// Qwen3CoderXML is the Qwen3-Coder / Qwen3.5 format, parsed by vLLM's
	// qwen3_coder tool parser: <tool_call>\n<function=NAME>\n<parameter=K>\n
	// VALUE\n</parameter>\n</function>\n</tool_call>.
	Qwen3CoderXML
)

// ChatTemplate is a Go rendering of Qwen3's ChatML chat template (the Jinja
// template shipped in Qwen3 checkpoints' tokenizer_config.json), applied to
// messages the way vLLM prepares them. Mirrored exactly:
//
//   - each turn is "<|im_start|>ROLE\n" + content + "<|im_end|>\n"; a
//     system message is rendered only as the first message or as a later
//     system turn; roles other than system/user/assistant/tool render nothing;
//   - with tools, the first turn is a system turn holding the first system
//     message's content + "\n\n" (if any), then "# Tools" instructions and
//     every tool as tojson on its own line inside <tools></tools>, in order;
//     tojson is Python's json.dumps(ensure_ascii=False): ", "/": " separators,
//     no HTML escaping, keys in the order given;
//   - assistant tool_calls: hermes JSON, each call preceded by "\n" unless it
//     is the first and the content is empty, arguments as tojson;
//   - tool messages become a user turn of "\n<tool_response>\n" + content +
//     "\n</tool_response>" blocks, consecutive tool messages sharing one turn;
//   - reasoning: the "last query" is the last user message whose content is a
//     string not wrapped in <tool_response>...</tool_response>; assistant
//     messages after it render "<think>\n" + reasoning.strip("\n") +
//     "\n</think>\n\n" + content.lstrip("\n") when they are the last message
//     or have non-empty reasoning; every other assistant message renders its
//     content only (earlier reasoning is dropped). reasoning_content (or
//     vLLM's alias reasoning) wins; without it, content holding </think> is
//     split into reasoning and content as the template does;
//   - add_generation_prompt appends "<|im_start|>assistant\n"; with
//     chat_template_kwargs enable_thinking == false it also appends
//     "<think>\n\n</think>\n\n".
//
// Mirrored from vLLM's preprocessing (docs/engine-wire.md §2.2): string tool-call
// arguments are JSON-decoded (empty → {}), an empty tool_calls list is
// dropped, content given as a list of text parts is joined with "\n"
// (--chat-template-content-format string), and tools are re-serialised as
// {"type", "function": {"name", "description", "parameters", extras...}}
// with missing description/parameters as null. continue_final_message cuts
// the rendering after the last occurrence of the final message's content,
// as transformers' apply_chat_template does.
//
// Not mirrored: the 2507 templates' "No user query found" exception, images,
// and any other checkpoint's template. Qwen3CoderXML keeps Qwen3's layout
// (JSON tool list, system content first) and changes only the call format
// and the instructions: it is Qwen3-Coder-like, not byte-identical to a
// published template. OpenThinkInGenerationPrompt (not Qwen3; Qwen3.5-like
// and the QT fixture of docs/adapter.md §8) appends "<think>\n" to the generation
// prompt when thinking is enabled.
type ChatTemplate struct {
	ToolCallStyle               ToolCallStyle
	OpenThinkInGenerationPrompt bool
}

// RenderOptions are the per-request template inputs.
type RenderOptions struct {
	AddGenerationPrompt  bool
	ContinueFinalMessage bool
	// Kwargs is chat_template_kwargs; only enable_thinking is read.
	Kwargs map[string]any
}

type tmplCall struct {
	name string
	args any
}

type tmplMessage struct {
	role      string
	content   string
	isString  bool // content was a string (or text parts), not null
	reasoning *string
	calls     []tmplCall
}

// Render renders messages (a JSON array of OpenAI chat messages) and tools
// (a JSON array of {type:"function", function:{...}}, or empty/null) to the
// prompt text. Errors correspond to vLLM's 400s.
func (t ChatTemplate) Render(messages, tools []byte, o RenderOptions) (string, error) {
	if o.AddGenerationPrompt && o.ContinueFinalMessage {
		// vLLM's own message, word for word, as a test engine must answer.
		return "", errors.New("Cannot set both `continue_final_message` and `add_generation_prompt` to True.")
	}
	msgs, err := parseMessages(messages)
	if err != nil {
		return "", err
	}
	toolList, err := parseTools(tools)
	if err != nil {
		return "", err
	}
	out, err := t.render(msgs, toolList, o)
	if err != nil {
		return "", err
	}
	if o.ContinueFinalMessage && len(msgs) > 0 {
		final := msgs[len(msgs)-1].content
		if i := strings.LastIndex(out, final); i >= 0 {
			out = out[:i+len(final)]
		} else if s := strings.TrimSpace(final); strings.Contains(out, s) {
			out = out[:strings.LastIndex(out, s)+len(s)]
		} else {
			return "", errors.New("continue_final_message is set but the final message does not appear in the chat after applying the chat template!")
		}
	}
	return out, nil
}

func (t ChatTemplate) render(msgs []tmplMessage, tools []any, o RenderOptions) (string, error) {
	var b strings.Builder
	if len(tools) > 0 {
		b.WriteString("<|im_start|>system\n")
		if len(msgs) > 0 && msgs[0].role == "system" {
			b.WriteString(msgs[0].content + "\n\n")
		}
		if t.ToolCallStyle == Qwen3CoderXML {
			b.WriteString("# Tools\n\nYou have access to the following functions:\n\n<tools>")
		} else {
			b.WriteString("# Tools\n\nYou may call one or more functions to assist with the user query.\n\nYou are provided with function signatures within <tools></tools> XML tags:\n<tools>")
		}
		for _, tool := range tools {
			b.WriteString("\n" + tojson(tool))
		}
		if t.ToolCallStyle == Qwen3CoderXML {
			b.WriteString("\n</tools>\n\nIf you choose to call a function ONLY reply in the following format with NO suffix:\n\n<tool_call>\n<function=example_function_name>\n<parameter=example_parameter_1>\nvalue_1\n</parameter>\n<parameter=example_parameter_2>\nThis is the value for the second parameter\nthat can span\nmultiple lines\n</parameter>\n</function>\n</tool_call>\n\n<IMPORTANT>\nReminder:\n- Function calls MUST follow the specified format: an inner <function=...></function> block must be nested within <tool_call></tool_call> XML tags\n- Required parameters MUST be specified\n- You may provide optional reasoning for your function call in natural language BEFORE the function call, but NOT after\n- If there is no function call available, do not make a function call\n</IMPORTANT><|im_end|>\n")
		} else {
			b.WriteString("\n</tools>\n\nFor each function call, return a json object with function name and arguments within <tool_call></tool_call> XML tags:\n<tool_call>\n{\"name\": <function-name>, \"arguments\": <args-json-object>}\n</tool_call><|im_end|>\n")
		}
	} else if len(msgs) > 0 && msgs[0].role == "system" {
		b.WriteString("<|im_start|>system\n" + msgs[0].content + "<|im_end|>\n")
	}

	lastQuery := len(msgs) - 1
	for i := len(msgs) - 1; i >= 0; i-- {
		m := msgs[i]
		if m.role == "user" && m.isString && !(strings.HasPrefix(m.content, "<tool_response>") && strings.HasSuffix(m.content, "</tool_response>")) {
			lastQuery = i
			break
		}
	}

	for i, m := range msgs {
		content := m.content
		last := i == len(msgs)-1
		switch {
		case m.role == "user" || (m.role == "system" && i != 0):
			b.WriteString("<|im_start|>" + m.role + "\n" + content + "<|im_end|>\n")
		case m.role == "assistant":
			reasoning := ""
			if m.reasoning != nil {
				reasoning = *m.reasoning
			} else if strings.Contains(content, "</think>") {
				parts := strings.Split(content, "</think>")
				before := strings.Split(strings.TrimRight(parts[0], "\n"), "<think>")
				reasoning = strings.TrimLeft(before[len(before)-1], "\n")
				content = strings.TrimLeft(parts[len(parts)-1], "\n")
			}
			if i > lastQuery && (last || reasoning != "") {
				b.WriteString("<|im_start|>assistant\n<think>\n" + strings.Trim(reasoning, "\n") + "\n</think>\n\n" + strings.TrimLeft(content, "\n"))
			} else {
				b.WriteString("<|im_start|>assistant\n" + content)
			}
			for j, c := range m.calls {
				if (j == 0 && content != "") || j > 0 {
					b.WriteString("\n")
				}
				if t.ToolCallStyle == Qwen3CoderXML {
					args, ok := c.args.(*ojson.Object)
					if !ok {
						return "", fmt.Errorf("tool call %q: arguments must be a JSON object for the XML tool-call format", c.name)
					}
					b.WriteString("<tool_call>\n<function=" + c.name + ">\n")
					for key, v := range args.All() {
						var s string
						switch v.(type) {
						case *ojson.Object, []any:
							s = tojson(v)
						default:
							s = pyStr(v)
						}
						b.WriteString("<parameter=" + key + ">\n" + s + "\n</parameter>\n")
					}
					b.WriteString("</function>\n</tool_call>")
				} else {
					b.WriteString("<tool_call>\n{\"name\": \"" + c.name + "\", \"arguments\": " + tojson(c.args) + "}\n</tool_call>")
				}
			}
			b.WriteString("<|im_end|>\n")
		case m.role == "tool":
			if i == 0 || msgs[i-1].role != "tool" {
				b.WriteString("<|im_start|>user")
			}
			b.WriteString("\n<tool_response>\n" + content + "\n</tool_response>")
			if last || msgs[i+1].role != "tool" {
				b.WriteString("<|im_end|>\n")
			}
		}
	}
	if o.AddGenerationPrompt {
		b.WriteString("<|im_start|>assistant\n")
		if v, ok := o.Kwargs["enable_thinking"].(bool); ok && !v {
			b.WriteString("<think>\n\n</think>\n\n")
		} else if t.OpenThinkInGenerationPrompt {
			b.WriteString("<think>\n")
		}
	}
	return b.String(), nil
}

func parseMessages(data []byte) ([]tmplMessage, error) {
	v, err := ojson.Decode(data)
	if err != nil {
		return nil, fmt.Errorf("messages: %w", err)
	}
	arr, ok := v.([]any)
	if !ok {
		return nil, errors.New("messages: must be a list")
	}
	out := make([]tmplMessage, 0, len(arr))
	for i, e := range arr {
		o, ok := e.(*ojson.Object)
		if !ok {
			return nil, fmt.Errorf("messages[%d]: must be an object", i)
		}
		var m tmplMessage
		role, _ := o.Get("role")
		if m.role, ok = role.(string); !ok {
			return nil, fmt.Errorf("messages[%d].role: required string", i)
		}
		c, _ := o.Get("content")
		switch cv := c.(type) {
		case nil:
		case string:
			m.content, m.isString = cv, true
		case []any:
			var texts []string
			for j, p := range cv {
				po, ok := p.(*ojson.Object)
				if !ok {
					return nil, fmt.Errorf("messages[%d].content[%d]: must be an object", i, j)
				}
				typ, _ := po.Get("type")
				txt, _ := po.Get("text")
				s, ok := txt.(string)
				if typ != "text" || !ok {
					return nil, fmt.Errorf("messages[%d].content[%d]: only text parts are supported", i, j)
				}
				texts = append(texts, s)
			}
			m.content, m.isString = strings.Join(texts, "\n"), true
		default:
			return nil, fmt.Errorf("messages[%d].content: must be a string, a list of parts or null", i)
		}
		for _, key := range []string{"reasoning_content", "reasoning"} {
			if r, ok := o.Get(key); ok {
				if s, ok := r.(string); ok {
					m.reasoning = &s
					break
				}
			}
		}
		if tc, ok := o.Get("tool_calls"); ok && tc != nil {
			calls, ok := tc.([]any)
			if !ok {
				return nil, fmt.Errorf("messages[%d].tool_calls: must be a list", i)
			}
			for j, ce := range calls {
				co, ok := ce.(*ojson.Object)
				if !ok {
					return nil, fmt.Errorf("messages[%d].tool_calls[%d]: must be an object", i, j)
				}
				fn := co
				if f, ok := co.Get("function"); ok {
					if fn, ok = f.(*ojson.Object); !ok {
						return nil, fmt.Errorf("messages[%d].tool_calls[%d].function: must be an object", i, j)
					}
				}
				name, _ := fn.Get("name")
				ns, ok := name.(string)
				if !ok {
					return nil, fmt.Errorf("messages[%d].tool_calls[%d].function.name: required string", i, j)
				}
				args, _ := fn.Get("arguments")
				switch a := args.(type) {
				case nil:
					args = &ojson.Object{}
				case string:
					if strings.TrimSpace(a) == "" {
						args = &ojson.Object{}
					} else if args, err = ojson.Decode([]byte(a)); err != nil {
						return nil, fmt.Errorf("messages[%d].tool_calls[%d].function.arguments: %w", i, j, err)
					}
				}
				m.calls = append(m.calls, tmplCall{name: ns, args: args})
			}
		}
		out = append(out, m)
	}
	return out, nil
}

// parseTools re-serialises tools as vLLM's pydantic models do.
func parseTools(data []byte) ([]any, error) {
	if len(data) == 0 {
		return nil, nil
	}
	v, err := ojson.Decode(data)
	if err != nil {
		return nil, fmt.Errorf("tools: %w", err)
	}
	if v == nil {
		return nil, nil
	}
	arr, ok := v.([]any)
	if !ok {
		return nil, errors.New("tools: must be a list")
	}
	out := make([]any, 0, len(arr))
	for i, e := range arr {
		o, ok := e.(*ojson.Object)
		if !ok {
			return nil, fmt.Errorf("tools[%d]: must be an object", i)
		}
		f, _ := o.Get("function")
		fo, ok := f.(*ojson.Object)
		if !ok {
			return nil, fmt.Errorf("tools[%d].function: required object", i)
		}
		if n, ok := fo.Get("name"); !ok || !isString(n) {
			return nil, fmt.Errorf("tools[%d].function.name: required string", i)
		}
		nf := &ojson.Object{}
		for _, k := range []string{"name", "description", "parameters"} {
			v, _ := fo.Get(k)
			nf.Set(k, v)
		}
		for k, v := range fo.All() {
			if _, done := nf.Get(k); !done {
				nf.Set(k, v)
			}
		}
		typ, ok := o.Get("type")
		if !ok {
			typ = "function"
		}
		if typ != "function" {
			return nil, fmt.Errorf("tools[%d].type: must be \"function\"", i)
		}
		nt := &ojson.Object{}
		nt.Set("type", typ)
		nt.Set("function", nf)
		for k, v := range o.All() {
			if k != "type" && k != "function" {
				nt.Set(k, v)
			}
		}
		out = append(out, nt)
	}
	return out, nil
}

func isString(v any) bool { _, ok := v.(string); return ok }

// pyStr renders a scalar like Jinja's |string filter on the Python value
// (str(True) == "True", str(None) == "None"); numbers and containers as
// json.dumps writes them.
func pyStr(v any) string {
	switch t := v.(type) {
	case nil:
		return "None"
	case bool:
		if t {
			return "True"
		}
		return "False"
	case string:
		return t
	}
	return tojson(v)
}

// tojson is the tojson filter of transformers' chat-template environment:
// json.dumps(v, ensure_ascii=False).
func tojson(v any) string { return string(ojson.AppendPy(nil, v, false)) }

// kwargsFromJSON decodes chat_template_kwargs.
func kwargsFromJSON(raw json.RawMessage) (map[string]any, error) {
	if len(raw) == 0 || string(raw) == "null" {
		return nil, nil
	}
	var m map[string]any
	if err := json.Unmarshal(raw, &m); err != nil {
		return nil, fmt.Errorf("chat_template_kwargs: %w", err)
	}
	return m, nil
}
