package rollout

import (
	"bytes"
	"context"
	"fmt"
	"io"
	"net/http/httptest"
	"os"
	"os/exec"
	"path/filepath"
	"runtime"
	"slices"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
	"github.com/urfave/cli/v2"

	"github.com/kilnrl/kiln/fixtures"
	"github.com/kilnrl/kiln/formats/dataset"
	"github.com/kilnrl/kiln/formats/records"
	"github.com/kilnrl/kiln/formats/store"
	"github.com/kilnrl/kiln/internal/agent/engine"
	"github.com/kilnrl/kiln/internal/agent/enginetest"
	"github.com/kilnrl/kiln/internal/agent/harness"
	"github.com/kilnrl/kiln/internal/sandbox"
	"github.com/kilnrl/kiln/internal/sandbox/sandboxtest"
	"github.com/kilnrl/kiln/internal/stagecmd"
	"github.com/kilnrl/kiln/internal/stagecmd/stagetest"
	"github.com/kilnrl/kiln/stages/convert"
	"github.com/kilnrl/kiln/stages/grade"
	"github.com/kilnrl/kiln/stages/images"
)

// runTools builds, once per test binary, the sandbox helper and the shell
// agent (cmd/kiln-agent).
var runTools = sync.OnceValues(func() (string, error) {
	dir, err := os.MkdirTemp("", "kiln-rollout-tools-")
	if err != nil {
		return "", err
	}
	if _, err := sandboxtest.BuildHelper(dir); err != nil {
		return "", err
	}
	goBin := filepath.Join(runtime.GOROOT(), "bin", "go")
	pkg := "github.com/kilnrl/kiln/cmd/kiln-agent"
	cmd := exec.Command(goBin, "build", "-o", filepath.Join(dir, harness.ShellAgentName), pkg)
	cmd.Env = append(os.Environ(), "CGO_ENABLED=0") // static: it runs on the image's libc
	if out, err := cmd.CombinedOutput(); err != nil {
		return "", fmt.Errorf("build %s: %w: %s", pkg, err, out)
	}
	return dir, nil
})

func TestMain(m *testing.M) {
	code := m.Run()
	if dir, err := runTools(); err == nil && strings.Contains(dir, "kiln-rollout-tools-") {
		os.RemoveAll(dir)
	}
	os.Exit(code)
}

// runWorld is the fixture tasks converted and their images imported, in a
// fresh store, with the sandbox helper and the shell agent built.
type runWorld struct {
	set            *fixtures.Set
	st             store.Store
	storeDir       string
	tasks, images  string
	bundles, tools string
	tokenizer      string
}

func stageCommands(env *stagecmd.Env) []*cli.Command {
	var cmds []*cli.Command
	cmds = append(cmds, convert.Commands(env)...)
	cmds = append(cmds, images.Commands(env)...)
	cmds = append(cmds, grade.Commands(env)...)
	return append(cmds, Commands(env)...)
}

func newRunWorld(t testing.TB) *runWorld {
	t.Helper()
	sandboxtest.Require(t)
	tools, err := runTools()
	require.NoError(t, err)
	// kiln-grade's sandboxes find the helper on PATH.
	t.Setenv("PATH", tools+string(os.PathListSeparator)+os.Getenv("PATH"))
	set, err := fixtures.Load(context.Background())
	require.NoError(t, err)
	home, err := os.UserHomeDir()
	require.NoError(t, err)
	w := &runWorld{set: set, storeDir: t.TempDir(), tools: tools, tokenizer: t.TempDir(),
		// The bundles kiln-grade's tests unpack, reused (same digests).
		bundles: filepath.Join(home, ".cache", "kiln", "grade-test-bundles-"+fixtures.GeneratorVersion)}
	require.NoError(t, enginetest.WriteTokenizerFiles(w.tokenizer))
	r := stagetest.Run(t, stageCommands, "mimo", "--store", w.storeDir, "--data", set.MiMoDir, "--out", "tasks")
	require.Equal(t, 0, r.Code, r.Stderr)
	w.tasks = r.LastLine()
	r = stagetest.Run(t, stageCommands, "import", "--store", w.storeDir, "--tasks", w.tasks, "--root", w.bundles,
		"--source", set.Repository+"="+"oci:"+set.Layout, "--out", "images")
	require.Equal(t, 0, r.Code, r.Stderr)
	w.images = r.LastLine()
	w.st, err = store.Open(w.storeDir)
	require.NoError(t, err)
	return w
}

