package grade

import (
	"bufio"
	"fmt"
	"regexp"
	"sort"
	"strings"
)

// Test statuses, as pytest prints them (and SWE-bench's TestStatus names).
const (
	StatusPassed  = "PASSED"
	StatusFailed  = "FAILED"
	StatusError   = "ERROR"
	StatusSkipped = "SKIPPED"
	StatusXFail   = "XFAIL"
	StatusXPass   = "XPASS"
)

// statusRank orders statuses when a test is reported more than once (a
// test that passed and then errored in teardown is reported PASSED and
// ERROR): the worst report wins.
var statusRank = map[string]int{
	StatusPassed: 1, StatusXFail: 1, StatusXPass: 1,
	StatusSkipped: 2,
	StatusFailed:  3, StatusError: 3,
}

// Passed reports whether a status counts as a pass for F2P/P2P grading:
// PASSED and XFAIL, as SWE-bench counts them, and XPASS (a non-strict
// xfail that passed; a strict one is reported FAILED). SKIPPED is not a
// pass: kiln requires every listed test to pass (SWE-bench instead counts a
// skipped test as neither passed nor failed).
func Passed(status string) bool {
	return status == StatusPassed || status == StatusXFail || status == StatusXPass
}

// A LogParser turns a test command's output into per-test statuses, keyed
// by the names the task's FAIL_TO_PASS/PASS_TO_PASS lists use.
type LogParser func(log string) map[string]string

// parsers are the log parsers kiln implements, by the names tasks give in
// their grading payload (SWE-bench's parser function names are aliases).
var parsers = map[string]LogParser{
	"pytest":                   ParsePytestLog,
	"parse_log_pytest":         ParsePytestLog,
	"parse_log_pytest_v2":      ParsePytestLog,
	"parse_log_pytest_options": ParsePytestLog,
}

// ParserNames lists the implemented log parser names, sorted.
func ParserNames() []string {
	var out []string
	for n := range parsers {
		out = append(out, n)
	}
	sort.Strings(out)
	return out
}

// lookupParser returns the parser a grading payload names ("" = pytest).
func lookupParser(name string) (LogParser, error) {
	if name == "" {
		name = "pytest"
	}
	if p, ok := parsers[name]; ok {
		return p, nil
	}
	return nil, fmt.Errorf("log parser %q is not implemented by kiln (implemented: %s)", name, strings.Join(ParserNames(), ", "))
}

var (
	ansiEscape = regexp.MustCompile(`\x1b\[[0-9;]*[A-Za-z]`)
	// xdistPrefix is what pytest-xdist puts before a -v result line:
	// "[gw0] [ 25%] PASSED tests/x.py::t".
	xdistPrefix = regexp.MustCompile(`^\[gw\d+\]\s+\[\s*\d+%\]\s+`)
	// vSuffix is the tail of a -v result line after the status: an
	// optional "(reason)" and the progress "[ 42%]".
	vSuffix = regexp.MustCompile(`^(\s+\(.*\))?(\s+\[\s*\d+%\])?\s*$`)
)

// ParsePytestLog reads pytest output and returns each reported test's
// status. It understands:
//
//   - the -rA short summary ("PASSED node", "FAILED node - message",
//     "XPASS node reason", "ERROR path" for a collection error), and any
//     line starting with a status word followed by a node id;
//   - -v result lines ("node PASSED   [ 42%]", "node SKIPPED (why) [ 50%]");
//   - pytest-xdist -v lines ("[gw0] [ 25%] PASSED node").
//
// Node ids may hold spaces inside their parameter brackets
// ("test_p[a - b]"): a node id ends at the first space outside brackets.
// Colour escapes are removed first. "SKIPPED [1] file:line: reason"
// summary lines name no test and are ignored. When a test is reported more
// than once the worst status wins (FAILED/ERROR over SKIPPED over passes).
// Output of -q alone lists only the failures: passing tests are then
// absent, and so never count as passed.
func ParsePytestLog(log string) map[string]string {
	out := map[string]string{}
	record := func(node, status string) {
		if node == "" {
			return
		}
		if old, ok := out[node]; ok && statusRank[old] >= statusRank[status] {
			return
		}
		out[node] = status
	}
	sc := bufio.NewScanner(strings.NewReader(log))
	sc.Buffer(nil, 1<<20)
	for sc.Scan() {
		line := strings.TrimRight(ansiEscape.ReplaceAllString(sc.Text(), ""), " \t\r")
		line = xdistPrefix.ReplaceAllString(line, "")
		// Summary form: STATUS node [rest].
		if word, rest, ok := strings.Cut(line, " "); ok && statusRank[word] > 0 {
			if node, _ := splitNodeID(rest); node != "" && !strings.HasPrefix(node, "[") {
				record(node, word)
			}
			continue
		}
		// -v form: node STATUS [(reason)] [[ NN%]]; the node must be a
		// test id (it holds "::").
		node, rest := splitNodeID(line)
		if !strings.Contains(node, "::") || rest == "" {
			continue
		}
		word, tail, _ := strings.Cut(rest, " ")
		if statusRank[word] == 0 || !vSuffix.MatchString(" "+tail) {
			continue
		}
		record(node, word)
	}
	return out
}

// splitNodeID splits s at its first space outside square brackets: a node
// id and the rest (trimmed).
func splitNodeID(s string) (node, rest string) {
	depth := 0
	for i := 0; i < len(s); i++ {
		switch s[i] {
		case '[':
			depth++
		case ']':
			if depth > 0 {
				depth--
			}
		case ' ', '\t':
			if depth == 0 {
				return s[:i], strings.TrimSpace(s[i+1:])
			}
		}
	}
	return s, ""
}
