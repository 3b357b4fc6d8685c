package grade

import (
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"path"
	"strings"
	"sync"
	"time"

	"github.com/kilnrl/kiln/formats/records"
	"github.com/kilnrl/kiln/internal/ojson"
	"github.com/kilnrl/kiln/internal/sandbox"
	"github.com/kilnrl/kiln/internal/shlex"
	"github.com/kilnrl/kiln/internal/workspace"
)

// Default time limits of the grading steps.
const (
	DefaultTimeout       = 600 * time.Second // each grading command (--timeout)
	DefaultApplyTimeout  = 120 * time.Second // applying the patch (docs/data-and-grading.md §5.2)
	DefaultSetupTimeout  = 600 * time.Second // pre_commands, before_repo_set_cmd (docs/data-and-grading.md §4.1)
	DefaultParserTimeout = 120 * time.Second // the SWE-bench Pro parser (docs/data-and-grading.md §5.4)
	userSetupTimeout     = 60 * time.Second  // ensure_agent_user (docs/data-and-grading.md §3.2)
)

// Target is what grading one patch needs to know about its task.
type Target struct {
	TaskID string
	// Workdir is the repository directory inside the image.
	Workdir string
	// EvalUser runs an eval_cmd ("" = agent, the reference's default).
	EvalUser string
	// PreCommands is the pre_commands script body ("" = none).
	PreCommands string
	// Grading is the decoded payload; nil = the task has no grading path.
	Grading *Grading
	// Invalid, if set, says why the task cannot be graded (a payload kiln
	// cannot decode): every patch of it is an infra_error.
	Invalid string
	// Sandbox holds the image's rootfs and environment; the grader fills
	// in the rest from its own base options.
	Sandbox     sandbox.Options
	ImageDigest string
	// Files are the tasks version's attachments the grading needs, by
	// their path there (a Harbor task's tests/ and solution/ tars).
	Files map[string][]byte
}

// Grader grades patches, each in a fresh sandbox. Its zero time limits
// take the defaults above.
type Grader struct {
	// Boot starts a sandbox (sandbox.Boot).
	Boot func(context.Context, sandbox.Options) (sandbox.Sandbox, error)
	// Base are the sandbox options every grading shares (provider, limits,
	// boot limiter); Target.Sandbox supplies Rootfs and Env.
	Base          sandbox.Options
	Timeout       time.Duration
	ApplyTimeout  time.Duration
	SetupTimeout  time.Duration
	ParserTimeout time.Duration
	// Scratch is the in-sandbox directory for the patch and scripts
	// ("/tmp" if ""); tests that run commands on the host change it.
	Scratch string
	// SWEProDir is where SWE-bench Pro's scripts go
	// ("/workspace/swepro_eval" if "", docs/data-and-grading.md §5.4).
	SWEProDir string

	closing sync.WaitGroup
}

// closeLater closes a sandbox in the background; a failure is logged (the
// verdict stands).
func (g *Grader) closeLater(sb sandbox.Sandbox, taskID string) {
	g.closing.Add(1)
	go func() {
		defer g.closing.Done()
		if err := sb.Close(); err != nil && g.Base.Log != nil {
			g.Base.Log.Warn("closing a grading sandbox failed", "task", taskID, "sandbox", sb.ID(), "err", err)
		}
	}()
}

// Wait waits until every sandbox Grade booted is closed. Callers must
// call it before they exit, or sandboxes leak (mounts, cgroups).
func (g *Grader) Wait() { g.closing.Wait() }

// Outcome is one grading's verdict and log.
type Outcome struct {
	Reward      float64
	Applied     bool
	ApplyMethod string // "" when not applied
	ExitCode    int    // the grading command's exit status; -1 if none ran
	Failure     string // records.Failure*
	Error       string
	Tests       string // JSON per-test results ("" when not test-list graded)
	// Duration is the wall time from the boot to the verdict.
	Duration time.Duration
	// Log is the grading log: a JSON header line, then one JSON line per
	// command run, with its output.
	Log []byte
}