// options are run options for this world against the engines at urls.
func (w *runWorld) options(urls ...string) RunOptions {
	return RunOptions{Tasks: w.tasks, Images: w.images, Bundles: w.bundles, Engines: urls, Mode: engine.ModeGenerate,
		TokenizerDir: w.tokenizer, Samples: 2, Agent: "shell", WeightsVersion: "w-test", Jobs: 4,
		Budget: time.Minute, SetupTimeout: 2 * time.Minute, Margin: 30 * time.Second,
		Temperature: 1, TopP: 1, TopK: -1, ReasoningParser: "qwen3", ToolParser: "qwen3_coder", MaxTurns: 20,
		Harness: harness.Options{ShellAgent: filepath.Join(w.tools, harness.ShellAgentName)},
		Sandbox: sandbox.Options{HelperPath: filepath.Join(w.tools, sandbox.HelperName)}}
}

func (w *runWorld) env(stdout io.Writer) *stagecmd.Env {
	return &stagecmd.Env{Stdout: stdout, Stderr: io.Discard, Log: stagecmd.NewLogger(io.Discard, false)}
}

func (w *runWorld) run(t *testing.T, ctx context.Context, name string, o RunOptions, hook func(string)) (RunResults, error, string) {
	t.Helper()
	var stdout, stderr bytes.Buffer
	env := &stagecmd.Env{Stdout: &stdout, Stderr: &stderr, Log: stagecmd.NewLogger(&stderr, false)}
	res, err := Run(ctx, env, w.st, RunOutput{Name: name, Hook: hook}, o)
	return res, err, stderr.String()
}

// behaviour is what the scripted model does in one session.
type behaviour int

const (
	fixIt      behaviour = iota // edit the files as the gold patch does, then answer
	lookAround                  // run ls, then answer: no patch
	hang                        // stop the agent's own process: it never exits
	failLater                   // one good turn, then the engine fails
	snoop                       // run scriptedModel.snoop's command, then answer
	forkBomb                    // fork without end
	flood                       // open connections to the endpoint without end (floodCommand)
)

// edit is one str_replace edit: a hunk of a gold patch.
type edit struct{ path, old, new string }

// goldEdits turns a unified diff into one edit per hunk (old = context and
// removed lines, new = context and added lines).
func goldEdits(workdir, patch string) []edit {
	var out []edit
	var file string
	var cur *edit
	for _, line := range strings.Split(patch, "\n") {
		switch {
		case strings.HasPrefix(line, "+++ b/"):
			file = workdir + "/" + strings.TrimPrefix(line, "+++ b/")
		case strings.HasPrefix(line, "--- "), strings.HasPrefix(line, "diff --git"), strings.HasPrefix(line, "index "):
			cur = nil
		case strings.HasPrefix(line, "@@"):
			out = append(out, edit{path: file})
			cur = &out[len(out)-1]
		case cur == nil:
		case strings.HasPrefix(line, " "):
			cur.old += line[1:] + "\n"
			cur.new += line[1:] + "\n"
		case strings.HasPrefix(line, "-"):
			cur.old += line[1:] + "\n"
		case strings.HasPrefix(line, "+"):
			cur.new += line[1:] + "\n"
		}
	}
	return out
}

func toolCall(name string, params ...string) string {
	var b strings.Builder
	b.WriteString("<think>\nworking\n</think>\n\n<tool_call>\n<function=" + name + ">\n")
	for i := 0; i+1 < len(params); i += 2 {
		fmt.Fprintf(&b, "<parameter=%s>\n%s\n</parameter>\n", params[i], params[i+1])
	}
	b.WriteString("</function>\n</tool_call>")
	return b.String()
}

const finalAnswer = "<think>\ndone\n</think>\n\nI am done."

