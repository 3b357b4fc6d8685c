package grade

import (
	"encoding/json"
	"fmt"
	"strings"

	"github.com/kilnrl/kiln/internal/gitdiff"
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

// patchPaths returns the repository paths a unified diff touches
// (gitdiff.Paths: shared with kiln export's Harbor verifiers).
func patchPaths(diff string) []string { return gitdiff.Paths(diff) }

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
