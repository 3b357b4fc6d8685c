package harbor

import (
	"bytes"
	_ "embed"
	"encoding/json"
	"fmt"
	"os"
	"path/filepath"
	"strings"

	"github.com/BurntSushi/toml"

	"github.com/kilnrl/kiln/formats/records"
	"github.com/kilnrl/kiln/internal/gitdiff"
	"github.com/kilnrl/kiln/internal/ojson"
	"github.com/kilnrl/kiln/internal/shlex"
)

// kiln export --format harbor writes kiln tasks as Harbor task directories
// (docs/data-and-grading.md §7.5): the verifier tests/test.sh does what
// kiln-grade does for the task's grading kind and writes 1 or 0 to
// /logs/verifier/reward.txt; solution/solve.sh applies the gold patch; the
// environment is the task's image, named as a prebuilt docker_image.

// DefaultVerifierTimeoutSec is the verifier timeout of an exported task
// that names none: kiln-grade's --timeout default (docs/data-and-grading.md §5.1).
const DefaultVerifierTimeoutSec = 600.0

// SWEProDir is where kiln-grade puts SWE-bench Pro's scripts
// (docs/data-and-grading.md §5.4); the exported verifier uses the same.
const SWEProDir = "/workspace/swepro_eval"

// verdictPy decides a swebench or swepro verdict inside the exported
// verifier: kiln-grade's pytest log parser and required-tests rule,
// in Python, since Harbor runs nothing but the task's own files.
//
//go:embed verdict.py
var verdictPy string

// VerdictScript is the Python verdict the exported swebench and swepro
// verifiers run (tests/kiln_verdict.py); its pytest parser must agree with
// kiln-grade's (stages/grade tests it on the Go parser's cases).
func VerdictScript() string { return verdictPy }

// ExportOptions are what WriteTask needs beyond the task row.
type ExportOptions struct {
	// Attachment reads an attachment of the tasks version (a Harbor
	// task's tests/, solution/ and environment/ tars).
	Attachment func(rel string) ([]byte, error)
	// GoldPatch is the task's gold patch ("" = none known: the task gets
	// no solution/, unless it is a Harbor task with its own).
	GoldPatch string
}

// ExportDirName is the directory a task is written to inside the export:
// its id with every character Harbor's task names do not allow, and '/',
// replaced by '_'.
func ExportDirName(taskID string) string {
	var b strings.Builder
	for _, r := range taskID {
		if r >= 'a' && r <= 'z' || r >= 'A' && r <= 'Z' || r >= '0' && r <= '9' || r == '.' || r == '_' || r == '-' {
			b.WriteRune(r)
		} else {
			b.WriteByte('_')
		}
	}
	s := b.String()
	if s == "" || s == "." || s == ".." {
		s = "_" + s
	}
	return s
}

// GoldPatchOf is the gold patch a task row carries: metadata.patch (the
// SWE-bench rows' key, kept by kiln-convert), else grading.other_keys.patch
// (a MiMo row's); "" when it has none.
func GoldPatchOf(t *records.Task) string {
	var md struct {
		Patch string `json:"patch"`
	}
	if json.Unmarshal([]byte(t.Metadata), &md) == nil && strings.TrimSpace(md.Patch) != "" {
		return md.Patch
	}
	if t.Grading != nil {
		var g struct {
			OtherKeys struct {
				Patch string `json:"patch"`
			} `json:"other_keys"`
		}
		if json.Unmarshal([]byte(*t.Grading), &g) == nil && strings.TrimSpace(g.OtherKeys.Patch) != "" {
			return g.OtherKeys.Patch
		}
	}
	return ""
}

