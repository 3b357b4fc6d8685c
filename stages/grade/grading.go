package grade

import (
	"encoding/json"
	"fmt"
	"path"
	"regexp"
	"strconv"
	"strings"

	"github.com/kilnrl/kiln/internal/harbor"
)

// Grading kinds (the tasks grading column's "kind").
const (
	KindEvalCmd  = "eval_cmd"
	KindSWEBench = "swebench"
	KindSWEPro   = "swepro"
	KindF2P      = "f2p"
	KindHarbor   = harbor.Kind
)

// Grading is a task's grading payload, decoded from the tasks grading
// column (written by kiln-convert; docs/data-and-grading.md §1.4-§1.7).
type Grading struct {
	Kind string `json:"kind"`
	// eval_cmd: a shell command run in the workdir as the task's eval_user;
	// exit 0 is solved.
	EvalCmd string `json:"eval_cmd"`
	// f2p: a self-contained pytest file run with python in the workdir.
	F2PScript string `json:"f2p_script"`
	// swebench: the test patch applied over freshly reset test files, the
	// test command, its log parser and the required test lists.
	TestPatch  string   `json:"test_patch"`
	TestCmd    string   `json:"test_cmd"`
	LogParser  string   `json:"log_parser"`
	BaseCommit string   `json:"base_commit"`
	FailToPass []string `json:"fail_to_pass"`
	PassToPass []string `json:"pass_to_pass"`
	// swepro: SWE-bench Pro's run and parser scripts (embedded at convert
	// time) and its test lists.
	SWEPro *SWEPro `json:"swepro"`
	// Harbor is a Harbor task's verifier (docs/data-and-grading.md §7):
	// its tests/ and solution/ are attachments of the tasks version.
	Harbor *harbor.Grading `json:"-"`
}

// SWEPro is the payload of a SWE-bench Pro task (docs/data-and-grading.md §1.7, §5.4).
type SWEPro struct {
	BeforeRepoSetCmd  string   `json:"before_repo_set_cmd"`
	SelectedTestFiles []string `json:"selected_test_files"`
	FailToPass        []string `json:"fail_to_pass"`
	PassToPass        []string `json:"pass_to_pass"`
	RunScript         string   `json:"run_script"`
	ParserScript      string   `json:"parser_script"`
}

// ParseGrading decodes and checks a grading column. A nil column is no
// grading path (nil, nil): such tasks are graded reward 0 without a
// sandbox, as the reference does (docs/data-and-grading.md §5.1 step 1).
func ParseGrading(col *string) (*Grading, error) {
	if col == nil || strings.TrimSpace(*col) == "" || strings.TrimSpace(*col) == "null" {
		return nil, nil
	}
	var g Grading
	if err := json.Unmarshal([]byte(*col), &g); err != nil {
		return nil, fmt.Errorf("grading is not a JSON object of a known shape: %w", err)
	}
	switch g.Kind {
	case KindEvalCmd:
		if strings.TrimSpace(g.EvalCmd) == "" {
			return nil, nil // the reference treats a falsy eval_cmd as absent
		}
	case KindF2P:
		if strings.TrimSpace(g.F2PScript) == "" {
			return nil, nil
		}
	case KindSWEPro:
		if g.SWEPro == nil {
			return nil, fmt.Errorf("grading kind swepro has no \"swepro\" object")
		}
		if g.SWEPro.RunScript == "" && g.SWEPro.ParserScript == "" {
			return nil, fmt.Errorf("grading kind swepro has neither run_script nor parser_script")
		}
	case KindHarbor:
		var h harbor.Grading
		if err := json.Unmarshal([]byte(*col), &h); err != nil {
			return nil, fmt.Errorf("grading kind harbor: %w", err)
		}
		if h.Tests == "" {
			return nil, fmt.Errorf("grading kind harbor names no tests attachment")
		}
		g.Harbor = &h
	case KindSWEBench:
		if strings.TrimSpace(g.TestCmd) == "" {
			return nil, fmt.Errorf("grading kind swebench has no test_cmd")
		}
		if _, err := lookupParser(g.LogParser); err != nil {
			return nil, err
		}
	default:
		return nil, fmt.Errorf("unknown grading kind %q (want eval_cmd, swebench, swepro, f2p or harbor)", g.Kind)
	}
	return &g, nil
}

// shellQuote quotes s for bash like Python's shlex.quote.
func shellQuote(s string) string {
	if s == "" {
		return "''"
	}
	safe := true
	for _, r := range s {
		if !(r >= 'a' && r <= 'z' || r >= 'A' && r <= 'Z' || r >= '0' && r <= '9' || strings.ContainsRune("_@%+=:,./-", r)) {
			safe = false
			break
		}
	}
	if safe {
		return s
	}
	return "'" + strings.ReplaceAll(s, "'", `'"'"'`) + "'"
}