// Fill copies the outcome into a grades row.
func (o *Outcome) Fill(g *records.Grade) {
	g.Reward, g.Applied, g.ExitCode, g.Failure = o.Reward, o.Applied, int64(o.ExitCode), o.Failure
	g.DurationMS = o.Duration.Milliseconds()
	g.ApplyMethod, g.Error, g.Tests = optional(o.ApplyMethod), optional(o.Error), optional(o.Tests)
}

func optional(s string) *string {
	if s == "" {
		return nil
	}
	return &s
}

func (g *Grader) limit(d, def time.Duration) time.Duration {
	if d > 0 {
		return d
	}
	return def
}

func (g *Grader) scratch(name string) string {
	dir := g.Scratch
	if dir == "" {
		dir = "/tmp"
	}
	return strings.TrimRight(dir, "/") + "/" + name
}

func (g *Grader) sweproDir() string {
	if g.SWEProDir != "" {
		return strings.TrimRight(g.SWEProDir, "/")
	}
	return "/workspace/swepro_eval"
}

// errTimedOut marks a step that ran out of time.
var errTimedOut = errors.New("timed out")

// Grade grades one patch on one task (docs/data-and-grading.md §5.1): a fresh sandbox from the
// task's image; the agent user; SWE-bench Pro's scripts and
// before_repo_set_cmd; pre_commands (the base the agent started from); the
// patch applied (docs/data-and-grading.md §5.2, with the worktree reset between methods); exactly
// one grading path. Every outcome, a crash or a timeout included, is an
// Outcome with a failure class; only a cancelled ctx makes Grade's result
// meaningless (the caller drops it).
func (g *Grader) Grade(ctx context.Context, t *Target, patch string) Outcome {
	return g.grade(ctx, t, patch, false)
}

// GradeSolution grades a Harbor task's oracle: its solution/solve.sh runs
// where a patch would be applied, then the verifier (docs/data-and-grading.md §7.3).
func (g *Grader) GradeSolution(ctx context.Context, t *Target) Outcome {
	return g.grade(ctx, t, "", true)
}

func (g *Grader) grade(ctx context.Context, t *Target, patch string, oracle bool) Outcome {
	start := time.Now()
	run := &run{g: g, t: t, oracle: oracle}
	run.header(patch)
	out := run.grade(ctx, patch)
	out.Duration = time.Since(start)
	out.Log = run.log.Bytes()
	return out
}

// run is one grading in progress.
type run struct {
	g      *Grader
	t      *Target
	sb     *logged
	log    bytes.Buffer
	oracle bool // run the task's solution instead of applying a patch
}

func (r *run) header(patch string) {
	kind := ""
	if r.t.Grading != nil {
		kind = r.t.Grading.Kind
	}
	r.record(map[string]any{"task_id": r.t.TaskID, "image_digest": r.t.ImageDigest, "grading_kind": kind,
		"workdir": r.t.Workdir, "patch_bytes": len(patch)})
}

func (r *run) record(v any) {
	enc := json.NewEncoder(&r.log)
	enc.SetEscapeHTML(false)
	_ = enc.Encode(v)
}

// step is one line of the grading log.
type step struct {
	Step            string `json:"step"`
	User            string `json:"user"`
	Command         string `json:"command"`
	ExitCode        int    `json:"exit_code"`
	Stdout          string `json:"stdout"`
	Stderr          string `json:"stderr"`
	StdoutTruncated bool   `json:"stdout_truncated,omitempty"`
	StderrTruncated bool   `json:"stderr_truncated,omitempty"`
	TimedOut        bool   `json:"timed_out,omitempty"`
	// Started and DurationMS place the command in time: a run's tests
	// (eval_cmd, f2p, verifier…) can be told from the sandbox's own work.
	Started    time.Time `json:"started"`
	DurationMS float64   `json:"duration_ms"`
	Error      string    `json:"error,omitempty"`
}

