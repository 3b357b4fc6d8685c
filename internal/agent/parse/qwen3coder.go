package parse

import (
	"strings"

	"github.com/kilnrl/kiln/internal/ojson"
)

// nameSet is a set of parameter names; nil means "no schema" (any name).
type nameSet map[string]bool

// parserCall is one call produced by a configured parser, before argument
// normalization.
type parserCall struct {
	name string
	args any
}

// parserResult mirrors vLLM's ExtractedToolCallInformation.
type parserResult struct {
	called  bool
	calls   []parserCall
	content string
}

// qwen3Coder is vLLM's qwen3_coder non-streaming extraction (docs/adapter.md §6.2):
// structural </tool_call>, </function> and </parameter> detection, schema
// typed parameter values. Function names are not checked against the
// request's tools.
func qwen3Coder(text string, ts *ToolSet) parserResult {
	none := parserResult{content: text}
	if !strings.Contains(text, functionOpen) {
		return none
	}
	var fns []string
	for _, block := range qwen3CoderBlocks(text) {
		fs := strings.Index(block, functionOpen)
		if fs < 0 {
			continue
		}
		after := block[fs+len(functionOpen):]
		var valid nameSet
		bodyStart := 0
		if ne := strings.IndexByte(after, '>'); ne >= 0 {
			valid = paramNames(ts.properties(after[:ne]))
			bodyStart = ne + 1
		}
		if end := scanToFunctionEnd(after[bodyStart:], valid); end >= 0 {
			fns = append(fns, after[:bodyStart+end])
			continue
		}
		if end := findTrueFunctionEnd(after); end >= 0 {
			fns = append(fns, after[:end])
		} else {
			fns = append(fns, after)
		}
	}
	if len(fns) == 0 {
		return none
	}
	var calls []parserCall
	for _, fn := range fns {
		if c, ok := parseXMLFunction(fn, ts); ok {
			calls = append(calls, c)
		}
	}
	if len(calls) == 0 {
		return none
	}
	return parserResult{called: true, calls: calls, content: text[:qwen3CoderContentEnd(text)]}
}

func paramNames(props map[string]ParamType) nameSet {
	if len(props) == 0 {
		return nil
	}
	s := make(nameSet, len(props))
	for k := range props {
		s[k] = true
	}
	return s
}

// qwen3CoderBlocks splits text on <tool_call>; a </tool_call> closes a
// block only when followed, after whitespace, by <tool_call> or the end.
// An unclosed block runs to the end; no <tool_call> at all makes the
// whole text the one candidate.
func qwen3CoderBlocks(text string) []string {
	var blocks []string
	pos := 0
	for {
		s := indexFrom(text, toolCallOpen, pos)
		if s < 0 {
			break
		}
		bodyStart := s + len(toolCallOpen)
		end := -1
		for c := indexFrom(text, toolCallClose, bodyStart); c >= 0; c = indexFrom(text, toolCallClose, c+len(toolCallClose)) {
			k := skipPySpace(text, c+len(toolCallClose))
			if k == len(text) || strings.HasPrefix(text[k:], toolCallOpen) {
				end = c
				break
			}
		}
		if end < 0 {
			blocks = append(blocks, text[bodyStart:])
			break
		}
		blocks = append(blocks, text[bodyStart:end])
		pos = end + len(toolCallClose)
	}
	if len(blocks) == 0 {
		blocks = []string{text}
	}
	return blocks
}

// qwen3CoderContentEnd: content ends at the first <tool_call> whose block
// (up to the next </tool_call>, or the end) contains <function=; else at
// the first <function=.
func qwen3CoderContentEnd(text string) int {
	sp := 0
	for {
		tc := indexFrom(text, toolCallOpen, sp)
		if tc < 0 {
			break
		}
		cl := indexFrom(text, toolCallClose, tc+len(toolCallOpen))
		limit := cl
		if cl < 0 {
			limit = len(text)
		}
		if strings.Contains(text[tc+len(toolCallOpen):limit], functionOpen) {
			return tc
		}
		if cl >= 0 {
			sp = cl + len(toolCallClose)
		} else {
			sp = limit
		}
	}
	return strings.Index(text, functionOpen)
}

// nextStructuralParamStart finds the next <parameter= at index 0 or right
// after a newline, at or after start; with valid non-nil its NAME must be
// in valid.
func nextStructuralParamStart(text string, start int, valid nameSet) int {
	for ni := start; ; ni++ {
		ni = indexFrom(text, paramOpen, ni)
		if ni < 0 {
			return -1
		}
		if ni != 0 && text[ni-1] != '\n' {
			continue
		}
		if valid == nil {
			return ni
		}
		if ne := indexFrom(text, ">", ni+len(paramOpen)); ne >= 0 && valid[text[ni+len(paramOpen):ne]] {
			return ni
		}
	}
}

// findTrueFunctionEnd returns the first </function> followed, after
// whitespace, by </tool_call> or the end of text.
func findTrueFunctionEnd(text string) int {
	for idx := strings.Index(text, functionClose); idx >= 0; idx = indexFrom(text, functionClose, idx+len(functionClose)) {
		k := skipPySpace(text, idx+len(functionClose))
		if k == len(text) || strings.HasPrefix(text[k:], toolCallClose) {
			return idx
		}
	}
	return -1
}