// exportGrading is the part of a tasks grading column the verifiers need
// (kiln-grade's own decoding is stages/grade ParseGrading).
type exportGrading struct {
	Kind       string   `json:"kind"`
	EvalCmd    string   `json:"eval_cmd"`
	F2PScript  string   `json:"f2p_script"`
	TestPatch  string   `json:"test_patch"`
	TestCmd    string   `json:"test_cmd"`
	LogParser  string   `json:"log_parser"`
	BaseCommit string   `json:"base_commit"`
	FailToPass []string `json:"fail_to_pass"`
	PassToPass []string `json:"pass_to_pass"`
	SWEPro     *struct {
		BeforeRepoSetCmd  string   `json:"before_repo_set_cmd"`
		SelectedTestFiles []string `json:"selected_test_files"`
		FailToPass        []string `json:"fail_to_pass"`
		PassToPass        []string `json:"pass_to_pass"`
		RunScript         string   `json:"run_script"`
		ParserScript      string   `json:"parser_script"`
	} `json:"swepro"`
}

// pytestParsers are the log parser names kiln-grade implements (all
// pytest's; stages/grade ParserNames).
var pytestParsers = map[string]bool{"": true, "pytest": true, "parse_log_pytest": true,
	"parse_log_pytest_v2": true, "parse_log_pytest_options": true}

// WriteTask writes task t as a Harbor task directory at dir (which must
// not exist). It returns notes on what Harbor's own harness will do
// differently (pre_commands it does not run), one line each.
func WriteTask(dir string, t *records.Task, o ExportOptions) ([]string, error) {
	if t.Grading == nil || strings.TrimSpace(*t.Grading) == "" || *t.Grading == "null" {
		return nil, fmt.Errorf("task %q has no grading payload: a Harbor task needs a verifier", t.TaskID)
	}
	var g exportGrading
	if err := json.Unmarshal([]byte(*t.Grading), &g); err != nil {
		return nil, fmt.Errorf("task %q: grading: %w", t.TaskID, err)
	}
	if t.Image == nil || *t.Image == "" {
		return nil, fmt.Errorf("task %q has no image: a Harbor task names its environment", t.TaskID)
	}
	if err := os.Mkdir(dir, 0o755); err != nil {
		return nil, err
	}
	ins, err := instruction(t)
	if err != nil {
		return nil, err
	}
	if err := os.WriteFile(filepath.Join(dir, "instruction.md"), []byte(ins), 0o644); err != nil {
		return nil, err
	}
	if g.Kind == Kind {
		return nil, writeHarborTask(dir, t, o)
	}
	return writeConvertedTask(dir, t, &g, o)
}

// instruction is the task's problem statement, else its prompt's text.
func instruction(t *records.Task) (string, error) {
	if t.ProblemStatement != nil && *t.ProblemStatement != "" {
		return *t.ProblemStatement, nil
	}
	var s string
	if json.Unmarshal([]byte(t.Prompt), &s) == nil && s != "" {
		return s, nil
	}
	var msgs []struct {
		Role    string          `json:"role"`
		Content json.RawMessage `json:"content"`
	}
	if json.Unmarshal([]byte(t.Prompt), &msgs) == nil {
		for _, m := range msgs {
			if m.Role != "user" {
				continue
			}
			if json.Unmarshal(m.Content, &s) == nil && s != "" {
				return s, nil
			}
			var parts []struct {
				Type, Text string
			}
			if json.Unmarshal(m.Content, &parts) == nil {
				var texts []string
				for _, p := range parts {
					if p.Type == "text" {
						texts = append(texts, p.Text)
					}
				}
				if len(texts) > 0 {
					return strings.Join(texts, "\n"), nil
				}
			}
		}
	}
	return "", fmt.Errorf("task %q has neither a problem statement nor a user message: nothing to write as instruction.md", t.TaskID)
}

// exportTOML is the task.toml of a converted task (schema 1.1).
type exportTOML struct {
	SchemaVersion string         `toml:"schema_version"`
	Task          *exportName    `toml:"task,omitempty"`
	Metadata      map[string]any `toml:"metadata"`
	Verifier      exportVerifier `toml:"verifier"`
	Environment   exportEnv      `toml:"environment"`
}

type exportName struct {
	Name string `toml:"name"`
}

type exportVerifier struct {
	TimeoutSec float64 `toml:"timeout_sec"`
}

type exportEnv struct {
	DockerImage string `toml:"docker_image"`
}

