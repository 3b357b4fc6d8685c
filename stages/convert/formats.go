package convert

import (
	"context"
	"crypto/sha256"
	"encoding/hex"
	"encoding/json"
	"fmt"
	"os"
	"path/filepath"
	"slices"
	"strings"

	"github.com/kilnrl/kiln/formats/records"
)

// gradeableParsers are the test-log parsers kiln's grade stage implements.
// kiln grades SWE-bench-style tasks by test name with its own parsers (it
// does not run the official SWE-bench harness, as the reference does), so a
// row naming any other parser cannot be graded: convert reports it and
// leaves it out unless --keep-ungradeable. Keep this list in step with the
// grade stage.
var gradeableParsers = []string{"pytest"}

// parserName normalizes a log parser name: SWE-rebench writes
// "parse_log_pytest", kiln says "pytest".
func parserName(s string) string { return strings.TrimPrefix(strings.TrimSpace(s), "parse_log_") }

// swebenchGrading is the payload of grading kind "swebench".
type swebenchGrading struct {
	Kind       string   `json:"kind"`
	TestPatch  string   `json:"test_patch"`
	FailToPass []string `json:"fail_to_pass"`
	PassToPass []string `json:"pass_to_pass"`
	TestCmd    string   `json:"test_cmd"`
	LogParser  string   `json:"log_parser"`
	BaseCommit string   `json:"base_commit"`
}

// swebenchTask converts a SWE-bench-style row (SWE-bench Verified,
// SWE-rebench). Required: instance_id, repo, base_commit, problem_statement,
// a non-blank test_patch whose paths stay in the repository, FAIL_TO_PASS
// and PASS_TO_PASS (lists, or JSON-encoded lists), and the image (image,
// image_name or docker_image). workdir defaults to /testbed. The test command
// and log parser come from test_cmd/log_parser or SWE-rebench's
// install_config; a row without a test command or with a parser kiln does
// not implement is ungradeable.
func swebenchTask(_ context.Context, s *rowSource, f *fields) (converted, error) {
	var c converted
	id, _ := f.str("instance_id")
	repo, err := f.str("repo")
	if err != nil {
		return c, err
	}
	base, err := f.str("base_commit")
	if err != nil {
		return c, err
	}
	ps, err := f.str("problem_statement")
	if err != nil {
		return c, err
	}
	patch, err := f.str("test_patch")
	if err != nil {
		return c, err
	}
	if strings.TrimSpace(patch) == "" {
		return c, fmt.Errorf("key \"test_patch\" is blank")
	}
	if _, err := touchedPaths(patch); err != nil {
		return c, err
	}
	f2p, err := f.list("FAIL_TO_PASS", "fail_to_pass")
	if err != nil {
		return c, err
	}
	p2p, err := f.list("PASS_TO_PASS", "pass_to_pass")
	if err != nil {
		return c, err
	}
	image, err := f.str("image", "image_name", "docker_image")
	if err != nil {
		return c, err
	}
	workdir, ok, err := f.optStr("workdir", "cwd")
	if err != nil {
		return c, err
	}
	if !ok || workdir == "" {
		workdir = "/testbed"
	}
	cmd, _, err := f.optStr("test_cmd", "test_command")
	if err != nil {
		return c, err
	}
	parser, _, err := f.optStr("log_parser")
	if err != nil {
		return c, err
	}
	if ic := f.object("install_config"); ic != nil {
		sub := &fields{m: ic, used: map[string]bool{}}
		if cmd == "" {
			if l, ok, _ := sub.optList("test_cmd"); ok {
				cmd = strings.Join(l, " && ")
			} else if s, ok, _ := sub.optStr("test_cmd"); ok {
				cmd = s
			}
		}
		if parser == "" {
			parser, _, _ = sub.optStr("log_parser")
		}
	}
	parser = parserName(parser)
	switch {
	case cmd == "":
		c.Ungradeable = "no test command (test_cmd or install_config.test_cmd)"
	case !slices.Contains(gradeableParsers, parser):
		c.Ungradeable = fmt.Sprintf("log parser %q is not implemented by kiln", parser)
	}
	grading, err := marshal(swebenchGrading{Kind: "swebench", TestPatch: patch, FailToPass: f2p, PassToPass: p2p,
		TestCmd: cmd, LogParser: parser, BaseCommit: base})
	if err != nil {
		return c, err
	}
	prompt, err := promptOf(ps)
	if err != nil {
		return c, err
	}
	root := "root"
	ds := s.opts.Dataset
	c.Task = records.Task{TaskID: id, Dataset: &ds, Repo: &repo, Prompt: prompt, ProblemStatement: &ps,
		Image: &image, Workdir: &workdir, EvalUser: &root, Grading: &grading, Metadata: f.rest()}
	c.Unit = repo
	return c, nil
}

