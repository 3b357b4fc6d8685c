package pipelines

import (
	"bufio"
	"bytes"
	"fmt"
	"io"
	"os"
	"path/filepath"
	"regexp"
	"strconv"
	"strings"
)

// Error is a spec error at a position; it prints as file:line:col: msg.
type Error struct {
	Pos Pos
	Msg string
}

func (e *Error) Error() string {
	return fmt.Sprintf("%s:%d:%d: %s", e.Pos.File, e.Pos.Line, e.Pos.Col, e.Msg)
}

func errAt(p Pos, format string, a ...any) error {
	return &Error{Pos: p, Msg: fmt.Sprintf(format, a...)}
}

// varDef is one variable's winning definition.
type varDef struct {
	value  string
	pos    Pos
	origin string // "command line", "environment", or file:line
}

type varTable struct {
	defs map[string]*varDef
	env  map[string]string
}

var (
	varName  = regexp.MustCompile(`^[A-Za-z_][A-Za-z0-9_.]*$`)
	assignRe = regexp.MustCompile(`^([A-Za-z_][A-Za-z0-9_.]*)[ \t]*(\?=|=)[ \t]*(.*)$`)
	nameRe   = regexp.MustCompile(`^[A-Za-z0-9][A-Za-z0-9_.\-/]*$`)
)

// SplitArgs separates the words after a pipeline FILE on a command line
// (kiln run, plan, why, verify): NAME=value, NAME a variable name, sets a
// variable; any other word names a target.
func SplitArgs(args []string) (targets []string, vars map[string]string) {
	vars = map[string]string{}
	for _, a := range args {
		if k, v, ok := strings.Cut(a, "="); ok && varName.MatchString(k) {
			vars[k] = v
		} else {
			targets = append(targets, a)
		}
	}
	return targets, vars
}

// maxIncludeDepth bounds include nesting (a cycle is reported before).
const maxIncludeDepth = 32

// maxSpecBytes bounds a spec file and each file it includes: a spec is
// a page of text, and `include /dev/zero` (or a huge file) must be an
// error, not a read until the kernel kills the process.
const maxSpecBytes = 1 << 20

// readSpec reads a spec or included file: a regular file of at most
// maxSpecBytes.
func readSpec(path string) ([]byte, error) {
	f, err := os.Open(path)
	if err != nil {
		return nil, err
	}
	defer f.Close()
	fi, err := f.Stat()
	if err != nil {
		return nil, err
	}
	if !fi.Mode().IsRegular() {
		return nil, fmt.Errorf("%q is not a regular file (%s): a pipeline spec is a text file", path, fi.Mode().Type())
	}
	b, err := io.ReadAll(io.LimitReader(f, maxSpecBytes+1))
	if err != nil {
		return nil, err
	}
	if len(b) > maxSpecBytes {
		return nil, fmt.Errorf("%q is over %d bytes: a pipeline spec is a page of text, not data", path, maxSpecBytes)
	}
	return b, nil
}

// Load reads the spec at path with vars (VAR=value from the command line)
// and environ (os.Environ()). Precedence: command line > environment >
// the file's ?= default; a plain = in the file wins over the environment
// and loses only to the command line (pipelines/README.md §2).
func Load(path string, vars map[string]string, environ []string) (*Spec, error) {
	src, err := readSpec(path)
	if err != nil {
		return nil, fmt.Errorf("reading pipeline %q: %w", path, err)
	}
	return Parse(path, src, vars, environ)
}

