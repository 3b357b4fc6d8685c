package grade

import (
	"encoding/json"
	"flag"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"testing"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/kilnrl/kiln/internal/harbor"
)

var update = flag.Bool("update", false, "rewrite golden files in testdata/")

// TestParsePytestLogGolden parses real pytest 7.2 output (testdata/pytest,
// produced in the fixture root filesystem from one test file covering every
// outcome) and compares with the golden statuses beside each log.
func TestParsePytestLogGolden(t *testing.T) {
	logs, err := filepath.Glob("testdata/pytest/*.log")
	require.NoError(t, err)
	require.NotEmpty(t, logs)
	for _, path := range logs {
		name := strings.TrimSuffix(filepath.Base(path), ".log")
		t.Run(name, func(t *testing.T) {
			data, err := os.ReadFile(path)
			require.NoError(t, err)
			got := ParsePytestLog(string(data))
			golden := strings.TrimSuffix(path, ".log") + ".golden.json"
			if *update {
				b, _ := json.MarshalIndent(got, "", "  ")
				require.NoError(t, os.WriteFile(golden, append(b, '\n'), 0o644))
			}
			b, err := os.ReadFile(golden)
			require.NoError(t, err, "run go test -run TestParsePytestLogGolden -update to create it")
			var want map[string]string
			require.NoError(t, json.Unmarshal(b, &want))
			assert.Equal(t, want, got)
		})
	}
}

type pytestLineCase struct {
	name string
	log  string
	want map[string]string
}

// pytestLineCases are the parser's line-level cases (shared with
// TestVerdictScriptAgrees).
func pytestLineCases() []pytestLineCase {
	return []pytestLineCase{
		{"summary with message", "FAILED t.py::test_a - assert 1 == 2", map[string]string{"t.py::test_a": StatusFailed}},
		{"summary spaces in params", "FAILED t.py::test_p[x - y] - boom", map[string]string{"t.py::test_p[x - y]": StatusFailed}},
		{"xpass reason without dash", "XPASS t.py::test_x fixed already", map[string]string{"t.py::test_x": StatusXPass}},
		{"verbose with percent", "t.py::C::test_m PASSED                 [ 90%]", map[string]string{"t.py::C::test_m": StatusPassed}},
		{"verbose skip reason", "t.py::test_s SKIPPED (not today)      [ 36%]", map[string]string{"t.py::test_s": StatusSkipped}},
		{"verbose old pytest", "t.py::test_a PASSED", map[string]string{"t.py::test_a": StatusPassed}},
		{"teardown error wins", "t.py::test_a PASSED [ 50%]\nt.py::test_a ERROR [ 50%]", map[string]string{"t.py::test_a": StatusError}},
		{"pass does not override failure", "FAILED t.py::test_a\nPASSED t.py::test_a", map[string]string{"t.py::test_a": StatusFailed}},
		{"colour", "\x1b[32mPASSED\x1b[0m t.py::test_a", map[string]string{"t.py::test_a": StatusPassed}},
		{"xdist", "[gw3] [ 7%] FAILED t.py::test_a ", map[string]string{"t.py::test_a": StatusFailed}},
		{"collection error", "ERROR tests/test_x.py - ImportError", map[string]string{"tests/test_x.py": StatusError}},
		{"skipped summary names no test", "SKIPPED [1] t.py:16: not today", map[string]string{}},
		{"prose is ignored", "the test t.py::test_a PASSED quickly\nPASSED", map[string]string{}},
		{"verbose line without status", "t.py::test_a \nsome output", map[string]string{}},
		{"crlf", "PASSED t.py::test_a\r\n", map[string]string{"t.py::test_a": StatusPassed}},
	}
}

func TestParsePytestLogLines(t *testing.T) {
	for _, c := range pytestLineCases() {
		t.Run(c.name, func(t *testing.T) {
			assert.Equal(t, c.want, ParsePytestLog(c.log))
		})
	}
}

func TestLookupParser(t *testing.T) {
	for _, name := range []string{"", "pytest", "parse_log_pytest"} {
		p, err := lookupParser(name)
		require.NoError(t, err, name)
		assert.Equal(t, map[string]string{"a::b": StatusPassed}, p("PASSED a::b"))
	}
	_, err := lookupParser("parse_log_django")
	assert.ErrorContains(t, err, `log parser "parse_log_django" is not implemented by kiln (implemented: parse_log_pytest, `)
}

// TestVerdictScriptAgrees runs the Python pytest parser that kiln export
// --format harbor puts in an exported verifier (internal/harbor
// verdict.py) on every log of the Go parser's tests: both must give the
// same statuses, so a task graded by Harbor's harness and by kiln-grade
// gets the same reward (docs/data-and-grading.md §7.5).
func TestVerdictScriptAgrees(t *testing.T) {
	py, err := exec.LookPath("python3")
	if err != nil {
		t.Skip("no python3 on PATH")
	}
	dir := t.TempDir()
	script := filepath.Join(dir, "kiln_verdict.py")
	require.NoError(t, os.WriteFile(script, []byte(harbor.VerdictScript()), 0o644))
	logs := map[string]string{}
	for _, c := range pytestLineCases() {
		logs[c.name] = c.log
	}
	golden, err := filepath.Glob("testdata/pytest/*.log")
	require.NoError(t, err)
	require.NotEmpty(t, golden)
	for _, p := range golden {
		data, err := os.ReadFile(p)
		require.NoError(t, err)
		logs[filepath.Base(p)] = string(data)
	}
	for name, log := range logs {
		f := filepath.Join(dir, "log")
		require.NoError(t, os.WriteFile(f, []byte(log), 0o644))
		out, err := exec.Command(py, script, "parse", f).Output()
		require.NoError(t, err, name)
		var got map[string]string
		require.NoError(t, json.Unmarshal(out, &got), name)
		assert.Equal(t, ParsePytestLog(log), got, name)
	}
}