// sweproGrading is the payload of grading kind "swepro" (docs/data-and-grading.md
// §1.7, §5.4), with the run and parser scripts embedded: they are read at
// convert time, so the task needs no host paths at grading time.
type sweproGrading struct {
	Kind   string       `json:"kind"`
	SWEPro sweproFields `json:"swepro"`
}

type sweproFields struct {
	BeforeRepoSetCmd  string   `json:"before_repo_set_cmd,omitempty"`
	SelectedTestFiles []string `json:"selected_test_files"`
	FailToPass        []string `json:"fail_to_pass"`
	PassToPass        []string `json:"pass_to_pass"`
	RunScript         string   `json:"run_script"`
	ParserScript      string   `json:"parser_script"`
}

// sweproImageRepo is where SWE-bench Pro publishes its images; a row with
// only dockerhub_tag uses it.
const sweproImageRepo = "jefzda/sweap-images"

// sweproTask converts a SWE-bench Pro row, flat (the SWE-bench Pro
// dataset's columns) or a reference row with metadata.swepro. Required:
// instance_id, problem_statement, fail_to_pass and pass_to_pass, the image
// (image, image_name, or dockerhub_tag under jefzda/sweap-images), and the
// two scripts (see sweproScriptPaths). workdir defaults to /app; repo, when
// present, is the split unit.
func sweproTask(_ context.Context, s *rowSource, f *fields) (converted, error) {
	var c converted
	id, _ := f.str("instance_id")
	repo, _, err := f.optStr("repo")
	if err != nil {
		return c, err
	}
	ps, err := f.str("problem_statement")
	if err != nil {
		return c, err
	}
	// A reference row nests the grading keys in metadata.swepro.
	spec := f
	if o := f.object("swepro"); o != nil {
		f.used["swepro"] = true
		spec = &fields{m: o, used: map[string]bool{}}
	}
	var g sweproFields
	if g.FailToPass, err = spec.list("fail_to_pass", "FAIL_TO_PASS"); err != nil {
		return c, err
	}
	if g.PassToPass, err = spec.list("pass_to_pass", "PASS_TO_PASS"); err != nil {
		return c, err
	}
	sel, ok, err := spec.optList("selected_test_files", "selected_test_files_to_run")
	if err != nil {
		return c, err
	}
	if !ok {
		sel = []string{}
	}
	g.SelectedTestFiles = sel
	if g.BeforeRepoSetCmd, _, err = spec.optStr("before_repo_set_cmd"); err != nil {
		return c, err
	}
	image, ok, err := f.optStr("image", "image_name")
	if err != nil {
		return c, err
	}
	if !ok {
		tag, err := f.str("dockerhub_tag")
		if err != nil {
			return c, fmt.Errorf("required key \"image\" (or \"image_name\", or \"dockerhub_tag\") is missing or null")
		}
		image = sweproImageRepo + ":" + tag
	}
	workdir, ok, err := f.optStr("workdir", "cwd")
	if err != nil {
		return c, err
	}
	if !ok || workdir == "" {
		workdir = "/app"
	}
	paths, err := sweproScriptPaths(s.opts.Scripts, id, spec)
	if err != nil {
		return c, err
	}
	for i, dst := range []*string{&g.RunScript, &g.ParserScript} {
		b, err := os.ReadFile(paths[i])
		if err != nil {
			return c, fmt.Errorf("script %q: %w; --scripts must hold <instance_id>/run_script.sh and <instance_id>/parser.py, or the row name them (run_script_path, parser_script_path)", paths[i], err)
		}
		*dst = string(b)
	}
	grading, err := marshal(sweproGrading{Kind: "swepro", SWEPro: g})
	if err != nil {
		return c, err
	}
	prompt, err := promptOf(ps)
	if err != nil {
		return c, err
	}
	ds := s.opts.Dataset
	c.Task = records.Task{TaskID: id, Dataset: &ds, Prompt: prompt, ProblemStatement: &ps,
		Image: &image, Workdir: &workdir, Grading: &grading, Metadata: f.rest()}
	c.Unit = id
	if repo != "" {
		c.Task.Repo = &repo
		c.Unit = repo
	}
	return c, nil
}