// logged is the sandbox as a grading uses it: every Exec and WriteFile is
// recorded in the grading log, under the name of the current step.
type logged struct {
	sandbox.Sandbox
	r    *run
	step string
}

func (l *logged) Exec(ctx context.Context, c sandbox.Cmd) (sandbox.Result, error) {
	start := time.Now()
	res, err := l.Sandbox.Exec(ctx, c)
	user := c.User
	if user == "" {
		user = sandbox.Root
	}
	s := step{Step: l.step, User: user, Command: c.String(), ExitCode: res.ExitCode, Stdout: string(res.Stdout),
		Stderr: string(res.Stderr), StdoutTruncated: res.StdoutTruncated, StderrTruncated: res.StderrTruncated,
		TimedOut: res.TimedOut, Started: start.UTC(), DurationMS: float64(res.Duration.Microseconds()) / 1000}
	var exit *sandbox.ExitError
	if err != nil && !errors.As(err, &exit) {
		s.Error = err.Error()
	}
	l.r.record(s)
	return res, err
}

func (l *logged) WriteFile(ctx context.Context, path string, data []byte, perm uint32, user string) error {
	start := time.Now()
	err := l.Sandbox.WriteFile(ctx, path, data, perm, user)
	s := step{Step: l.step, User: user, Command: fmt.Sprintf("(write %d bytes to %s)", len(data), path), Started: start.UTC(),
		DurationMS: float64(time.Since(start).Microseconds()) / 1000}
	if err != nil {
		s.ExitCode, s.Error = -1, err.Error()
	}
	l.r.record(s)
	return err
}

// exec runs a shell command in the sandbox (logged as step name). The
// error is non-nil when the command could not be run at all.
func (r *run) exec(ctx context.Context, name, user, script string, timeout time.Duration) (sandbox.Result, error) {
	r.sb.step = name
	res, err := r.sb.Exec(ctx, sandbox.Cmd{Shell: script, User: user, Timeout: timeout})
	if err != nil {
		return res, fmt.Errorf("%s: %w", name, err)
	}
	return res, nil
}

// check runs a command that must succeed.
func (r *run) check(ctx context.Context, name, user, script string, timeout time.Duration) (sandbox.Result, error) {
	res, err := r.exec(ctx, name, user, script, timeout)
	if err != nil {
		return res, err
	}
	if res.TimedOut {
		return res, fmt.Errorf("%s: %w after %s", name, errTimedOut, timeout)
	}
	if res.ExitCode != 0 {
		return res, fmt.Errorf("%s: exit %d: %s", name, res.ExitCode, lastLine(string(res.Stderr)+string(res.Stdout)))
	}
	return res, nil
}

func (r *run) write(ctx context.Context, path string, data []byte, user string) error {
	r.sb.step = "write " + path
	if err := r.sb.WriteFile(ctx, path, data, 0o644, user); err != nil {
		return fmt.Errorf("writing %s in the sandbox: %w", path, err)
	}
	return nil
}

func lastLine(s string) string {
	s = strings.TrimSpace(s)
	if i := strings.LastIndexByte(s, '\n'); i >= 0 {
		s = s[i+1:]
	}
	if len(s) > 300 {
		s = s[:300] + "..."
	}
	return s
}

func infra(err error) Outcome {
	return Outcome{ExitCode: -1, Failure: records.FailureInfraError, Error: err.Error()}
}

