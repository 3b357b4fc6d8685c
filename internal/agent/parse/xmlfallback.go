package parse

import (
	"strings"

	"github.com/kilnrl/kiln/internal/ojson"
)

// xmlFallback is the adapter's own parser (docs/adapter.md §6.2, parse_xml_tool_uses):
// every `<tool_call>\s*<function=NAME>BODY</function>\s*</tool_call>`
// (shortest BODY) whose NAME the request offers becomes a call with
// all-string arguments {P: trimmed value} for each
// `<parameter=P>value</parameter>` in BODY, and is cut out of the text;
// blocks with other names stay untouched.
func xmlFallback(text string, ts *ToolSet) (string, []Call) {
	var calls []Call
	var b strings.Builder
	last, pos := 0, 0
	for {
		s := indexFrom(text, toolCallOpen, pos)
		if s < 0 {
			break
		}
		name, inner, end, ok := matchXMLBlock(text, s)
		if !ok {
			pos = s + 1
			continue
		}
		pos = end
		if !ts.names[name] {
			continue
		}
		calls = append(calls, Call{Name: name, Arguments: encode(xmlParams(inner))})
		b.WriteString(text[last:s])
		last = end
	}
	if len(calls) == 0 {
		return text, nil
	}
	b.WriteString(text[last:])
	return b.String(), calls
}

// matchXMLBlock matches the fallback pattern at s (which holds <tool_call>).
func matchXMLBlock(text string, s int) (name, inner string, end int, ok bool) {
	j := skipPySpace(text, s+len(toolCallOpen))
	if !strings.HasPrefix(text[j:], functionOpen) {
		return "", "", 0, false
	}
	ns := j + len(functionOpen)
	ne := indexFrom(text, ">", ns)
	if ne <= ns {
		return "", "", 0, false
	}
	for f := indexFrom(text, functionClose, ne+1); f >= 0; f = indexFrom(text, functionClose, f+1) {
		k := skipPySpace(text, f+len(functionClose))
		if strings.HasPrefix(text[k:], toolCallClose) {
			return text[ns:ne], text[ne+1 : f], k + len(toolCallClose), true
		}
	}
	return "", "", 0, false
}

// xmlParams collects `<parameter=P>value</parameter>` (shortest value,
// P up to the first '>') as {P: strip(value)}; a repeated P keeps its first
// position and its last value.
func xmlParams(inner string) *ojson.Object {
	b := &ojson.Object{}
	pos := 0
	for {
		s := indexFrom(inner, paramOpen, pos)
		if s < 0 {
			break
		}
		ns := s + len(paramOpen)
		ne := indexFrom(inner, ">", ns)
		if ne > ns {
			if c := indexFrom(inner, paramClose, ne+1); c >= 0 {
				b.Set(inner[ns:ne], pyStrip(inner[ne+1:c]))
				pos = c + len(paramClose)
				continue
			}
		}
		pos = s + 1
	}
	return b
}
