package parse

import (
	"strings"

	"github.com/kilnrl/kiln/internal/ojson"
)

// hermesBlock is one match of vLLM hermes' `<tool_call>(.*?)</tool_call>|
// <tool_call>(.*)`: the body up to the next </tool_call>, or (unclosed, the
// last block) to the end of text.
type hermesBlock struct {
	body   string
	closed bool
}

func hermesBlocks(text string) []hermesBlock {
	var out []hermesBlock
	pos := 0
	for {
		s := indexFrom(text, toolCallOpen, pos)
		if s < 0 {
			return out
		}
		b := s + len(toolCallOpen)
		c := indexFrom(text, toolCallClose, b)
		if c < 0 {
			return append(out, hermesBlock{body: text[b:]})
		}
		out = append(out, hermesBlock{body: text[b:c], closed: true})
		pos = c + len(toolCallClose)
	}
}

// hermes is vLLM's hermes non-streaming extraction run on the pre-repaired
// text (docs/adapter.md §6.2). Every block must decode to an object with a string
// "name" and an "arguments" member, or there are no calls at all. Names
// are not checked against the request's tools.
//
// The adapter's pre-repair rewrites each closed block whose trimmed body is
// {...} and decodes leniently (see jsonBlock) into canonical JSON before the
// strict parser sees it; here the lenient decode is used directly for such
// blocks (the rewrite always decodes strictly), and the strict decode for
// the rest. The text itself is never rewritten.
func hermes(text string) parserResult {
	none := parserResult{content: text}
	first := strings.Index(text, toolCallOpen)
	if first < 0 {
		return none
	}
	var calls []parserCall
	for _, b := range hermesBlocks(text) {
		var v any
		ok := false
		if inner := pyStrip(b.body); b.closed && isBraced(inner) {
			v, ok = jsonBlock(inner, true)
		}
		if !ok {
			v, ok = parseJSON(b.body, false)
		}
		if !ok {
			return none
		}
		o, _ := v.(*ojson.Object)
		name, ok := o.Str("name")
		if !ok {
			return none
		}
		args, ok := o.Get("arguments")
		if !ok {
			return none
		}
		calls = append(calls, parserCall{name: name, args: args})
	}
	return parserResult{called: true, calls: calls, content: text[:first]}
}

func isBraced(s string) bool { return len(s) >= 2 && s[0] == '{' && s[len(s)-1] == '}' }

// jsonBlock decodes the JSON object of a <tool_call> block the lenient
// way: json.loads(strict=False) (raw control characters allowed inside
// strings), and if that fails again after repairEscapes. With parseArgs, a
// string "arguments" member is replaced by its own lenient decode when that
// succeeds (the pre-repair step).
func jsonBlock(raw string, parseArgs bool) (*ojson.Object, bool) {
	v, ok := parseJSON(raw, true)
	if !ok {
		if v, ok = parseJSON(repairEscapes(raw), true); !ok {
			return nil, false
		}
	}
	o, ok := v.(*ojson.Object)
	if !ok {
		return nil, false
	}
	if parseArgs {
		if s, ok := o.Str("arguments"); ok {
			if a, ok := parseJSON(s, true); ok {
				o.Set("arguments", a)
			}
		}
	}
	return o, true
}

// repairEscapes doubles every backslash that does not start a valid JSON
// escape: one not followed by one of " \ / b f n r t, nor by u plus four
// hex digits. Like the reference's regex it looks at each backslash on its
// own (an escaped backslash's second half is judged by what follows it).
// DIVERGENCE (doc.go): the reference accepts any \u; a \u without four hex
// digits is repaired here too.
func repairEscapes(s string) string {
	if !strings.Contains(s, `\`) {
		return s
	}
	var b strings.Builder
	b.Grow(len(s) + 8)
	for i := 0; i < len(s); i++ {
		c := s[i]
		b.WriteByte(c)
		if c != '\\' {
			continue
		}
		valid := false
		if i+1 < len(s) {
			switch s[i+1] {
			case '"', '\\', '/', 'b', 'f', 'n', 'r', 't':
				valid = true
			case 'u':
				_, valid = hex4(s, i+2)
			}
		}
		if !valid {
			b.WriteByte('\\')
		}
	}
	return b.String()
}

// jsonBlockSpan is one match of the adapter's
// `<tool_call>\s*(\{.*?\})\s*</tool_call>` (dot matches newline).
type jsonBlockSpan struct {
	start, end int    // the whole match
	inner      string // the {...} group
}

func jsonBlockSpans(text string) []jsonBlockSpan {
	var out []jsonBlockSpan
	pos := 0
	for {
		s := indexFrom(text, toolCallOpen, pos)
		if s < 0 {
			return out
		}
		j := skipPySpace(text, s+len(toolCallOpen))
		matched := false
		if j < len(text) && text[j] == '{' {
			for c := indexFrom(text, toolCallClose, j+1); c >= 0; c = indexFrom(text, toolCallClose, c+1) {
				if e := trimPySpaceRight(text, c); e-1 > j && text[e-1] == '}' {
					end := c + len(toolCallClose)
					out = append(out, jsonBlockSpan{start: s, end: end, inner: text[j:e]})
					pos, matched = end, true
					break
				}
			}
		}
		if !matched {
			pos = s + 1
		}
	}
}

// lenientRecover re-parses every JSON <tool_call> block leniently and keeps
// those with a non-empty string name that the request offers (any name
// when no tool has a name).
func lenientRecover(spans []jsonBlockSpan, ts *ToolSet) []Call {
	var out []Call
	for _, sp := range spans {
		v, ok := jsonBlock(sp.inner, false)
		if !ok {
			continue
		}
		name, ok := v.Str("name")
		if !ok || name == "" {
			continue
		}
		if len(ts.names) > 0 && !ts.names[name] {
			continue
		}
		args, ok := v.Get("arguments")
		if !ok {
			args = &ojson.Object{}
		}
		a, _ := normalizeArgs(args)
		out = append(out, Call{Name: name, Arguments: encode(a)})
	}
	return out
}

// removeSpans deletes the spans from text.
func removeSpans(text string, spans []jsonBlockSpan) string {
	var b strings.Builder
	last := 0
	for _, sp := range spans {
		b.WriteString(text[last:sp.start])
		last = sp.end
	}
	b.WriteString(text[last:])
	return b.String()
}

// normalizeArgs turns a call's arguments into an object: a string is
// decoded leniently (kept as {"_raw_arguments": s} when that fails), an
// object is used as is, any other value v becomes {"_raw_arguments": v}.
// wrapped reports the _raw_arguments case.
func normalizeArgs(v any) (out *ojson.Object, wrapped bool) {
	if s, ok := v.(string); ok {
		a, ok := parseJSON(s, true)
		if !ok {
			return rawArguments(v), true
		}
		v = a
	}
	if o, ok := v.(*ojson.Object); ok {
		return o, false
	}
	return rawArguments(v), true
}

func rawArguments(v any) *ojson.Object { return ojson.Obj("_raw_arguments", v) }