func (r *run) grade(ctx context.Context, patch string) Outcome {
	t := r.t
	if t.Invalid != "" {
		return infra(fmt.Errorf("task %q cannot be graded: %s", t.TaskID, t.Invalid))
	}
	if t.Grading == nil {
		// docs/data-and-grading.md §5.1 step 1: no grading path is reward 0, applied, and no
		// sandbox is created.
		return Outcome{Applied: true, ExitCode: -1, Failure: records.FailureNoGrading,
			Error: "the task has no grading payload (eval_cmd, swebench, swepro or f2p)"}
	}
	opts := r.g.Base
	opts.Rootfs, opts.Env = t.Sandbox.Rootfs, t.Sandbox.Env
	if t.Sandbox.MemoryBytes > 0 {
		opts.MemoryBytes = t.Sandbox.MemoryBytes // the task's own limit (Harbor's memory_mb)
	}
	sb, err := r.g.Boot(ctx, opts)
	if err != nil {
		r.record(step{Step: "boot", ExitCode: -1, Error: err.Error()})
		return infra(fmt.Errorf("booting a sandbox from %q: %w", opts.Rootfs, err))
	}
	r.sb = &logged{Sandbox: sb, r: r}
	// The verdict and the log are complete once the last command returns:
	// the sandbox is torn down in the background (Wait waits for it), off
	// the grading's critical path.
	defer r.g.closeLater(sb, t.TaskID)
	if err := r.setup(ctx); err != nil {
		return infra(err)
	}
	var out Outcome
	if r.oracle {
		out = r.solution(ctx)
	} else {
		out = r.apply(ctx, patch)
	}
	if !out.Applied {
		return out
	}
	var graded Outcome
	switch t.Grading.Kind {
	case KindSWEPro:
		graded = r.swepro(ctx)
	case KindEvalCmd:
		graded = r.evalCmd(ctx)
	case KindSWEBench:
		graded = r.swebench(ctx)
	case KindF2P:
		graded = r.f2p(ctx)
	case KindHarbor:
		graded = r.harbor(ctx)
	}
	graded.Applied, graded.ApplyMethod = true, out.ApplyMethod
	return graded
}

// setup re-creates the base the agent started from (docs/data-and-grading.md §5.1 steps 3-5).
func (r *run) setup(ctx context.Context) error {
	t, wd := r.t, shlex.Quote(r.t.Workdir)
	// ensure_agent_user (docs/data-and-grading.md §3.2): the workspace is the agent's and git
	// accepts it.
	r.sb.step = "ensure_agent_user"
	if err := workspace.EnsureAgentUser(ctx, r.sb, t.Workdir); err != nil {
		return err
	}
	if sp := t.Grading.SWEPro; t.Grading.Kind == KindSWEPro {
		dir := r.g.sweproDir()
		if _, err := r.check(ctx, "swepro_assets", sandbox.Root,
			"mkdir -p "+shlex.Quote(dir)+" && chmod 777 "+shlex.Quote(dir), userSetupTimeout); err != nil {
			return err
		}
		for _, f := range []struct{ name, body string }{{"run_script.sh", sp.RunScript}, {"parser.py", sp.ParserScript}} {
			if f.body != "" {
				if err := r.write(ctx, dir+"/"+f.name, []byte(f.body), sandbox.Root); err != nil {
					return err
				}
			}
		}
		if _, err := r.check(ctx, "swepro_assets_owner", sandbox.Root,
			"chmod 755 "+shlex.Quote(dir)+"/* && chown -R agent:agent "+shlex.Quote(dir), userSetupTimeout); err != nil {
			return err
		}
		if sp.BeforeRepoSetCmd != "" {
			// docs/data-and-grading.md §4.1: run as agent; its failure is ignored.
			setupDir := path.Join(path.Dir(r.g.sweproDir()), "swepro_setup")
			if _, err := r.check(ctx, "before_repo_set_dir", sandbox.Root,
				"mkdir -p "+setupDir+" && chown agent:agent "+setupDir, userSetupTimeout); err != nil {
				return err
			}
			if err := r.write(ctx, setupDir+"/before.sh", []byte("set -e\ncd "+t.Workdir+"\n"+sp.BeforeRepoSetCmd+"\n"), sandbox.Agent); err != nil {
				return err
			}
			if _, err := r.exec(ctx, "before_repo_set_cmd", sandbox.Agent, "bash "+setupDir+"/before.sh", r.g.limit(r.g.SetupTimeout, DefaultSetupTimeout)); err != nil {
				return err
			}
		}
	}
	if t.PreCommands != "" {
		f := r.g.scratch("__cagent_pre__.sh")
		if err := r.write(ctx, f, []byte("set -e\n"+t.PreCommands), sandbox.Agent); err != nil {
			return err
		}
		if _, err := r.exec(ctx, "pre_commands", sandbox.Agent, "chmod 755 "+f+" && cd "+wd+" && bash "+f,
			r.g.limit(r.g.SetupTimeout, DefaultSetupTimeout)); err != nil {
			return err
		}
	}
	return nil
}