// Parse is Load on src already read from path (includes are read relative
// to path's directory).
func Parse(path string, src []byte, vars map[string]string, environ []string) (*Spec, error) {
	vt := &varTable{defs: map[string]*varDef{}, env: map[string]string{}}
	for _, kv := range environ {
		if k, v, ok := strings.Cut(kv, "="); ok {
			vt.env[k] = v
		}
	}
	for k, v := range vars {
		if !varName.MatchString(k) {
			return nil, fmt.Errorf("command-line variable %q: a name is letters, digits, '_' and '.', starting with a letter or '_'", k)
		}
		vt.defs[k] = &varDef{value: v, origin: "command line"}
	}
	s := &Spec{Path: path, vars: vt}
	p := &parser{spec: s, vt: vt, stack: map[string]bool{}}
	if err := p.file(path, src, 0); err != nil {
		return nil, err
	}
	s.Vars = map[string]string{}
	s.origin = map[string]string{}
	for k, d := range vt.defs {
		s.Vars[k] = d.value
		s.origin[k] = d.origin
	}
	s.Name = strings.TrimSuffix(filepath.Base(path), ".kiln")
	if n, ok := s.Vars["PIPELINE"]; ok {
		name, err := vt.expand(n, nil, Pos{File: path, Line: 1, Col: 1})
		if err != nil {
			return nil, err
		}
		s.Name = name
	}
	if !nameRe.MatchString(s.Name) || strings.Contains(s.Name, "/") {
		return nil, fmt.Errorf("pipeline name %q (PIPELINE, or the file's base name): want letters, digits, '.', '_', '-'; set PIPELINE = NAME", s.Name)
	}
	return s, nil
}

type parser struct {
	spec  *Spec
	vt    *varTable
	stack map[string]bool
}

func (p *parser) file(path string, src []byte, depth int) error {
	abs, _ := filepath.Abs(path)
	if p.stack[abs] || depth > maxIncludeDepth {
		return fmt.Errorf("%s: include cycle (the file includes itself, directly or not)", path)
	}
	p.stack[abs] = true
	defer delete(p.stack, abs)
	sc := bufio.NewScanner(bytes.NewReader(src))
	sc.Buffer(make([]byte, 64<<10), 16<<20)
	var cur *Rule
	line := 0
	for sc.Scan() {
		line++
		text := sc.Text()
		pos := Pos{File: path, Line: line, Col: 1}
		if strings.HasPrefix(text, "\t") {
			body := text[1:]
			if strings.TrimSpace(body) == "" || strings.HasPrefix(strings.TrimSpace(body), "#") {
				continue
			}
			if cur == nil {
				return errAt(pos, "recipe line before any target: %q (a line starting with a tab belongs to the target above it)", text)
			}
			if err := checkParens(body, Pos{File: path, Line: line, Col: 2}); err != nil {
				return err
			}
			cur.Recipe = append(cur.Recipe, body)
			cur.RecipePos = append(cur.RecipePos, Pos{File: path, Line: line, Col: 2})
			continue
		}
		trim := strings.TrimSpace(text)
		if trim == "" || strings.HasPrefix(trim, "#") {
			continue
		}
		if text[0] == ' ' {
			if cur != nil {
				return errAt(pos, "recipe lines start with a tab, not spaces: %q", text)
			}
			return errAt(pos, "unexpected indentation: %q", text)
		}
		if m := assignRe.FindStringSubmatch(text); m != nil {
			cur = nil
			if err := checkParens(m[3], Pos{File: path, Line: line, Col: strings.Index(text, m[2]) + len(m[2]) + 1}); err != nil {
				return err
			}
			p.assign(m[1], m[2], strings.TrimSpace(stripComment(m[3])), pos)
			continue
		}
		if rest, ok := strings.CutPrefix(text, "include"); ok && (rest == "" || rest[0] == ' ' || rest[0] == '\t') {
			cur = nil
			arg := strings.TrimSpace(stripComment(rest))
			if arg == "" {
				return errAt(pos, "include wants a file name: %q", text)
			}
			name, err := p.vt.expand(arg, nil, Pos{File: path, Line: line, Col: 9})
			if err != nil {
				return err
			}
			inc := name
			if !filepath.IsAbs(inc) {
				inc = filepath.Join(filepath.Dir(path), inc)
			}
			b, err := readSpec(inc)
			if err != nil {
				return errAt(Pos{File: path, Line: line, Col: 9}, "include %q: %v", name, err)
			}
			if err := p.file(inc, b, depth+1); err != nil {
				return err
			}
			continue
		}
		r, err := parseRule(text, pos)
		if err != nil {
			return err
		}
		p.spec.Rules = append(p.spec.Rules, r)
		cur = r
	}
	if err := sc.Err(); err != nil {
		return fmt.Errorf("reading %s: %w", path, err)
	}
	return nil
}

