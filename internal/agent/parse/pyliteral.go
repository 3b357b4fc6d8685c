package parse

import (
	"encoding/json"
	"math"
	"math/big"
	"strconv"
	"strings"
	"unicode/utf8"

	"github.com/kilnrl/kiln/internal/ojson"
)

// ---- Python number conversions used by the qwen3_coder type rules ----

// pyIntText converts s the way Python's int(s) does for base 10 (outer
// whitespace, one sign, ASCII digits with single underscores between
// them, leading zeros allowed) and returns the canonical decimal text.
func pyIntText(s string) (string, bool) {
	s = pyStrip(s)
	neg := false
	if s != "" && (s[0] == '+' || s[0] == '-') {
		neg = s[0] == '-'
		s = s[1:]
	}
	digits, ok := stripDigitUnderscores(s)
	if !ok {
		return "", false
	}
	digits = strings.TrimLeft(digits, "0")
	if digits == "" {
		return "0", true
	}
	if neg {
		return "-" + digits, true
	}
	return digits, true
}

func isDigit(c byte) bool { return c >= '0' && c <= '9' }

// stripDigitUnderscores validates digit (_? digit)* and drops underscores.
func stripDigitUnderscores(s string) (string, bool) {
	if s == "" || !isDigit(s[0]) || !isDigit(s[len(s)-1]) {
		return "", false
	}
	if !strings.Contains(s, "_") {
		for i := 0; i < len(s); i++ {
			if !isDigit(s[i]) {
				return "", false
			}
		}
		return s, true
	}
	var b strings.Builder
	for i := 0; i < len(s); i++ {
		c := s[i]
		switch {
		case isDigit(c):
			b.WriteByte(c)
		case c == '_' && isDigit(s[i-1]) && isDigit(s[i+1]):
		default:
			return "", false
		}
	}
	return b.String(), true
}

// pyFloat parses s the way Python's float(s) does, except that inf and nan
// spellings are refused (no JSON encoding; see doc.go) and so is overflow.
func pyFloat(s string) (float64, bool) {
	s = pyStrip(s)
	body := s
	if body != "" && (body[0] == '+' || body[0] == '-') {
		body = body[1:]
	}
	// Python float grammar: (digitpart [. [digitpart]] | . digitpart) [exp]
	mant, exp := body, ""
	if i := strings.IndexAny(body, "eE"); i >= 0 {
		mant, exp = body[:i], body[i+1:]
		if exp != "" && (exp[0] == '+' || exp[0] == '-') {
			exp = exp[1:]
		}
		if _, ok := stripDigitUnderscores(exp); !ok {
			return 0, false
		}
	}
	intPart, frac, hasDot := strings.Cut(mant, ".")
	if intPart == "" && frac == "" {
		return 0, false
	}
	if intPart != "" {
		if _, ok := stripDigitUnderscores(intPart); !ok {
			return 0, false
		}
	} else if !hasDot {
		return 0, false
	}
	if frac != "" {
		if _, ok := stripDigitUnderscores(frac); !ok {
			return 0, false
		}
	}
	f, err := strconv.ParseFloat(strings.ReplaceAll(s, "_", ""), 64)
	if err != nil || math.IsInf(f, 0) || math.IsNaN(f) {
		return 0, false
	}
	return f, true
}

// floatJSON renders f the way the reference does after float(): an
// integral value becomes a Python int (exact decimal of the double),
// anything else Python's float repr.
func floatJSON(f float64) string {
	if f == math.Trunc(f) {
		if math.Abs(f) < 1e15 {
			return strconv.FormatInt(int64(f), 10)
		}
		i, _ := new(big.Float).SetFloat64(f).Int(nil)
		return i.String()
	}
	return ojson.PyFloat(f)
}

// ---- ast.literal_eval subset ----

// pyLiteral evaluates s as a Python literal (ast.literal_eval) and returns
// it as JSON the way json.dumps would render it. Supported: str (with u/r
// prefixes, implicit concatenation, triple quotes), int (decimal, hex, octal,
// binary, underscores), float, True/False/None, list, tuple, dict and a
// single unary sign on a number. bytes, complex, sets and anything json.dumps
// cannot encode (NaN, infinities, tuple keys) fail; see doc.go.
func pyLiteral(s string) (any, bool) {
	p := pyParser{s: s}
	p.ws()
	v, ok := p.expr(0)
	if !ok {
		return nil, false
	}
	p.ws()
	if p.i != len(p.s) {
		return nil, false
	}
	return v, true
}