// Apply methods, in the order they are tried (docs/data-and-grading.md §5.2).
const (
	ApplyEmpty    = "empty"
	ApplyGit      = "git_apply"
	ApplyGit3Way  = "git_apply_3way"
	ApplyPatchCmd = "patch"
)

const appliedMarker = "@@kiln-applied "

// apply applies the patch as agent. An empty (blank) patch applies
// vacuously without running anything. Otherwise the three methods are
// tried in one command, first success wins; unlike the reference, the
// worktree is reset between attempts: the paths the patch touches (and the
// index) are restored after a failed --3way, so it cannot leave conflict
// markers or a half-applied file for patch(1) to build on.
func (r *run) apply(ctx context.Context, patch string) Outcome {
	if strings.TrimSpace(patch) == "" {
		return Outcome{Applied: true, ApplyMethod: ApplyEmpty, ExitCode: -1}
	}
	p := r.g.scratch("__cagent_patch__.diff")
	if err := r.write(ctx, p, []byte(patch), sandbox.Agent); err != nil {
		return infra(err)
	}
	res, err := r.exec(ctx, "apply", sandbox.Agent, applyScript(r.t.Workdir, p, r.g.scratch("__kiln_apply__"), patchPaths(patch)),
		r.g.limit(r.g.ApplyTimeout, DefaultApplyTimeout))
	switch {
	case err != nil:
		return infra(err)
	case res.TimedOut:
		return Outcome{ExitCode: -1, Failure: records.FailureTimeout, Error: "applying the patch timed out"}
	case res.ExitCode != 0:
		return Outcome{ExitCode: -1, Failure: records.FailurePatchFailed,
			Error: fmt.Sprintf("the patch applies with none of git apply, git apply --3way, patch -p1: %s", lastLine(string(res.Stderr)))}
	}
	for _, line := range strings.Split(string(res.Stdout), "\n") {
		if m, ok := strings.CutPrefix(line, appliedMarker); ok {
			return Outcome{Applied: true, ApplyMethod: strings.TrimSpace(m), ExitCode: -1}
		}
	}
	return infra(fmt.Errorf("apply: exit 0 without naming the method that applied"))
}