func stripComment(s string) string {
	// A # starts a comment unless inside $(...) or quotes.
	depth, q := 0, false
	for i := 0; i < len(s); i++ {
		switch s[i] {
		case '"':
			q = !q
		case '(':
			depth++
		case ')':
			depth--
		case '#':
			if depth <= 0 && !q && (i == 0 || s[i-1] == ' ' || s[i-1] == '\t') {
				return s[:i]
			}
		}
	}
	return s
}

func (p *parser) assign(name, op, value string, pos Pos) {
	d := p.vt.defs[name]
	origin := fmt.Sprintf("%s:%d", pos.File, pos.Line)
	switch op {
	case "=":
		if d != nil && d.origin == "command line" {
			return
		}
	case "?=":
		if d != nil {
			return
		}
		if v, ok := p.vt.env[name]; ok {
			p.vt.defs[name] = &varDef{value: v, origin: "environment"}
			return
		}
	}
	p.vt.defs[name] = &varDef{value: value, pos: pos, origin: origin}
}

// checkParens reports an unclosed $( in s.
func checkParens(s string, pos Pos) error {
	depth := 0
	open := -1
	for i := 0; i < len(s); i++ {
		if s[i] == '$' && i+1 < len(s) {
			if s[i+1] == '$' {
				i++
				continue
			}
			if s[i+1] == '(' {
				if depth == 0 {
					open = i
				}
				depth++
				i++
				continue
			}
		}
		if depth > 0 {
			switch s[i] {
			case '(':
				depth++
			case ')':
				depth--
			}
		}
	}
	if depth > 0 {
		p := pos
		p.Col += open
		return errAt(p, "unclosed $( in %q", s[open:])
	}
	return nil
}

// parseRule parses "name: [attrs] prereqs...".
func parseRule(text string, pos Pos) (*Rule, error) {
	colon := -1
	depth := 0
	for i := 0; i < len(text); i++ {
		switch text[i] {
		case '(':
			depth++
		case ')':
			depth--
		case ':':
			if depth == 0 && colon < 0 {
				colon = i
			}
		}
	}
	if colon < 0 {
		return nil, errAt(pos, "want a target (name: prerequisites), a variable (NAME = value) or include FILE: %q", text)
	}
	name := strings.TrimSpace(text[:colon])
	if name == "" {
		return nil, errAt(pos, "target without a name: %q", text)
	}
	if strings.ContainsAny(name, " \t") {
		return nil, errAt(pos, "one target per rule; %q has spaces", name)
	}
	if err := checkParens(name, pos); err != nil {
		return nil, err
	}
	r := &Rule{Pos: pos, Name: name, Step: strings.Contains(name, "$(step")}
	rest := stripComment(text[colon+1:])
	off := colon + 1
	// attributes: [a=b c="d e" service]
	if t := strings.TrimLeft(rest, " \t"); strings.HasPrefix(t, "[") {
		start := off + len(rest) - len(t)
		end := -1
		q := false
		for i := 1; i < len(t); i++ {
			if t[i] == '"' {
				q = !q
			}
			if t[i] == ']' && !q {
				end = i
				break
			}
		}
		if end < 0 {
			return nil, errAt(Pos{File: pos.File, Line: pos.Line, Col: start + 1}, "unclosed [ in attributes: %q", t)
		}
		attrs, err := parseAttrs(t[1:end], Pos{File: pos.File, Line: pos.Line, Col: start + 2})
		if err != nil {
			return nil, err
		}
		r.Attrs = attrs
		off = start + end + 1
		rest = t[end+1:]
	}
	if err := checkParens(rest, Pos{File: pos.File, Line: pos.Line, Col: off + 1}); err != nil {
		return nil, err
	}
	r.Prereqs = splitFields(rest)
	return r, nil
}