// writeConvertedTask writes a task of another source format: a schema 1.1
// task.toml, the verifier of its grading kind, the gold patch as oracle.
func writeConvertedTask(dir string, t *records.Task, g *exportGrading, o ExportOptions) ([]string, error) {
	workdir := "/testbed" // kiln-grade's default (docs/data-and-grading.md §5.1)
	if t.Workdir != nil && *t.Workdir != "" {
		workdir = *t.Workdir
	}
	evalUser := "agent"
	if t.EvalUser != nil && *t.EvalUser != "" {
		evalUser = *t.EvalUser
	}
	var notes []string
	tests := map[string]string{}
	var body strings.Builder
	wd := shlex.Quote(workdir)
	pre, err := preCommands(t, g)
	if err != nil {
		return nil, err
	}
	switch g.Kind {
	case "eval_cmd":
		if strings.TrimSpace(g.EvalCmd) == "" {
			return nil, fmt.Errorf("task %q: grading kind eval_cmd has an empty eval_cmd", t.TaskID)
		}
		tests["eval_cmd.sh"] = g.EvalCmd
		fmt.Fprintf(&body, "# eval_cmd (kiln-grade: docs/data-and-grading.md §5.3): the task's command,\n# run in the workdir as %s; exit 0 is reward 1.\n", evalUser)
		fmt.Fprintf(&body, "cd %s || exit 97\n", wd)
		fmt.Fprintf(&body, "kiln_as %s bash -c \"$(cat /tests/eval_cmd.sh)\"\n", shlex.Quote(evalUser))
		body.WriteString("rc=$?\nif [ $rc -eq 0 ]; then echo 1 > /logs/verifier/reward.txt; fi\nexit $rc\n")
	case "f2p":
		if strings.TrimSpace(g.F2PScript) == "" {
			return nil, fmt.Errorf("task %q: grading kind f2p has an empty f2p_script", t.TaskID)
		}
		tests["f2p.py"] = g.F2PScript
		body.WriteString("# f2p (kiln-grade: docs/data-and-grading.md §5.1): the task's pytest file, run\n# with python in the workdir as agent; exit 0 is reward 1.\n")
		body.WriteString("kiln_user agent\ncp /tests/f2p.py /tmp/__cagent_f2p__.py && chmod 644 /tmp/__cagent_f2p__.py || exit 97\n")
		fmt.Fprintf(&body, "cd %s || exit 97\n", wd)
		fmt.Fprintf(&body, "kiln_as agent bash -c %s\n", shlex.Quote("cd "+wd+" && if command -v python >/dev/null 2>&1; then python /tmp/__cagent_f2p__.py; else python3 /tmp/__cagent_f2p__.py; fi"))
		body.WriteString("rc=$?\nif [ $rc -eq 0 ]; then echo 1 > /logs/verifier/reward.txt; fi\nexit $rc\n")
	case "swebench":
		if !pytestParsers[g.LogParser] {
			return nil, fmt.Errorf("task %q: log parser %q: kiln implements only pytest's", t.TaskID, g.LogParser)
		}
		if strings.TrimSpace(g.TestCmd) == "" {
			return nil, fmt.Errorf("task %q: grading kind swebench has no test_cmd", t.TaskID)
		}
		tests["test.patch"] = g.TestPatch
		req, _ := json.Marshal(map[string][]string{"fail_to_pass": nonNil(g.FailToPass), "pass_to_pass": nonNil(g.PassToPass)})
		tests["required.json"] = string(req) + "\n"
		tests["kiln_verdict.py"] = verdictPy
		body.WriteString(swebenchScript(workdir, g))
	case "swepro":
		sp := g.SWEPro
		if sp == nil || sp.RunScript == "" && sp.ParserScript == "" {
			return nil, fmt.Errorf("task %q: grading kind swepro has no scripts", t.TaskID)
		}
		tests["run_script.sh"] = sp.RunScript
		tests["parser.py"] = sp.ParserScript
		req, _ := json.Marshal(map[string][]string{"fail_to_pass": nonNil(sp.FailToPass), "pass_to_pass": nonNil(sp.PassToPass)})
		tests["required.json"] = string(req) + "\n"
		tests["kiln_verdict.py"] = verdictPy
		body.WriteString(sweproScript(workdir, sp.SelectedTestFiles))
	default:
		return nil, fmt.Errorf("task %q: grading kind %q cannot be exported (want eval_cmd, swebench, swepro, f2p or harbor)", t.TaskID, g.Kind)
	}
	tests["test.sh"] = verifierPrologue(t.TaskID, g.Kind) + body.String()

	md := map[string]any{"kiln_task_id": t.TaskID, "kiln_grading_kind": g.Kind, "workdir": workdir}
	for k, v := range map[string]*string{"dataset": t.Dataset, "repo": t.Repo, "split": t.Split} {
		if v != nil && *v != "" {
			md[k] = *v
		}
	}
	if pre != nil {
		md["pre_commands"] = pre
		notes = append(notes, fmt.Sprintf("task %q has setup commands (pre_commands): kiln keeps them in [metadata].pre_commands and runs them; Harbor's harness does not", t.TaskID))
	}
	doc := exportTOML{SchemaVersion: "1.1", Metadata: md,
		Verifier: exportVerifier{TimeoutSec: DefaultVerifierTimeoutSec}, Environment: exportEnv{DockerImage: *t.Image}}
	if validName(t.TaskID) {
		doc.Task = &exportName{Name: t.TaskID}
	}
	var buf bytes.Buffer
	if err := toml.NewEncoder(&buf).Encode(doc); err != nil {
		return nil, fmt.Errorf("task %q: task.toml: %w", t.TaskID, err)
	}
	if err := writeFiles(dir, "", map[string]string{"task.toml": buf.String()}); err != nil {
		return nil, err
	}
	if err := writeFiles(dir, "tests", tests); err != nil {
		return nil, err
	}
	gold := o.GoldPatch
	if gold == "" {
		gold = GoldPatchOf(t)
	}
	if strings.TrimSpace(gold) != "" {
		sol := map[string]string{"gold.patch": gold, "solve.sh": solveScript(t.TaskID, workdir)}
		if err := writeFiles(dir, "solution", sol); err != nil {
			return nil, err
		}
	} else {
		notes = append(notes, fmt.Sprintf("task %q has no gold patch (give one with --solutions): it has no solution/", t.TaskID))
	}
	return notes, nil
}