func isAsciiSpace4(c byte) bool { return c == ' ' || c == '\t' || c == '\n' || c == '\r' }

// scanToFunctionEnd walks a function body parameter by parameter and
// returns the index of the structural </function>, or -1 when the body is
// incomplete or malformed.
func scanToFunctionEnd(body string, valid nameSet) int {
	pos, n := 0, len(body)
	seen := map[string]bool{}
	for pos < n {
		for pos < n && isAsciiSpace4(body[pos]) {
			pos++
		}
		if pos >= n {
			return -1
		}
		if strings.HasPrefix(body[pos:], functionClose) {
			return pos
		}
		if !strings.HasPrefix(body[pos:], paramOpen) {
			if r := findTrueFunctionEnd(body[pos:]); r >= 0 {
				return pos + r
			}
			return -1
		}
		ne := indexFrom(body, ">", pos+len(paramOpen))
		if ne < 0 {
			return -1
		}
		name := body[pos+len(paramOpen) : ne]
		vs := ne + 1
		if vs < n && body[vs] == '\n' {
			vs++
		}
		pe := findTrueParamEnd(body[vs:], valid, true)
		if pe < 0 {
			// Missing </parameter>: the next structural parameter with a
			// name not seen yet ends the value implicitly.
			var unseen nameSet
			if valid != nil {
				unseen = nameSet{}
				for k := range valid {
					if !seen[k] && k != name {
						unseen[k] = true
					}
				}
			}
			ie := nextStructuralParamStart(body[vs:], 0, unseen)
			if ie < 0 {
				return -1
			}
			pos = vs + ie
			seen[name] = true
			continue
		}
		seen[name] = true
		pos = vs + pe + len(paramClose)
	}
	return -1
}

// findTrueParamEnd returns the index of the structural </parameter> in
// value: at nesting depth 0 (literal <parameter= opens inside the value
// nest) and followed, after whitespace, by a known <parameter=,
// </function>, </tool_call> or (unless requireLookahead) the end.
func findTrueParamEnd(value string, valid nameSet, requireLookahead bool) int {
	depth, pos := 0, 0
	nextOpen := -2 // cached nextStructuralParamStart(value, pos, nil)
	for pos < len(value) {
		if nextOpen != -1 && nextOpen < pos {
			nextOpen = nextStructuralParamStart(value, pos, nil)
		}
		nextClose := indexFrom(value, paramClose, pos)
		if nextClose < 0 {
			return -1
		}
		switch {
		case nextOpen >= 0 && nextOpen < nextClose:
			depth++
			pos = nextOpen + len(paramOpen)
		case depth == 0:
			k := skipPySpace(value, nextClose+len(paramClose))
			rest := value[k:]
			structuralNext := false
			if strings.HasPrefix(rest, paramOpen) {
				if valid == nil {
					structuralNext = true
				} else if ne := indexFrom(rest, ">", len(paramOpen)); ne >= 0 {
					structuralNext = valid[rest[len(paramOpen):ne]]
				}
			}
			if (rest == "" && !requireLookahead) || structuralNext ||
				strings.HasPrefix(rest, functionClose) || strings.HasPrefix(rest, toolCallClose) {
				return nextClose
			}
			pos = nextClose + len(paramClose)
		default:
			depth--
			pos = nextClose + len(paramClose)
		}
	}
	return -1
}

// validFunctionName rejects empty names and names holding braces, angle
// brackets, quotes or whitespace (unrendered templates, pseudo-XML).
func validFunctionName(name string) bool {
	return name != "" && !strings.ContainsAny(name, "{}<>\"' \t\n\r")
}

// parseXMLFunction parses "NAME>...params..." (the text after <function=).
func parseXMLFunction(fn string, ts *ToolSet) (parserCall, bool) {
	end := strings.IndexByte(fn, '>')
	if end < 0 {
		return parserCall{}, false
	}
	name := fn[:end]
	if !validFunctionName(name) {
		return parserCall{}, false
	}
	props := ts.properties(name)
	valid := paramNames(props)
	params := fn[end+1:]
	b := &ojson.Object{}
	pos := 0
	for {
		ps := nextStructuralParamStart(params, pos, nil)
		if ps < 0 {
			break
		}
		ns := ps + len(paramOpen)
		ne := indexFrom(params, ">", ns)
		if ne < 0 {
			break
		}
		pname := params[ns:ne]
		vt := params[ne+1:]
		var pv string
		if pe := findTrueParamEnd(vt, valid, false); pe >= 0 {
			pv = vt[:pe]
			pos = ne + 1 + pe + len(paramClose)
		} else if nsp := nextStructuralParamStart(vt, 0, valid); nsp >= 0 {
			// no closing tag: the next parameter ends the value
			pv = vt[:nsp]
			pos = ne + 1 + nsp
		} else {
			// else the structural </function>, else the end
			pv = vt
			if fe := findTrueFunctionEnd(vt); fe >= 0 {
				pv = vt[:fe]
			}
			pos = len(params)
		}
		pv = strings.TrimPrefix(pv, "\n")
		pv = strings.TrimSuffix(pv, "\n")
		b.Set(pname, convertParam(pv, pname, props))
	}
	return parserCall{name: name, args: b}, true
}