// applyScript is the shell text of apply. Plain git apply is atomic (it
// changes nothing when it fails), so the touched paths and the index are
// saved only after it failed, right before --3way, and restored before
// patch(1): the common case pays for nothing but git apply.
func applyScript(workdir, patchFile, saveDir string, paths []string) string {
	var quoted, cleanup []string
	for _, p := range paths {
		quoted = append(quoted, shlex.Quote(p))
		cleanup = append(cleanup, shlex.Quote(p), shlex.Quote(p+".rej"), shlex.Quote(p+".orig"))
	}
	s, pf := shlex.Quote(saveDir), shlex.Quote(patchFile)
	var b strings.Builder
	fmt.Fprintf(&b, "cd %s || exit 97\n", shlex.Quote(workdir))
	fmt.Fprintf(&b, "if git apply --whitespace=nowarn %s; then echo '%s%s'; exit 0; fi\n", pf, appliedMarker, ApplyGit)
	fmt.Fprintf(&b, "rm -rf %s && mkdir -p %s || exit 97\n", s, s)
	b.WriteString("GI=$(git rev-parse --git-path index 2>/dev/null)\n")
	fmt.Fprintf(&b, "if [ -n \"$GI\" ] && [ -f \"$GI\" ]; then cp -p \"$GI\" %s/index || exit 97; fi\n", s)
	fmt.Fprintf(&b, ": > %s/list\n", s)
	if len(quoted) > 0 {
		fmt.Fprintf(&b, "for p in %s; do if [ -e \"$p\" ] || [ -L \"$p\" ]; then printf '%%s\\0' \"$p\" >> %s/list; fi; done\n", strings.Join(quoted, " "), s)
	}
	fmt.Fprintf(&b, "tar -cpf %s/saved.tar --null -T %s/list || exit 97\n", s, s)
	fmt.Fprintf(&b, "if git apply --3way --whitespace=nowarn %s; then echo '%s%s'; exit 0; fi\n", pf, appliedMarker, ApplyGit3Way)
	if len(cleanup) > 0 {
		fmt.Fprintf(&b, "rm -rf -- %s\n", strings.Join(cleanup, " "))
	}
	fmt.Fprintf(&b, "tar -xpf %s/saved.tar || exit 97\n", s)
	fmt.Fprintf(&b, "if [ -f %s/index ]; then cp -p %s/index \"$GI\" || exit 97; fi\n", s, s)
	fmt.Fprintf(&b, "if patch -p1 --no-backup-if-mismatch < %s; then echo '%s%s'; exit 0; fi\n", pf, appliedMarker, ApplyPatchCmd)
	b.WriteString("exit 1\n")
	return b.String()
}

// verdict classifies a finished grading command whose pass/fail is known.
func verdict(res sandbox.Result, passed bool) Outcome {
	switch {
	case res.TimedOut:
		return Outcome{ExitCode: res.ExitCode, Failure: records.FailureTimeout, Error: "the grading command timed out"}
	case passed:
		return Outcome{Reward: 1, ExitCode: res.ExitCode, Failure: records.FailureNone}
	}
	return Outcome{ExitCode: res.ExitCode, Failure: records.FailureTestsFailed}
}

// evalCmd runs the task's eval_cmd in the workdir as its eval_user
// (docs/data-and-grading.md §5.3): exit 0 is reward 1.
func (r *run) evalCmd(ctx context.Context) Outcome {
	user := r.t.EvalUser
	if user == "" {
		user = sandbox.Agent
	}
	res, err := r.exec(ctx, "eval_cmd", user, "cd "+shlex.Quote(r.t.Workdir)+" && "+r.t.Grading.EvalCmd, r.g.limit(r.g.Timeout, DefaultTimeout))
	if err != nil {
		return infra(err)
	}
	return verdict(res, res.ExitCode == 0)
}

// f2p writes the task's pytest file and runs it with python in the
// workdir as agent (docs/data-and-grading.md §1.7): exit 0 is reward 1.
func (r *run) f2p(ctx context.Context) Outcome {
	f := r.g.scratch("__cagent_f2p__.py")
	if err := r.write(ctx, f, []byte(r.t.Grading.F2PScript), sandbox.Agent); err != nil {
		return infra(err)
	}
	// Images name their interpreter python (the reference runs that);
	// Debian-like ones only have python3.
	script := "cd " + shlex.Quote(r.t.Workdir) + " && if command -v python >/dev/null 2>&1; then python " + f + "; else python3 " + f + "; fi"
	res, err := r.exec(ctx, "f2p", sandbox.Agent, script, r.g.limit(r.g.Timeout, DefaultTimeout))
	if err != nil {
		return infra(err)
	}
	return verdict(res, res.ExitCode == 0)
}