func nonNil(s []string) []string {
	if s == nil {
		return []string{}
	}
	return s
}

// preCommands is what kiln-grade runs before the patch (pre_commands;
// for swepro, before_repo_set_cmd first), as the JSON value the exported
// task.toml keeps in [metadata].pre_commands; nil when there is none.
func preCommands(t *records.Task, g *exportGrading) (any, error) {
	var pre any
	if t.PreCommands != nil {
		if err := json.Unmarshal([]byte(*t.PreCommands), &pre); err != nil {
			return nil, fmt.Errorf("task %q: pre_commands is not valid JSON: %w", t.TaskID, err)
		}
		switch x := pre.(type) {
		case nil:
		case string:
			if x == "" {
				pre = nil
			}
		case []any:
			for i, item := range x {
				if _, ok := item.(string); !ok {
					return nil, fmt.Errorf("task %q: pre_commands item %d is not a string", t.TaskID, i)
				}
			}
		default:
			return nil, fmt.Errorf("task %q: pre_commands is neither a string nor a list of strings", t.TaskID)
		}
	}
	if g.Kind != "swepro" || g.SWEPro == nil || g.SWEPro.BeforeRepoSetCmd == "" {
		return pre, nil
	}
	// kiln-grade runs before_repo_set_cmd as agent in the workdir under
	// set -e, ignoring its failure, then pre_commands (§5.1 step 4-5):
	// one list keeps that order and those semantics.
	list := []any{"bash -ec " + shlex.Quote(g.SWEPro.BeforeRepoSetCmd) + " || true"}
	switch x := pre.(type) {
	case string:
		list = append(list, strings.ReplaceAll(x, `\n`, "\n"))
	case []any:
		list = append(list, x...)
	}
	return list, nil
}