// scriptedModel plays a behaviour per session, chosen by decide from the
// task (found by its problem statement in the prompt) and the number of
// sessions of that task seen before. It records the behaviour of every
// session.
type scriptedModel struct {
	set    *fixtures.Set
	decide func(task fixtures.Task, nth int) behaviour

	// snoop is the bash command of a snoop session, given the sessions
	// seen before it.
	snoop func(earlier []string) string

	mu       sync.Mutex
	seen     map[string]int
	sessions map[string]behaviour
	task     map[string]fixtures.Task
	order    []string
}

func newScriptedModel(set *fixtures.Set, decide func(fixtures.Task, int) behaviour) *scriptedModel {
	return &scriptedModel{set: set, decide: decide, seen: map[string]int{}, sessions: map[string]behaviour{}, task: map[string]fixtures.Task{}}
}

func (m *scriptedModel) behaviourOf(r enginetest.Request) (behaviour, fixtures.Task, bool) {
	m.mu.Lock()
	defer m.mu.Unlock()
	if b, ok := m.sessions[r.SessionID]; ok {
		return b, m.task[r.SessionID], true
	}
	for _, task := range m.set.Tasks {
		first, _, _ := strings.Cut(strings.TrimSpace(task.ProblemStatement), "\n")
		if strings.Contains(r.PromptText, first) {
			b := m.decide(task, m.seen[task.ID])
			m.seen[task.ID]++
			m.sessions[r.SessionID], m.task[r.SessionID] = b, task
			m.order = append(m.order, r.SessionID)
			return b, task, true
		}
	}
	return 0, fixtures.Task{}, false
}

func (m *scriptedModel) script(r enginetest.Request) enginetest.Output {
	if r.SessionID == "" {
		return enginetest.Output{Text: "ok"} // the engine probe
	}
	b, task, ok := m.behaviourOf(r)
	if !ok {
		return enginetest.Output{Err: fmt.Errorf("scripted model: no fixture task in the prompt of session %q", r.SessionID)}
	}
	switch b {
	case fixIt:
		edits := goldEdits(task.Workdir, task.GoldPatch)
		if r.Turn < len(edits) {
			e := edits[r.Turn]
			return enginetest.Output{Text: toolCall("edit", "path", e.path, "old_str", e.old, "new_str", e.new)}
		}
	case lookAround:
		if r.Turn == 0 {
			return enginetest.Output{Text: toolCall("bash", "command", "ls")}
		}
	case hang:
		return enginetest.Output{Text: toolCall("bash", "command", "kill -STOP $PPID")}
	case snoop:
		if r.Turn == 0 {
			m.mu.Lock()
			earlier := slices.Clone(m.order[:slices.Index(m.order, r.SessionID)])
			m.mu.Unlock()
			return enginetest.Output{Text: toolCall("bash", "command", m.snoop(earlier))}
		}
	case forkBomb:
		if r.Turn == 0 {
			return enginetest.Output{Text: toolCall("bash", "command", "b() { b | b & }; b")}
		}
	case flood:
		if r.Turn == 0 {
			return enginetest.Output{Text: toolCall("bash", "command", floodCommand)}
		}
	case failLater:
		if r.Turn == 0 {
			return enginetest.Output{Text: toolCall("bash", "command", "ls")}
		}
		return enginetest.Output{Err: fmt.Errorf("scripted engine failure")}
	}
	return enginetest.Output{Text: finalAnswer}
}

func (m *scriptedModel) behaviours() map[string]behaviour {
	m.mu.Lock()
	defer m.mu.Unlock()
	out := map[string]behaviour{}
	for k, v := range m.sessions {
		out[k] = v
	}
	return out
}

func startEngine(t testing.TB, s enginetest.Script) string {
	t.Helper()
	srv := httptest.NewServer(enginetest.New(enginetest.Options{Script: s, MaxModelLen: 1 << 16}))
	t.Cleanup(srv.Close)
	return srv.URL
}