// splitFields splits on blanks outside $(...).
func splitFields(s string) []string {
	var out []string
	depth, start := 0, -1
	for i := 0; i <= len(s); i++ {
		c := byte(' ')
		if i < len(s) {
			c = s[i]
		}
		switch {
		case c == '(':
			depth++
		case c == ')':
			depth--
		}
		if (c == ' ' || c == '\t') && depth <= 0 {
			if start >= 0 {
				out = append(out, s[start:i])
				start = -1
			}
		} else if start < 0 {
			start = i
		}
	}
	return out
}

// knownAttrs are the attribute names a rule may carry.
var knownAttrs = map[string]bool{
	"cpus": true, "gpus": true, "nodes": true, "shards": true, "throttle": true, "retries": true,
	"memory": true, "time": true, "partition": true, "health": true, "service": true, "out": true, "every": true,
}

func parseAttrs(s string, pos Pos) ([]Attr, error) {
	var out []Attr
	i := 0
	for i < len(s) {
		for i < len(s) && (s[i] == ' ' || s[i] == '\t') {
			i++
		}
		if i >= len(s) {
			break
		}
		start := i
		for i < len(s) && s[i] != '=' && s[i] != ' ' && s[i] != '\t' {
			i++
		}
		name := s[start:i]
		p := pos
		p.Col += start
		if !knownAttrs[name] {
			return nil, errAt(p, "unknown attribute %q (known: cpus, gpus, nodes, shards, throttle, retries, memory, time, partition, service, health, out)", name)
		}
		if i >= len(s) || s[i] != '=' {
			if name != "service" {
				return nil, errAt(p, "attribute %q wants a value: %s=VALUE", name, name)
			}
			out = append(out, Attr{Pos: p, Name: name, Value: "true"})
			continue
		}
		i++
		var val string
		if i < len(s) && s[i] == '"' {
			end := strings.IndexByte(s[i+1:], '"')
			if end < 0 {
				return nil, errAt(p, "unclosed quote in attribute %q", s[start:])
			}
			val = s[i+1 : i+1+end]
			i += end + 2
		} else {
			vs := i
			for i < len(s) && s[i] != ' ' && s[i] != '\t' {
				i++
			}
			val = s[vs:i]
		}
		for _, a := range out {
			if a.Name == name {
				return nil, errAt(p, "attribute %q given twice", name)
			}
		}
		out = append(out, Attr{Pos: p, Name: name, Value: val})
	}
	return out, nil
}

// scope binds the automatic names while expanding one target.
type scope struct {
	step    int // -1: not a step target
	target  string
	prereqs []string
	refs    func(name, output string) string // placeholder for $(ref X [OUTPUT])
	used    map[string]string                // variables read, for "why"
	inRule  bool
	shards  int
}

// expand replaces $(...) in s. Errors point at pos (the start of s).
func (vt *varTable) expand(s string, sc *scope, pos Pos) (string, error) {
	return vt.expandDepth(s, sc, pos, 0)
}

func (vt *varTable) expandDepth(s string, sc *scope, pos Pos, depth int) (string, error) {
	if depth > 64 {
		return "", errAt(pos, "variables expand into themselves (recursion deeper than 64): %q", s)
	}
	if !strings.Contains(s, "$") {
		return s, nil
	}
	var b strings.Builder
	for i := 0; i < len(s); i++ {
		c := s[i]
		if c != '$' || i+1 >= len(s) {
			b.WriteByte(c)
			continue
		}
		n := s[i+1]
		switch n {
		case '$':
			b.WriteByte('$')
			i++
			continue
		case '@', '<', '^':
			if sc == nil || !sc.inRule {
				b.WriteByte(c)
				continue
			}
			i++
			switch n {
			case '@':
				b.WriteString(sc.target)
			case '<':
				if len(sc.prereqs) > 0 {
					b.WriteString(sc.refs(sc.prereqs[0], ""))
				}
			case '^':
				for j, p := range sc.prereqs {
					if j > 0 {
						b.WriteByte(' ')
					}
					b.WriteString(sc.refs(p, ""))
				}
			}
			continue
		case '(':
		default:
			b.WriteByte(c)
			continue
		}
		// find the matching )
		depthP, j := 1, i+2
		for ; j < len(s) && depthP > 0; j++ {
			switch s[j] {
			case '(':
				depthP++
			case ')':
				depthP--
			}
		}
		if depthP > 0 {
			p := pos
			p.Col += i
			return "", errAt(p, "unclosed $( in %q", s[i:])
		}
		inner := s[i+2 : j-1]
		p := pos
		p.Col += i
		name, err := vt.expandDepth(inner, sc, p, depth+1)
		if err != nil {
			return "", err
		}
		val, err := vt.lookup(strings.TrimSpace(name), sc, p, depth, s[i:j])
		if err != nil {
			return "", err
		}
		b.WriteString(val)
		i = j - 1
	}
	return b.String(), nil
}