// verifierPrologue starts every exported tests/test.sh: reward 0 until the
// verdict says otherwise, and kiln_as to run a step as the user kiln-grade
// runs it as (creating kiln's agent user where the image has none).
func verifierPrologue(id, kind string) string {
	return `#!/bin/bash
# The verifier of kiln task ` + shlex.Quote(id) + ` (grading kind ` + kind + `), written by
# kiln export --format harbor (kiln's docs/data-and-grading.md §7.5): it does
# what kiln-grade does for that kind and writes its reward, 1 or 0, to
# /logs/verifier/reward.txt. Run it as root.
mkdir -p /logs/verifier
echo 0 > /logs/verifier/reward.txt
# kiln_user USER: make USER (kiln's agent) where the image has none.
kiln_user() {
  id -u "$1" >/dev/null 2>&1 || useradd -m -s /bin/bash "$1" >/dev/null 2>&1 || adduser -D "$1" >/dev/null 2>&1 || true
}
# kiln_as USER CMD...: run CMD as USER, as kiln-grade runs that step.
kiln_as() {
  local u=$1; shift
  if [ "$u" = "$(id -un)" ]; then "$@"; return; fi
  kiln_user "$u"
  if command -v runuser >/dev/null 2>&1; then runuser -u "$u" -- "$@"; else su "$u" -s /bin/bash -c "$(printf '%q ' "$@")"; fi
}
`
}

// swebenchScript is the verifier body of a swebench task, as kiln-grade
// runs it (docs/data-and-grading.md §5.5): as root, reset the test patch's
// files, apply it, run the test command on the test files, and judge the
// log with kiln's pytest parser.
func swebenchScript(workdir string, g *exportGrading) string {
	var b strings.Builder
	b.WriteString("# swebench (kiln-grade: docs/data-and-grading.md §5.5), as root.\n")
	fmt.Fprintf(&b, "cd %s || exit 97\n", shlex.Quote(workdir))
	b.WriteString("cp /tests/test.patch /tmp/__kiln_tests__.patch || exit 97\n")
	ref := "HEAD"
	if g.BaseCommit != "" {
		fmt.Fprintf(&b, "R=%s; git cat-file -e \"$R^{commit}\" 2>/dev/null || R=HEAD\n", shlex.Quote(g.BaseCommit))
		ref = "$R"
	}
	for _, p := range gitdiff.Paths(g.TestPatch) {
		q := shlex.Quote(p)
		fmt.Fprintf(&b, "if git cat-file -e \"%s\":%s 2>/dev/null; then git checkout \"%s\" -- %s; else git rm -f --cached -- %s >/dev/null 2>&1 || true; rm -f -- %s; fi\n",
			ref, q, ref, q, q, q)
	}
	if strings.TrimSpace(g.TestPatch) != "" {
		b.WriteString("git apply --verbose /tmp/__kiln_tests__.patch || { echo 'the test patch did not apply to the reset test files' >&2; exit 98; }\n")
	}
	var files []string
	for _, p := range swebenchTestFiles(g) {
		files = append(files, shlex.Quote(p))
	}
	b.WriteString("set --\n")
	if len(files) > 0 {
		fmt.Fprintf(&b, "for f in %s; do if [ -e \"$f\" ]; then set -- \"$@\" \"$f\"; fi; done\n", strings.Join(files, " "))
	}
	b.WriteString("(\n" + g.TestCmd + " \"$@\"\n) > /logs/verifier/test_stdout.log 2> /logs/verifier/test_stderr.log\nrc=$?\n")
	b.WriteString("cat /logs/verifier/test_stdout.log; cat /logs/verifier/test_stderr.log >&2\n")
	b.WriteString(pythonVerdict("pytest /tests/required.json /logs/verifier/test_stdout.log /logs/verifier/test_stderr.log"))
	b.WriteString("exit $rc\n")
	return b.String()
}