func readRollouts(t testing.TB, st store.Store, ref dataset.Ref) []records.Rollout {
	t.Helper()
	v, err := dataset.Open(context.Background(), st, ref)
	require.NoError(t, err)
	var rows []records.Rollout
	require.NoError(t, v.EachShard(context.Background(), func(_ int, data []byte) error {
		return records.EachRollout(data, func(r records.Rollout) error { rows = append(rows, r); return nil })
	}))
	return rows
}

func readTurns(t testing.TB, st store.Store, ref dataset.Ref) []records.Turn {
	t.Helper()
	v, err := dataset.Open(context.Background(), st, ref)
	require.NoError(t, err)
	var out []records.Turn
	require.NoError(t, v.EachShard(context.Background(), func(_ int, data []byte) error {
		return records.EachTurn(data, func(tr *records.Turn) error { out = append(out, *tr); return nil })
	}))
	return out
}

func readSegments(t testing.TB, st store.Store, ref dataset.Ref) []records.Trajectory {
	t.Helper()
	v, err := dataset.Open(context.Background(), st, ref)
	require.NoError(t, err)
	var out []records.Trajectory
	require.NoError(t, v.EachShard(context.Background(), func(_ int, data []byte) error {
		return records.EachTrajectory(data, func(tr *records.Trajectory) error { out = append(out, *tr); return nil })
	}))
	return out
}

// TestRunEndToEnd runs the shell agent in real bwrap sandboxes on the
// fixture tasks, 2 samples each, the first sample of every task fixing the
// bug with edit calls and the second only looking around: every run has a
// row, the fixing samples' patches are non-empty and kiln-grade gives
// reward 1 to exactly them; every trained token is a sampled one with its
// logprob; a rerun finds the versions committed.
func TestRunEndToEnd(t *testing.T) {
	w := newRunWorld(t)
	model := newScriptedModel(w.set, func(_ fixtures.Task, nth int) behaviour {
		if nth == 0 {
			return fixIt
		}
		return lookAround
	})
	url := startEngine(t, model.script)
	o := w.options(url)
	o.Jobs = 2 * len(w.set.Tasks) // every run at once
	res, err, logs := w.run(t, context.Background(), "rollout/e2e", o, nil)
	require.NoError(t, err, logs)
	rows := readRollouts(t, w.st, res.Rollouts.Ref)
	turns := readTurns(t, w.st, res.Turns.Ref)
	segs := readSegments(t, w.st, res.Trajectories.Ref)
	require.Len(t, rows, 2*len(w.set.Tasks), logs)

	sessionOf := map[int64]string{}
	for _, tr := range turns {
		sessionOf[tr.RolloutID] = tr.Session
	}
	behaviours := model.behaviours()
	fixing := map[int64]bool{}
	for _, r := range rows {
		require.Nil(t, r.AbortReason, "%s sample %d aborted: %v\n%s", r.TaskID, r.Sample, deref(r.AbortReason), logs)
		assert.Equal(t, r.GroupIndex*2+r.Sample, r.Index)
		assert.Equal(t, r.Index, r.RolloutID)
		assert.Equal(t, "shell", r.Agent)
		assert.Equal(t, "w-test", r.WeightsVersion)
		assert.EqualValues(t, 0, r.AgentExitCode, "%s sample %d", r.TaskID, r.Sample)
		require.NotNil(t, r.Artifacts)
		b, ok := behaviours[sessionOf[r.RolloutID]]
		require.True(t, ok, "rollout %d has no scripted session", r.RolloutID)
		if b == fixIt {
			fixing[r.Index] = true
			assert.NotEmpty(t, r.Patch, "%s sample %d fixed nothing", r.TaskID, r.Sample)
		} else {
			assert.Empty(t, r.Patch, "%s sample %d", r.TaskID, r.Sample)
		}
		assert.Positive(t, r.Turns)
		assert.False(t, r.EndedAt.Before(r.StartedAt))
	}
	assert.Len(t, fixing, len(w.set.Tasks))

	// Every mask-1 token is a sampled token with its logprob.
	assertMaskedTokensSampled(t, turns, segs)

	// The agent's transcript is saved with the run's artifacts.
	key := *rows[0].Artifacts + "files/" + agentLogName
	data, _, err := store.ReadAll(context.Background(), w.st, key)
	require.NoError(t, err, key)
	assert.Contains(t, string(data), `"turn":0`)

	// kiln-grade --rollouts rewards exactly the fixing samples.
	var gout, gerr bytes.Buffer
	genv := &stagecmd.Env{Stdout: &gout, Stderr: &gerr, Log: stagecmd.NewLogger(&gerr, false)}
	gres, err := grade.Run(context.Background(), genv, w.st, stagecmd.Output{Name: "grades/e2e"},
		grade.Options{Tasks: w.tasks, Images: w.images, Bundles: w.bundles, Rollouts: res.Rollouts.Ref.String(), Jobs: 4, Timeout: 2 * time.Minute})
	require.NoError(t, err, gerr.String())
	v, err := dataset.Open(context.Background(), w.st, gres.Ref)
	require.NoError(t, err)
	graded := 0
	require.NoError(t, v.EachShard(context.Background(), func(_ int, data []byte) error {
		return records.EachGrade(data, func(g records.Grade) error {
			graded++
			want := 0.0
			if fixing[g.Index] {
				want = 1
			}
			assert.Equal(t, want, g.Reward, "%s sample %d: %s %s", g.TaskID, g.Sample, g.Failure, deref(g.Error))
			return nil
		})
	}))
	assert.Equal(t, len(rows), graded)

	// The same command again runs nothing and names the same versions.
	res2, err, logs := w.run(t, context.Background(), "rollout/e2e", o, nil)
	require.NoError(t, err, logs)
	assert.Equal(t, res.Trajectories.Ref, res2.Trajectories.Ref)
	assert.True(t, res2.Trajectories.Existed)
}

