package rollout

import (
	"bytes"
	"context"
	"io"
	"slices"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/kilnrl/kiln/fixtures"
	"github.com/kilnrl/kiln/formats/dataset"
	"github.com/kilnrl/kiln/formats/records"
	"github.com/kilnrl/kiln/formats/store"
	"github.com/kilnrl/kiln/internal/agent/enginetest"
	"github.com/kilnrl/kiln/internal/agent/harness"
	"github.com/kilnrl/kiln/internal/stagecmd"
	"github.com/kilnrl/kiln/internal/testenv"
	"github.com/kilnrl/kiln/stages/grade"
)

// requireCLIs skips (fails under CI=true) unless the pinned CLIs of
// scripts/install-test-deps.sh are installed.
func requireCLIs(t testing.TB) {
	t.Helper()
	for _, name := range []string{harness.ClaudeCodeName, harness.CodexName} {
		if _, err := harness.New(name, harness.Options{}); err != nil {
			testenv.SkipOrFail(t, "%s CLI not available (%v): run scripts/install-test-deps.sh", name, err)
		}
	}
}

// cliScript answers like a policy that fixes the bug in the sessions
// decide picks: the task turn with a shell tool call that applies the
// gold patch (Claude Code's Bash, Codex's exec_command), a tool result
// with a final answer, anything else (side requests) with plain text.
func cliScript(m *scriptedModel) enginetest.Script {
	return func(r enginetest.Request) enginetest.Output {
		if r.SessionID == "" {
			return enginetest.Output{Text: "ok"}
		}
		if strings.Contains(r.PromptText, "<tool_response>") {
			return enginetest.Output{Text: finalAnswer}
		}
		b, task, ok := m.behaviourOf(r)
		if !ok || b != fixIt || !strings.Contains(r.PromptText, "<tools>") {
			return enginetest.Output{Text: finalAnswer}
		}
		cmd := "cd " + task.Workdir + " && git apply <<'KILN_EOF'\n" + strings.TrimRight(task.GoldPatch, "\n") + "\nKILN_EOF"
		if strings.Contains(r.PromptText, "exec_command") {
			return enginetest.Output{Text: toolCall("exec_command", "cmd", cmd)}
		}
		return enginetest.Output{Text: toolCall("Bash", "command", cmd)}
	}
}

// firstCalls records when each session made its first model call at the
// engine (the engine probe, with no session, is none of them), for the
// time from a run's start to its first model call (TestRunCLIAgents,
// BenchmarkRunCLIFirstCall).
type firstCalls struct {
	mu sync.Mutex
	at map[string]time.Time // session -> its first call
}

func newFirstCalls() *firstCalls { return &firstCalls{at: map[string]time.Time{}} }

// wrap is s, recording each session's first call before answering it.
func (f *firstCalls) wrap(s enginetest.Script) enginetest.Script {
	return func(r enginetest.Request) enginetest.Output {
		if r.SessionID != "" {
			f.mu.Lock()
			if _, ok := f.at[r.SessionID]; !ok {
				f.at[r.SessionID] = time.Now()
			}
			f.mu.Unlock()
		}
		return s(r)
	}
}

// byAgent is, per agent, the time from each run's start (its row's
// started_at, before the session opens and the sandbox boots) to its
// session's first model call; runs that recorded no turn are left out.
func (f *firstCalls) byAgent(rows []records.Rollout, turns []records.Turn) map[string][]time.Duration {
	sessionOf := map[int64]string{}
	for _, tr := range turns {
		sessionOf[tr.RolloutID] = tr.Session
	}
	f.mu.Lock()
	defer f.mu.Unlock()
	out := map[string][]time.Duration{}
	for _, r := range rows {
		if at, ok := f.at[sessionOf[r.RolloutID]]; ok {
			out[r.Agent] = append(out[r.Agent], at.Sub(r.StartedAt))
		}
	}
	return out
}

// writeTasksWithAgents commits the tasks of w with agent columns cycling
// through agents, as a new tasks version.
func writeTasksWithAgents(t testing.TB, w *runWorld, name string, agents ...string) string {
	t.Helper()
	return writeFirstTasksWithAgents(t, w, name, -1, agents...)
}

// writeFirstTasksWithAgents is writeTasksWithAgents keeping only the first
// n tasks (all when n < 0), their task_index values unchanged.
func writeFirstTasksWithAgents(t testing.TB, w *runWorld, name string, n int, agents ...string) string {
	t.Helper()
	ctx := context.Background()
	v, err := dataset.OpenString(ctx, w.st, w.tasks)
	require.NoError(t, err)
	var rows []records.Task
	require.NoError(t, v.EachShard(ctx, func(_ int, data []byte) error {
		return records.EachTask(data, func(tk records.Task) error { rows = append(rows, tk); return nil })
	}))
	if n >= 0 && n < len(rows) {
		rows = rows[:n]
	}
	for i := range rows {
		rows[i].Agent = &agents[i%len(agents)]
	}
	spec := dataset.Spec{Name: name, Kind: records.TasksKind(), Identity: dataset.Identity{Stage: "test", CodeVersion: "1"}}
	wr, err := dataset.NewWriter(ctx, w.st, spec)
	require.NoError(t, err)
	_, err = wr.WriteShard(ctx, int64(len(rows)), nil, func(out io.Writer) error {
		enc := records.NewTaskEncoder(out)
		if err := enc.Write(rows...); err != nil {
			return err
		}
		return enc.Close()
	})
	require.NoError(t, err)
	res, err := wr.Commit(ctx, nil)
	require.NoError(t, err)
	return res.Ref.String()
}