// swebenchTestFiles are the files the test command runs on, as kiln-grade
// chooses them (stages/grade testFiles): the test patch's .py files and
// the file of every required pytest node id.
func swebenchTestFiles(g *exportGrading) []string {
	var out []string
	seen := map[string]bool{}
	add := func(p string) {
		if strings.HasSuffix(p, ".py") && !seen[p] {
			seen[p] = true
			out = append(out, p)
		}
	}
	for _, p := range gitdiff.Paths(g.TestPatch) {
		add(p)
	}
	for _, list := range [][]string{g.FailToPass, g.PassToPass} {
		for _, id := range list {
			if file, _, ok := strings.Cut(id, "::"); ok && !strings.ContainsAny(file, " []") {
				add(filepath.ToSlash(filepath.Clean(file)))
			}
		}
	}
	return out
}

// sweproScript is the verifier body of a SWE-bench Pro task
// (docs/data-and-grading.md §5.4): its scripts in SWEProDir, the run
// script as agent (exit ignored), the parser, then every required test
// PASSED in result.json.
func sweproScript(workdir string, selected []string) string {
	// The reference passes json.dumps of the list joined by commas.
	arg := string(ojson.AppendPy(nil, strings.Join(selected, ","), true))
	var b strings.Builder
	b.WriteString("# swepro (kiln-grade: docs/data-and-grading.md §5.4).\n")
	d := shlex.Quote(SWEProDir)
	fmt.Fprintf(&b, "kiln_user agent\nmkdir -p %s && chmod 777 %s || exit 97\n", d, d)
	fmt.Fprintf(&b, "for f in run_script.sh parser.py; do if [ -s /tests/$f ]; then cp /tests/$f %s/$f || exit 97; fi; done\n", d)
	fmt.Fprintf(&b, "chmod 755 %s/* && chown -R agent:agent %s || exit 97\n", d, d)
	fmt.Fprintf(&b, "kiln_as agent bash -c %s\n", shlex.Quote(fmt.Sprintf("cd %s && bash %s/run_script.sh %s > %s/stdout.log 2> %s/stderr.log || true",
		shlex.Quote(workdir), d, arg, d, d)))
	fmt.Fprintf(&b, "cat %s/stdout.log; cat %s/stderr.log >&2\n", d, d)
	fmt.Fprintf(&b, "kiln_as agent bash -c %s || exit 97\n", shlex.Quote(fmt.Sprintf("cd %s && python3 parser.py stdout.log stderr.log result.json", d)))
	b.WriteString(pythonVerdict("swepro /tests/required.json " + SWEProDir + "/result.json"))
	return b.String()
}

// pythonVerdict runs tests/kiln_verdict.py with python3 (else python).
func pythonVerdict(args string) string {
	return "if command -v python3 >/dev/null 2>&1; then PY=python3; else PY=python; fi\n" +
		"$PY /tests/kiln_verdict.py " + args + " || exit 97\n"
}

// solveScript is solution/solve.sh: apply the gold patch in the workdir
// the way kiln-grade applies a patch (docs/data-and-grading.md §5.2).
func solveScript(id, workdir string) string {
	return `#!/bin/bash
# The oracle of kiln task ` + shlex.Quote(id) + `, written by kiln export --format harbor:
# it applies the gold patch (solution/gold.patch) in the workdir with
# git apply, else git apply --3way, else patch -p1, as kiln-grade applies a patch.
P="$(cd "$(dirname "$0")" && pwd)/gold.patch"
cd ` + shlex.Quote(workdir) + ` || exit 1
git apply --whitespace=nowarn "$P" && exit 0
git apply --3way --whitespace=nowarn "$P" && exit 0
git checkout -- . 2>/dev/null
patch -p1 --no-backup-if-mismatch < "$P"
`
}

// writeFiles writes name->content under dir/sub: scripts (.sh) 0755, the
// rest 0644.
func writeFiles(dir, sub string, files map[string]string) error {
	d := filepath.Join(dir, sub)
	if err := os.MkdirAll(d, 0o755); err != nil {
		return err
	}
	for name, body := range files {
		mode := os.FileMode(0o644)
		if strings.HasSuffix(name, ".sh") {
			mode = 0o755
		}
		if err := os.WriteFile(filepath.Join(d, name), []byte(body), mode); err != nil {
			return err
		}
	}
	return nil
}