const testPatchFailed = 98

// swebench grades a SWE-bench-style task by test name, as root (docs/data-and-grading.md
// §5.5): the files the test patch touches are reset to the base commit
// (so edits the patch made to them are discarded) and the test patch
// applied, then the test command runs and its output is parsed; reward 1
// iff every FAIL_TO_PASS and PASS_TO_PASS test passed and the set is not
// empty. The test command gets the test files as arguments (testFiles).
// kiln uses its own log parsers rather than the SWE-bench harness.
func (r *run) swebench(ctx context.Context) Outcome {
	gr := r.t.Grading
	parse, err := lookupParser(gr.LogParser)
	if err != nil {
		return infra(err)
	}
	tp := r.g.scratch("__kiln_tests__.patch")
	if err := r.write(ctx, tp, []byte(gr.TestPatch), sandbox.Root); err != nil {
		return infra(err)
	}
	var b strings.Builder
	fmt.Fprintf(&b, "cd %s || exit 97\n", shlex.Quote(r.t.Workdir))
	ref := "HEAD"
	if gr.BaseCommit != "" {
		fmt.Fprintf(&b, "R=%s; git cat-file -e \"$R^{commit}\" 2>/dev/null || R=HEAD\n", shlex.Quote(gr.BaseCommit))
		ref = "$R"
	}
	for _, p := range patchPaths(gr.TestPatch) {
		q := shlex.Quote(p)
		fmt.Fprintf(&b, "if git cat-file -e \"%s\":%s 2>/dev/null; then git checkout \"%s\" -- %s; else git rm -f --cached -- %s >/dev/null 2>&1 || true; rm -f -- %s; fi\n",
			ref, q, ref, q, q, q)
	}
	if strings.TrimSpace(gr.TestPatch) != "" {
		fmt.Fprintf(&b, "git apply --verbose %s || exit %d\n", tp, testPatchFailed)
	}
	var files []string
	for _, p := range testFiles(gr) {
		files = append(files, shlex.Quote(p))
	}
	b.WriteString("set --\n")
	if len(files) > 0 {
		fmt.Fprintf(&b, "for f in %s; do if [ -e \"$f\" ]; then set -- \"$@\" \"$f\"; fi; done\n", strings.Join(files, " "))
	}
	b.WriteString(gr.TestCmd + " \"$@\"\n")
	res, err := r.exec(ctx, "swebench_tests", sandbox.Root, b.String(), r.g.limit(r.g.Timeout, DefaultTimeout))
	if err != nil {
		return infra(err)
	}
	statuses := parse(string(res.Stdout) + "\n" + string(res.Stderr))
	ok, tests := requiredPassed(statuses, gr.FailToPass, gr.PassToPass, Passed)
	out := verdict(res, ok && !res.TimedOut)
	out.Tests = tests
	if res.ExitCode == testPatchFailed && !ok {
		out.Error = "the test patch did not apply to the reset test files"
	}
	return out
}

// testFiles are the files the SWE-bench test command runs on: as
// SWE-bench and SWE-rebench do, the test patch's test files (its .py
// files), and also the file of every required pytest node id
// ("tests/test_x.py::test_y"), so a PASS_TO_PASS test in a file the test
// patch does not touch is run too. The grading script passes only those
// that exist once the test patch is applied.
func testFiles(gr *Grading) []string {
	var out []string
	seen := map[string]bool{}
	add := func(p string) {
		if strings.HasSuffix(p, ".py") && !seen[p] {
			seen[p] = true
			out = append(out, p)
		}
	}
	for _, p := range patchPaths(gr.TestPatch) {
		add(p)
	}
	for _, list := range [][]string{gr.FailToPass, gr.PassToPass} {
		for _, id := range list {
			if file, _, ok := strings.Cut(id, "::"); ok && !strings.ContainsAny(file, " []") {
				add(path.Clean(file))
			}
		}
	}
	return out
}