// TestRunCLIAgents runs the real pinned Claude Code and Codex CLIs in real
// bwrap sandboxes on the fixture tasks in one invocation (the tasks' agent
// column alternating the two, several samples each, all at once): the
// first sample of each task fixes the bug through the CLI's own shell
// tool, the others answer at once. Every run has a row with its agent; the
// fixing samples have patches and the others none; every trained token is
// a recorded sampled token with its logprob; the CLI's event stream is
// saved with the artifacts.
func TestRunCLIAgents(t *testing.T) {
	requireCLIs(t)
	w := newRunWorld(t)
	model := newScriptedModel(w.set, func(_ fixtures.Task, nth int) behaviour {
		if nth == 0 {
			return fixIt
		}
		return lookAround
	})
	first := newFirstCalls()
	o := w.options(startEngine(t, first.wrap(cliScript(model))))
	o.Tasks = writeTasksWithAgents(t, w, "tasks-cli", harness.ClaudeCodeName, harness.CodexName)
	o.Samples = 2
	if !testing.Short() {
		o.Samples = 4 // the seeds' smoke shape or more: every fixture task x 4 samples at once
	}
	o.Jobs = o.Samples * len(w.set.Tasks)
	o.MaxTurns = 8
	res, err, logs := w.run(t, context.Background(), "rollout/cli", o, nil)
	require.NoError(t, err, logs)
	rows := readRollouts(t, w.st, res.Rollouts.Ref)
	turns := readTurns(t, w.st, res.Turns.Ref)
	segs := readSegments(t, w.st, res.Trajectories.Ref)
	require.Len(t, rows, o.Samples*len(w.set.Tasks), logs)

	sessionOf := map[int64]string{}
	for _, tr := range turns {
		sessionOf[tr.RolloutID] = tr.Session
	}
	behaviours := model.behaviours()
	agents := map[string]int{}
	fixing := map[int64]bool{}
	for _, r := range rows {
		require.Nil(t, r.AbortReason, "%s sample %d (%s) aborted: %v\n%s", r.TaskID, r.Sample, r.Agent, deref(r.AbortReason), logs)
		agents[r.Agent]++
		assert.EqualValues(t, 0, r.AgentExitCode, "%s sample %d (%s)", r.TaskID, r.Sample, r.Agent)
		if behaviours[sessionOf[r.RolloutID]] == fixIt {
			fixing[r.Index] = true
			assert.NotEmpty(t, r.Patch, "%s sample %d (%s) fixed nothing", r.TaskID, r.Sample, r.Agent)
			assert.GreaterOrEqual(t, r.Turns, int64(2), "the tool call, then the answer to its result")
		} else {
			assert.Empty(t, r.Patch, "%s sample %d (%s)", r.TaskID, r.Sample, r.Agent)
		}
		assert.Positive(t, r.Turns)
		require.NotNil(t, r.Artifacts)
		key := *r.Artifacts + "files/" + agentLogName
		data, _, err := store.ReadAll(context.Background(), w.st, key)
		require.NoError(t, err, key)
		assert.Contains(t, string(data), `"type"`, "%s: the CLI's JSON events", r.Agent)
	}
	wantAgents := []string{harness.ClaudeCodeName, harness.CodexName}
	got := make([]string, 0, len(agents))
	for a := range agents {
		got = append(got, a)
	}
	slices.Sort(got)
	assert.Equal(t, wantAgents[:min(len(wantAgents), len(w.set.Tasks))], got)

	assert.Len(t, fixing, len(w.set.Tasks))

	// Time from run start (boot, workspace, CLI start) to the first model
	// call, per agent, for the record (BENCHMARKS.md).
	for a, ds := range first.byAgent(rows, turns) {
		slices.Sort(ds)
		t.Logf("%s: run start to first model call over %d runs: p50 %s, max %s", a, len(ds),
			ds[len(ds)/2].Round(time.Millisecond), ds[len(ds)-1].Round(time.Millisecond))
	}

	// kiln-grade --rollouts rewards exactly the fixing samples.
	var gerr bytes.Buffer
	genv := &stagecmd.Env{Stdout: io.Discard, Stderr: &gerr, Log: stagecmd.NewLogger(&gerr, false)}
	gres, err := grade.Run(context.Background(), genv, w.st, stagecmd.Output{Name: "grades/cli"},
		grade.Options{Tasks: o.Tasks, Images: w.images, Bundles: w.bundles, Rollouts: res.Rollouts.Ref.String(), Jobs: 4, Timeout: 2 * time.Minute})
	require.NoError(t, err, gerr.String())
	gv, err := dataset.Open(context.Background(), w.st, gres.Ref)
	require.NoError(t, err)
	require.NoError(t, gv.EachShard(context.Background(), func(_ int, data []byte) error {
		return records.EachGrade(data, func(g records.Grade) error {
			want := 0.0
			if fixing[g.Index] {
				want = 1
			}
			assert.Equal(t, want, g.Reward, "%s sample %d: %s %s", g.TaskID, g.Sample, g.Failure, deref(g.Error))
			return nil
		})
	}))

	assertMaskedTokensSampled(t, turns, segs)
}