// writeHarborTask re-exports a task kiln-convert read from a Harbor task
// directory: its task.toml as read (every key, with the workdir and
// reward metric kiln used written into [metadata]), and its tests/,
// solution/ and (for a built image) environment/ attachments.
func writeHarborTask(dir string, t *records.Task, o ExportOptions) error {
	var md struct {
		Harbor struct {
			TaskTOML json.RawMessage `json:"task_toml"`
			Build    *struct {
				Context string `json:"context"`
			} `json:"build"`
		} `json:"harbor"`
	}
	if err := json.Unmarshal([]byte(t.Metadata), &md); err != nil {
		return fmt.Errorf("task %q: metadata: %w", t.TaskID, err)
	}
	var g Grading
	if err := json.Unmarshal([]byte(*t.Grading), &g); err != nil {
		return fmt.Errorf("task %q: grading: %w", t.TaskID, err)
	}
	raw := map[string]any{}
	if len(md.Harbor.TaskTOML) > 0 && string(md.Harbor.TaskTOML) != "null" {
		dec := json.NewDecoder(bytes.NewReader(md.Harbor.TaskTOML))
		dec.UseNumber()
		var v any
		if err := dec.Decode(&v); err != nil {
			return fmt.Errorf("task %q: metadata.harbor.task_toml: %w", t.TaskID, err)
		}
		m, ok := tomlValue(v).(map[string]any)
		if !ok {
			return fmt.Errorf("task %q: metadata.harbor.task_toml is not an object", t.TaskID)
		}
		raw = m
	}
	meta, _ := raw["metadata"].(map[string]any)
	if meta == nil {
		meta = map[string]any{}
	}
	if t.Workdir != nil && *t.Workdir != "" {
		meta["workdir"] = *t.Workdir
	}
	if g.RewardMetric != "" {
		meta["reward_metric"] = g.RewardMetric
	}
	raw["metadata"] = meta
	if md.Harbor.Build == nil && t.Image != nil && *t.Image != "" {
		env, _ := raw["environment"].(map[string]any)
		if env == nil {
			env = map[string]any{}
		}
		env["docker_image"] = *t.Image
		raw["environment"] = env
	}
	var buf bytes.Buffer
	if err := toml.NewEncoder(&buf).Encode(raw); err != nil {
		return fmt.Errorf("task %q: task.toml: %w", t.TaskID, err)
	}
	if err := os.WriteFile(filepath.Join(dir, "task.toml"), buf.Bytes(), 0o644); err != nil {
		return err
	}
	unpack := func(rel, sub string) error {
		if rel == "" {
			return nil
		}
		if o.Attachment == nil {
			return fmt.Errorf("task %q: attachment %q: no attachments to read", t.TaskID, rel)
		}
		data, err := o.Attachment(rel)
		if err != nil {
			return fmt.Errorf("task %q: %w", t.TaskID, err)
		}
		if err := os.Mkdir(filepath.Join(dir, sub), 0o755); err != nil {
			return err
		}
		if err := UntarDir(data, filepath.Join(dir, sub)); err != nil {
			return fmt.Errorf("task %q: attachment %q: %w", t.TaskID, rel, err)
		}
		return nil
	}
	if err := unpack(g.Tests, "tests"); err != nil {
		return err
	}
	if err := unpack(g.Solution, "solution"); err != nil {
		return err
	}
	if md.Harbor.Build != nil {
		return unpack(md.Harbor.Build.Context, "environment")
	}
	return nil
}

// tomlValue turns a JSON value (numbers as json.Number) back into what
// the TOML encoder writes as it was read: integers as int64, other
// numbers as float64.
func tomlValue(v any) any {
	switch x := v.(type) {
	case json.Number:
		if i, err := x.Int64(); err == nil {
			return i
		}
		f, _ := x.Float64()
		return f
	case map[string]any:
		for k, e := range x {
			x[k] = tomlValue(e)
		}
		return x
	case []any:
		for i, e := range x {
			x[i] = tomlValue(e)
		}
		return x
	}
	return v
}