// sweproScriptPaths resolves a row's run and parser scripts: the row's
// run_script_path and parser_script_path (relative ones under --scripts),
// else SCRIPTS/<instance_id>/run_script.sh and parser.py.
func sweproScriptPaths(dir, id string, spec *fields) ([2]string, error) {
	var out [2]string
	for i, sc := range []struct{ key, name string }{{"run_script_path", "run_script.sh"}, {"parser_script_path", "parser.py"}} {
		p, ok, err := spec.optStr(sc.key)
		if err != nil {
			return out, err
		}
		switch {
		case ok && filepath.IsAbs(p):
			out[i] = p
			continue
		case dir == "":
			return out, fmt.Errorf("no %s: pass --scripts DIR holding <instance_id>/%s", sc.name, sc.name)
		case ok:
			out[i] = filepath.Join(dir, p)
			continue
		}
		if id == "." || id == ".." || strings.ContainsAny(id, "/\\") {
			return out, fmt.Errorf("instance id %q cannot name a scripts directory", id)
		}
		out[i] = filepath.Join(dir, id, sc.name)
	}
	return out, nil
}

// promptText is the problem statement a reference prompt gives (docs/data-and-grading.md §1.6): a
// string as is; for a message list, the first user message's text.
func promptText(raw json.RawMessage) (string, bool) {
	if isNull(raw) {
		return "", false
	}
	var s string
	if json.Unmarshal(raw, &s) == nil {
		return s, true
	}
	var msgs []struct {
		Role    string          `json:"role"`
		Content json.RawMessage `json:"content"`
	}
	if json.Unmarshal(raw, &msgs) != nil {
		return "", false
	}
	for _, m := range msgs {
		if m.Role != "user" {
			continue
		}
		if json.Unmarshal(m.Content, &s) == nil {
			return s, true
		}
		var parts []struct {
			Type string `json:"type"`
			Text string `json:"text"`
		}
		if json.Unmarshal(m.Content, &parts) == nil {
			var b strings.Builder
			for _, p := range parts {
				if p.Type == "text" {
					b.WriteString(p.Text)
				}
			}
			return b.String(), true
		}
		return "", false
	}
	return "", false
}

// f2pTask converts an f2p-script row: a self-contained pytest file carried
// verbatim (the grader writes it to a file and runs it with python in the
// workdir; exit 0 is solved). Required: instance_id (or a reference row's
// label), problem_statement (else a reference row's prompt, read as the
// reference does, docs/data-and-grading.md §1.6), image (or image_url), workdir and a non-empty
// f2p_script;
// repo is optional (the split unit when present). A reference row's prompt
// is kept as written.
func f2pTask(_ context.Context, s *rowSource, f *fields) (converted, error) {
	var c converted
	id, _ := f.str("instance_id")
	ps, ok, err := f.optStr("problem_statement")
	if err != nil {
		return c, err
	}
	if !ok {
		if ps, ok = promptText(f.prompt); !ok {
			return c, fmt.Errorf("required key \"problem_statement\" is missing or null, and the row has no prompt to take it from")
		}
	}
	image, err := f.str("image", "image_url")
	if err != nil {
		return c, err
	}
	workdir, err := f.str("workdir", "cwd")
	if err != nil {
		return c, err
	}
	script, err := f.str("f2p_script")
	if err != nil {
		return c, err
	}
	if strings.TrimSpace(script) == "" {
		return c, fmt.Errorf("key \"f2p_script\" is blank")
	}
	repo, hasRepo, err := f.optStr("repo")
	if err != nil {
		return c, err
	}
	grading, err := marshal(struct {
		Kind   string `json:"kind"`
		Script string `json:"f2p_script"`
	}{"f2p", script})
	if err != nil {
		return c, err
	}
	prompt := string(f.prompt)
	if isNull(f.prompt) {
		if prompt, err = promptOf(ps); err != nil {
			return c, err
		}
	}
	ds := s.opts.Dataset
	c.Task = records.Task{TaskID: id, Dataset: &ds, Prompt: prompt, ProblemStatement: &ps,
		Image: &image, Workdir: &workdir, Grading: &grading, Metadata: f.rest()}
	c.Unit = id
	if hasRepo && repo != "" {
		c.Task.Repo = &repo
		c.Unit = repo
	}
	return c, nil
}

// digest hashes a list of (name, sha256, size) entries into one identity.
type digest struct {
	lines []string
	size  int64
}

func newDigest() *digest { return &digest{} }

func (d *digest) add(name, sum string, size int64) {
	d.lines = append(d.lines, fmt.Sprintf("%s\x00%s\x00%d", name, sum, size))
	d.size += size
}

func (d *digest) sum() (string, int64) {
	slices.Sort(d.lines)
	h := sha256.Sum256([]byte(strings.Join(d.lines, "\n")))
	return hex.EncodeToString(h[:]), d.size
}