type pyParser struct {
	s string
	i int
}

func (p *pyParser) ws() { p.i = skipPySpace(p.s, p.i) }

func (p *pyParser) peek() byte {
	if p.i < len(p.s) {
		return p.s[p.i]
	}
	return 0
}

func (p *pyParser) expr(depth int) (any, bool) {
	if depth > ojson.MaxDepth || p.i >= len(p.s) {
		return nil, false
	}
	c := p.s[p.i]
	switch {
	case c == '[':
		p.i++
		items, ok := p.seq(']', depth)
		return items, ok
	case c == '(':
		p.i++
		p.ws()
		if p.peek() == ')' {
			p.i++
			return []any{}, true
		}
		first, ok := p.expr(depth + 1)
		if !ok {
			return nil, false
		}
		p.ws()
		if p.peek() == ')' { // parenthesized expression
			p.i++
			return first, true
		}
		if p.peek() != ',' {
			return nil, false
		}
		p.i++
		rest, ok := p.seq(')', depth)
		return append([]any{first}, rest...), ok
	case c == '{':
		p.i++
		return p.dict(depth)
	case c == '+' || c == '-':
		p.i++
		p.ws()
		v, ok := p.number()
		if !ok {
			return nil, false
		}
		if c == '-' && v != "0" {
			v = "-" + v
		}
		return v, true
	case c == '.' || isDigit(c):
		return p.number()
	case c == '"' || c == '\'':
		return p.strings()
	}
	// names and string prefixes
	j := p.i
	for j < len(p.s) && (isIdent(p.s[j])) {
		j++
	}
	word := p.s[p.i:j]
	switch word {
	case "True":
		p.i = j
		return true, true
	case "False":
		p.i = j
		return false, true
	case "None":
		p.i = j
		return nil, true
	}
	if j < len(p.s) && (p.s[j] == '"' || p.s[j] == '\'') {
		switch word {
		case "u", "U", "r", "R":
			return p.strings()
		}
	}
	return nil, false
}

func isIdent(c byte) bool {
	return c == '_' || isDigit(c) || (c|0x20 >= 'a' && c|0x20 <= 'z') || c >= utf8.RuneSelf
}

// seq parses comma-separated expressions up to close (trailing comma ok).
func (p *pyParser) seq(close byte, depth int) ([]any, bool) {
	items := []any{}
	for {
		p.ws()
		if p.peek() == close {
			p.i++
			return items, true
		}
		v, ok := p.expr(depth + 1)
		if !ok {
			return nil, false
		}
		items = append(items, v)
		p.ws()
		switch p.peek() {
		case ',':
			p.i++
		case close:
			p.i++
			return items, true
		default:
			return nil, false
		}
	}
}

func (p *pyParser) dict(depth int) (any, bool) {
	b := &ojson.Object{}
	for {
		p.ws()
		if p.peek() == '}' {
			p.i++
			return b, true
		}
		k, ok := p.expr(depth + 1)
		if !ok {
			return nil, false
		}
		var key string
		switch t := k.(type) {
		case string:
			key = t
		case json.Number:
			key = string(t)
		case bool:
			key = strconv.FormatBool(t)
		case nil:
			key = "null"
		default: // a list/tuple key: unhashable or not JSON-encodable
			return nil, false
		}
		p.ws()
		if p.peek() != ':' { // a set literal: json.dumps cannot encode it
			return nil, false
		}
		p.i++
		p.ws()
		v, ok := p.expr(depth + 1)
		if !ok {
			return nil, false
		}
		b.Set(key, v)
		p.ws()
		switch p.peek() {
		case ',':
			p.i++
		case '}':
			p.i++
			return b, true
		default:
			return nil, false
		}
	}
}