func deref(s *string) string {
	if s == nil {
		return ""
	}
	return *s
}

// assertMaskedTokensSampled checks that every loss-mask-1 token of segs is
// the token a turn of its rollout sampled at that position, with its
// logprob (maskedTokenErrors).
func assertMaskedTokensSampled(t *testing.T, turns []records.Turn, segs []records.Trajectory) {
	t.Helper()
	require.NotEmpty(t, segs)
	for _, e := range maskedTokenErrors(turns, segs) {
		t.Error(e)
	}
}

// maskedTokenErrors checks positions, not set membership: a turn's output
// follows its prompt in a segment (docs/assembly.md §2.2), so a turn whose
// prompt is the segment's tokens before position a sampled, at a+k, its
// k-th output token. Every loss-mask-1 position must hold the token, with
// its logprob, that such a turn sampled at that position. A token that a
// turn sampled at another position (two trained tokens swapped, a span
// shifted) is an error.
func maskedTokenErrors(turns []records.Turn, segs []records.Trajectory) []string {
	byRollout := map[int64][]records.Turn{}
	for _, tr := range turns {
		byRollout[tr.RolloutID] = append(byRollout[tr.RolloutID], tr)
	}
	var errs []string
	for _, s := range segs {
		lead := len(s.Tokens) - int(s.ResponseLength)
		// the turns whose output starts in this segment's response
		var anchored []records.Turn
		for _, tr := range byRollout[s.RolloutID] {
			if a := len(tr.PromptIDs); a >= lead && a < len(s.Tokens) && slices.Equal(tr.PromptIDs, s.Tokens[:a]) {
				anchored = append(anchored, tr)
			}
		}
		for i, m := range s.LossMask {
			if m != 1 {
				continue
			}
			pos, tok, lp := lead+i, s.Tokens[lead+i], s.RolloutLogProbs[i]
			found := false
			for _, tr := range anchored {
				k := pos - len(tr.PromptIDs)
				if k >= 0 && k < len(tr.OutputIDs) && tr.OutputIDs[k] == tok && (len(tr.OutputLogProbs) == 0 || tr.OutputLogProbs[k] == lp) {
					found = true
					break
				}
			}
			if !found {
				errs = append(errs, fmt.Sprintf("rollout %d segment %d response position %d: token %d logprob %v is trained, but no turn whose prompt ends before it sampled it at that position",
					s.RolloutID, s.Segment, i, tok, lp))
			}
		}
	}
	return errs
}