var stepExpr = regexp.MustCompile(`^step((?:[ ]*[+-][ ]*[0-9]+)*)$`)
var stepTerm = regexp.MustCompile(`[+-][ ]*[0-9]+`)

func (vt *varTable) lookup(name string, sc *scope, pos Pos, depth int, text string) (string, error) {
	if m := stepExpr.FindStringSubmatch(name); m != nil {
		if sc == nil || sc.step < 0 {
			return "", errAt(pos, "%s outside a step target (a target whose name mentions $(step))", text)
		}
		v := sc.step
		for _, t := range stepTerm.FindAllString(m[1], -1) {
			k, err := strconv.Atoi(strings.ReplaceAll(t[1:], " ", ""))
			if err != nil || k > 1<<30 {
				return "", errAt(pos, "step arithmetic %s: %q is not a small number", text, t)
			}
			if t[0] == '+' {
				v += k
			} else {
				v -= k
			}
		}
		return strconv.Itoa(max(v, 0)), nil
	}
	switch {
	case name == "shard":
		if sc != nil && sc.inRule {
			return "${KILN_SHARD}", nil
		}
	case name == "shards":
		if sc != nil && sc.shards > 0 {
			return strconv.Itoa(sc.shards), nil
		}
	case strings.HasPrefix(name, "ref ") || strings.HasPrefix(name, "ref\t"):
		if sc == nil || !sc.inRule {
			return "", errAt(pos, "%s outside a recipe", text)
		}
		// $(ref T) is T's ref; $(ref T NAME) its output NAME (a target
		// with several outputs, pipelines/README.md §3).
		f := strings.Fields(name[4:])
		if len(f) == 0 || len(f) > 2 {
			return "", errAt(pos, "%s: want $(ref TARGET) or $(ref TARGET OUTPUT)", text)
		}
		sel := ""
		if len(f) == 2 {
			sel = f[1]
		}
		return sc.refs(f[0], sel), nil
	}
	if !varName.MatchString(name) {
		return "", errAt(pos, "%s: %q is not a variable name, step arithmetic ($(step-1)) or $(ref TARGET)", text, name)
	}
	d, ok := vt.defs[name]
	if !ok {
		// NAME.N falls back to NAME (per-step values with a default).
		if dot := strings.LastIndexByte(name, '.'); dot > 0 {
			if _, err := strconv.Atoi(name[dot+1:]); err == nil {
				if _, ok := vt.defs[name[:dot]]; ok {
					v, err := vt.lookup(name[:dot], sc, pos, depth, text)
					if err == nil && sc != nil && sc.used != nil {
						sc.used[name] = v // "why" names AGENT.2, not AGENT
					}
					return v, err
				}
			}
		}
		if v, ok := vt.env[name]; ok {
			if sc != nil && sc.used != nil {
				sc.used[name] = v
			}
			return v, nil
		}
		return "", errAt(pos, "undefined variable %s (define it in the file, or pass %s=VALUE)", text, name)
	}
	v, err := vt.expandDepth(d.value, sc, pos, depth+1)
	if err != nil {
		return "", err
	}
	if sc != nil && sc.used != nil {
		sc.used[name] = v
	}
	return v, nil
}