// number parses an int or float literal and renders it as json.dumps does.
func (p *pyParser) number() (json.Number, bool) {
	j := p.i
	for j < len(p.s) && (isIdent(p.s[j]) || p.s[j] == '.' ||
		((p.s[j] == '+' || p.s[j] == '-') && j > p.i && (p.s[j-1] == 'e' || p.s[j-1] == 'E') && !isHexPrefixed(p.s[p.i:j]))) {
		j++
	}
	tok := p.s[p.i:j]
	p.i = j
	if tok == "" {
		return "", false
	}
	low := strings.ToLower(tok)
	if len(low) > 2 && low[0] == '0' && (low[1] == 'x' || low[1] == 'o' || low[1] == 'b') {
		base := map[byte]int{'x': 16, 'o': 8, 'b': 2}[low[1]]
		digits := low[2:]
		if strings.HasPrefix(digits, "_") {
			digits = digits[1:]
		}
		if digits == "" || strings.HasSuffix(digits, "_") || strings.Contains(digits, "__") {
			return "", false
		}
		n, ok := new(big.Int).SetString(strings.ReplaceAll(digits, "_", ""), base)
		if !ok {
			return "", false
		}
		return json.Number(n.String()), true
	}
	if !strings.ContainsAny(low, ".e") {
		d, ok := stripDigitUnderscores(tok)
		if !ok {
			return "", false
		}
		if strings.TrimLeft(d, "0") == "" {
			return "0", true
		}
		if d[0] == '0' { // Python 3 forbids leading zeros
			return "", false
		}
		return json.Number(d), true
	}
	if strings.HasSuffix(low, "j") {
		return "", false // complex
	}
	f, ok := pyFloat(tok)
	if !ok || tok[0] == '+' || tok[0] == '-' {
		return "", false
	}
	return json.Number(ojson.PyFloat(f)), true
}

func isHexPrefixed(s string) bool {
	return len(s) >= 2 && s[0] == '0' && (s[1] == 'x' || s[1] == 'X')
}

// strings parses one or more adjacent string literals (implicit
// concatenation).
func (p *pyParser) strings() (any, bool) {
	var sb strings.Builder
	n := 0
	for {
		p.ws()
		j := p.i
		raw := false
		if j < len(p.s) {
			switch p.s[j] {
			case 'r', 'R':
				raw = true
				j++
			case 'u', 'U':
				j++
			}
		}
		if j >= len(p.s) || (p.s[j] != '"' && p.s[j] != '\'') {
			break
		}
		p.i = j
		if !p.oneString(&sb, raw) {
			return nil, false
		}
		n++
	}
	if n == 0 {
		return nil, false
	}
	return sb.String(), true
}

func (p *pyParser) oneString(sb *strings.Builder, raw bool) bool {
	q := p.s[p.i]
	delim := string(q)
	if strings.HasPrefix(p.s[p.i:], strings.Repeat(delim, 3)) {
		delim = strings.Repeat(delim, 3)
	}
	p.i += len(delim)
	for p.i < len(p.s) {
		if strings.HasPrefix(p.s[p.i:], delim) {
			p.i += len(delim)
			return true
		}
		c := p.s[p.i]
		if c == '\n' && len(delim) == 1 {
			return false
		}
		if c != '\\' {
			sb.WriteByte(c)
			p.i++
			continue
		}
		if p.i+1 >= len(p.s) {
			return false
		}
		e := p.s[p.i+1]
		if raw {
			sb.WriteByte('\\')
			sb.WriteByte(e)
			p.i += 2
			continue
		}
		p.i += 2
		switch e {
		case '\n':
		case '\\', '\'', '"':
			sb.WriteByte(e)
		case 'a':
			sb.WriteByte('\a')
		case 'b':
			sb.WriteByte('\b')
		case 'f':
			sb.WriteByte('\f')
		case 'n':
			sb.WriteByte('\n')
		case 'r':
			sb.WriteByte('\r')
		case 't':
			sb.WriteByte('\t')
		case 'v':
			sb.WriteByte('\v')
		case 'x', 'u', 'U':
			n := map[byte]int{'x': 2, 'u': 4, 'U': 8}[e]
			if p.i+n > len(p.s) {
				return false
			}
			var r rune
			for k := 0; k < n; k++ {
				h := hexVal(p.s[p.i+k])
				if h < 0 {
					return false
				}
				r = r<<4 | h
			}
			if r > utf8.MaxRune {
				return false
			}
			p.i += n
			sb.WriteRune(r)
		case '0', '1', '2', '3', '4', '5', '6', '7':
			r := rune(e - '0')
			for k := 0; k < 2 && p.i < len(p.s) && p.s[p.i] >= '0' && p.s[p.i] <= '7'; k++ {
				r = r*8 + rune(p.s[p.i]-'0')
				p.i++
			}
			sb.WriteRune(r)
		case 'N':
			return false // named escapes are not supported
		default:
			sb.WriteByte('\\')
			sb.WriteByte(e)
		}
	}
	return false
}