var (
	diffGitHeader = regexp.MustCompile(`^diff --git (.+)$`)
	fileHeader    = regexp.MustCompile(`^(?:---|\+\+\+) (.+)$`)
	renameHeader  = regexp.MustCompile(`^(?:rename|copy) (?:from|to) (.+)$`)
)

// patchPaths returns the repository paths a unified diff touches, in first
// seen order: both sides of every file header (git's "diff --git", the
// "---"/"+++" lines with their first component stripped, rename and copy
// lines), git-quoted names unquoted. Paths that are absolute or climb out
// with ".." are left out: they are never reset (git apply and patch refuse
// them anyway).
func patchPaths(diff string) []string {
	var out []string
	seen := map[string]bool{}
	add := func(p string) {
		p = path.Clean(p)
		if p == "." || p == "/dev/null" || path.IsAbs(p) || p == ".." || strings.HasPrefix(p, "../") || seen[p] {
			return
		}
		seen[p] = true
		out = append(out, p)
	}
	strip := func(s string) (string, bool) {
		s = unquoteGitPath(s)
		if s == "/dev/null" {
			return "", false
		}
		_, rest, ok := strings.Cut(s, "/")
		return rest, ok && rest != ""
	}
	for _, line := range strings.Split(diff, "\n") {
		line = strings.TrimSuffix(line, "\r")
		switch {
		case strings.HasPrefix(line, "diff --git "):
			m := diffGitHeader.FindStringSubmatch(line)
			if a, b, ok := splitGitHeader(m[1]); ok {
				add(a)
				add(b)
			}
		case strings.HasPrefix(line, "--- ") || strings.HasPrefix(line, "+++ "):
			m := fileHeader.FindStringSubmatch(line)
			if m == nil {
				continue
			}
			name := m[1]
			if !strings.HasPrefix(name, `"`) {
				// A tab ends the name in diff(1) output ("--- a/x\t2024-...").
				name, _, _ = strings.Cut(name, "\t")
			}
			if p, ok := strip(name); ok {
				add(p)
			}
		case strings.HasPrefix(line, "rename ") || strings.HasPrefix(line, "copy "):
			if m := renameHeader.FindStringSubmatch(line); m != nil {
				add(unquoteGitPath(m[1]))
			}
		}
	}
	return out
}

// splitGitHeader splits the names of a "diff --git" header when that is
// unambiguous: both quoted, or unquoted with exactly one " b/".
func splitGitHeader(s string) (a, b string, ok bool) {
	if strings.HasPrefix(s, `"`) {
		end := closingQuote(s)
		if end < 0 {
			return "", "", false
		}
		a = unquoteGitPath(s[:end+1])
		b = unquoteGitPath(strings.TrimSpace(s[end+1:]))
	} else {
		if strings.Count(s, " b/") != 1 {
			return "", "", false
		}
		i := strings.Index(s, " b/")
		a, b = s[:i], s[i+1:]
	}
	a, aok := strings.CutPrefix(a, "a/")
	b, bok := strings.CutPrefix(b, "b/")
	return a, b, aok && bok
}

func closingQuote(s string) int {
	for i := 1; i < len(s); i++ {
		switch s[i] {
		case '\\':
			i++
		case '"':
			return i
		}
	}
	return -1
}

// unquoteGitPath undoes git's C-style quoting of unusual file names
// ("\"a/caf\\303\\251\"" is a/café); other names are returned as is.
func unquoteGitPath(s string) string {
	if len(s) >= 2 && s[0] == '"' && s[len(s)-1] == '"' {
		if u, err := strconv.Unquote(s); err == nil {
			return u
		}
	}
	return s
}

// preCommandsBody builds the pre_commands script body (docs/data-and-grading.md §4.1): a
// string has each literal two-character "\n" turned into a newline; a list
// is joined with newlines after dropping empty items. "" means none.
func preCommandsBody(col *string) (string, error) {
	if col == nil {
		return "", nil
	}
	var v any
	if err := json.Unmarshal([]byte(*col), &v); err != nil {
		return "", fmt.Errorf("pre_commands is not valid JSON: %w", err)
	}
	switch x := v.(type) {
	case nil:
		return "", nil
	case string:
		return strings.ReplaceAll(x, `\n`, "\n"), nil
	case []any:
		var lines []string
		for i, item := range x {
			s, ok := item.(string)
			if !ok {
				return "", fmt.Errorf("pre_commands item %d is not a string", i)
			}
			if s != "" {
				lines = append(lines, s)
			}
		}
		return strings.Join(lines, "\n"), nil
	}
	return "", fmt.Errorf("pre_commands is neither a string nor a list of strings")
}