// requiredPassed reports whether every required test passed (and there is
// at least one), and the per-test results as JSON: each list's tests with
// their status, "MISSING" when the log does not report them.
func requiredPassed(statuses map[string]string, f2p, p2p []string, passed func(string) bool) (bool, string) {
	ok := len(f2p)+len(p2p) > 0
	view := func(names []string) map[string]string {
		m := map[string]string{}
		for _, n := range names {
			s, found := statuses[n]
			if !found {
				s = "MISSING"
			}
			m[n] = s
			ok = ok && passed(s)
		}
		return m
	}
	res := map[string]any{"fail_to_pass": view(f2p), "pass_to_pass": view(p2p), "reported": len(statuses)}
	b, _ := json.Marshal(res)
	return ok, string(b)
}

// swepro runs SWE-bench Pro's run script and parser (docs/data-and-grading.md §5.4): reward 1
// iff the required tests are non-empty and all PASSED in result.json. The
// run script's exit code is ignored.
func (r *run) swepro(ctx context.Context) Outcome {
	sp, dir := r.t.Grading.SWEPro, r.g.sweproDir()
	// The reference passes json.dumps of the list joined by commas.
	arg := string(ojson.AppendPy(nil, strings.Join(sp.SelectedTestFiles, ","), true))
	res, err := r.exec(ctx, "swepro_run", sandbox.Agent, fmt.Sprintf("cd %s && bash %s/run_script.sh %s > %s/stdout.log 2> %s/stderr.log || true",
		shlex.Quote(r.t.Workdir), dir, arg, dir, dir), r.g.limit(r.g.Timeout, DefaultTimeout))
	if err != nil {
		return infra(err)
	}
	if res.TimedOut {
		return verdict(res, false)
	}
	for _, f := range []string{"stdout.log", "stderr.log"} {
		if data, err := r.sb.ReadFile(ctx, dir+"/"+f); err == nil {
			r.record(map[string]any{"step": "swepro_" + f, "content": string(data)})
		}
	}
	pres, err := r.exec(ctx, "swepro_parser", sandbox.Agent, fmt.Sprintf("cd %s && python3 parser.py stdout.log stderr.log result.json", dir),
		r.g.limit(r.g.ParserTimeout, DefaultParserTimeout))
	if err != nil {
		return infra(err)
	}
	if pres.TimedOut {
		return Outcome{ExitCode: res.ExitCode, Failure: records.FailureTimeout, Error: "the SWE-bench Pro parser timed out"}
	}
	data, err := r.sb.ReadFile(ctx, dir+"/result.json")
	if err != nil {
		return infra(fmt.Errorf("reading result.json (parser exit %d): %w", pres.ExitCode, err))
	}
	var result struct {
		Tests []struct {
			Name   *string `json:"name"`
			Status string  `json:"status"`
		} `json:"tests"`
	}
	if len(bytes.TrimSpace(data)) > 0 {
		if err := json.Unmarshal(data, &result); err != nil {
			return infra(fmt.Errorf("result.json is not valid JSON: %w", err))
		}
	}
	// The reference's passed set is the names of the PASSED entries; other
	// statuses are kept for the log.
	statuses := map[string]string{}
	for i, tc := range result.Tests {
		switch {
		case tc.Status == StatusPassed && tc.Name == nil:
			return infra(fmt.Errorf("result.json: PASSED test %d has no name", i))
		case tc.Status == StatusPassed:
			statuses[*tc.Name] = StatusPassed
		case tc.Name != nil && statuses[*tc.Name] == "":
			statuses[*tc.Name] = tc.Status
		}
	}
	ok, tests := requiredPassed(statuses, sp.FailToPass, sp.PassToPass, func(s string) bool { return s == StatusPassed })
	out := verdict(res, ok)
	out.Tests = tests
	return out
}
