package rollout

import (
	"context"
	"errors"
	"fmt"
	"net"
	"path"
	"strings"
	"syscall"
	"time"

	"github.com/kilnrl/kiln/formats/dataset"
	"github.com/kilnrl/kiln/formats/records"
	"github.com/kilnrl/kiln/internal/agent/adapter"
	"github.com/kilnrl/kiln/internal/agent/assembly"
	"github.com/kilnrl/kiln/internal/agent/engine"
	"github.com/kilnrl/kiln/internal/agent/harness"
	"github.com/kilnrl/kiln/internal/sandbox"
	"github.com/kilnrl/kiln/internal/workspace"
)

// agentLogName is the shell agent's transcript inside the workdir's
// harness directory (excluded from patch capture).
const agentLogName = "agent.jsonl"

// runOne runs one agent (docs/rollout.md §2.2) and returns its result.
// Every outcome but an interruption of the stage is a row: a failure of
// the run is an abort reason. res.err is set only when the stage must stop
// or was stopped (then the row says preempted and is not written).
func (p *runProducer) runOne(ctx context.Context, j *runJob) *runResult {
	res := &runResult{job: j, row: j.row}
	row := &res.row
	row.StartedAt = time.Now().UTC()
	sid := newSessionID()
	abort := func(reason, detail string) *runResult {
		// In a replay, a call the recording could not answer is why the
		// run went wrong, whatever followed (docs/rollout.md §7); a stage
		// stopping still preempts it.
		if m := p.rt.replay.failure(sid); m != "" && reason != AbortPreempted {
			reason, detail = AbortReplayMismatch, m
		}
		// The row says why (docs/rollout.md §2.4), as the log does; a
		// command's output cut at a byte count may end mid-rune.
		if detail == "" {
			detail = reason
		}
		kept := records.BoundAbortDetail(strings.ToValidUTF8(detail, "\uFFFD"))
		row.AbortReason, row.AbortDetail = &reason, &kept
		res.turns, res.segments = nil, nil
		row.EndedAt = time.Now().UTC()
		p.env.Log.Warn("run aborted", "task", row.TaskID, "rollout", row.RolloutID, "reason", reason, "detail", detail)
		return res
	}
	if j.abort != "" {
		return abort(j.abort, j.detail)
	}
	deadline := p.o.Budget + p.o.SetupTimeout + p.o.Margin
	dctx, cancel := context.WithTimeoutCause(ctx, deadline, errDeadline)
	defer cancel()
	// rctx also ends when the session's engine fails its health check, or
	// a model call's tokens report other weights than --weights.
	rctx, engineFailed := context.WithCancelCause(dctx)
	defer engineFailed(nil)
	// interrupted is the abort of a run its context ended: its engine
	// failing or generating with other weights than --weights, the stage
	// stopping (preempted: not written, redone by the
	// rerun), or the whole-run deadline.
	interrupted := func(err error) *runResult {
		var down *engineDownError
		if errors.As(context.Cause(rctx), &down) {
			return abort(AbortEngineError, down.Error())
		}
		var changed *weightsChangedError
		if errors.As(context.Cause(rctx), &changed) {
			return abort(AbortWeightsChanged, changed.Error())
		}
		var flood *endpointFloodError
		if errors.As(context.Cause(rctx), &flood) {
			return abort(AbortEndpointFlood, flood.Error())
		}
		if ctx.Err() != nil {
			res.err = context.Cause(ctx)
			return abort(AbortPreempted, err.Error())
		}
		return abort(AbortDeadline, fmt.Sprintf("the run passed its deadline of %s: %v", deadline, err))
	}

	sampling := engine.SamplingParams{MaxTokens: p.o.MaxTokens, Temperature: &p.o.Temperature, TopP: &p.o.TopP, TopK: &p.o.TopK,
		StopTokenIDs: p.o.StopTokenIDs}
	// A replay answers the session from the recording of its rollout.
	p.rt.replay.open(sid, row.RolloutID)
	defer p.rt.replay.drop(sid)
	so := adapter.SessionOptions{RolloutID: row.RolloutID, Index: row.Index, GroupIndex: row.GroupIndex,
		Sampling: &sampling, MaxContextTokens: p.o.MaxContextTokens}
	if p.o.Seed != nil {
		s := adapter.TurnSeed(*p.o.Seed, int(row.RolloutID))
		so.Seed = &s
	}
	eng, err := p.rt.front.open(sid, so, engineFailed)
	if errors.Is(err, errNoEngine) {
		res.err = err // the stage stops; the rerun runs it
		return abort(AbortPreempted, err.Error())
	}
	if err != nil {
		return abort(abortExceptionPref+"adapter", err.Error())
	}
	sessionOpen := true
	finishSession := func() ([]records.Turn, sessionErrors, error) {
		sessionOpen = false
		errs := p.rt.front.close(sid)
		turns, err := p.rt.front.adapters[eng].Finish(sid)
		return turns, errs, err
	}
	defer func() {
		if sessionOpen {
			p.rt.front.close(sid)
			p.rt.front.adapters[eng].Drop(sid)
		}
	}()

	// The run's artifacts: an attachment of the rollouts version, under a
	// prefix of this attempt (a rerun of an unfinished run writes anew).
	artifacts := dataset.AttachmentKey(p.ws[0].Ref(), fmt.Sprintf("runs/%s/%s/", j.key, sid[len(sid)-8:]))
	logFile := path.Join(j.workdir, workspace.HarnessDir, agentLogName)
	sb, err := sandbox.Boot(rctx, p.sandboxOptions(ctx, j, artifacts, logFile, engineFailed))
	if err != nil {
		if rctx.Err() != nil {
			return interrupted(err)
		}
		return abort(abortExceptionPref+"sandbox_boot", err.Error())
	}
	closed := false
	closeSandbox := func() {
		if !closed {
			closed = true
			if err := sb.Close(); err != nil {
				p.env.Log.Warn("closing an agent sandbox failed", "task", row.TaskID, "rollout", row.RolloutID, "err", err)
			}
		}
	}
	defer closeSandbox()
	row.Artifacts = &artifacts

	ares, patch, step, err := p.runAgent(rctx, sb, j, row, sid, logFile)
	if err != nil {
		if rctx.Err() != nil {
			return interrupted(err)
		}
		return abort(abortExceptionPref+step, err.Error())
	}
	row.Patch = patch
	turns, serverErrors, err := finishSession()
	if err != nil {
		return abort(abortExceptionPref+"adapter", err.Error())
	}
	closeSandbox() // saves the artifacts (the agent's log among them)
	row.Turns = int64(len(turns))
	for _, t := range turns {
		row.PromptTokens += int64(len(t.PromptIDs))
		row.OutputTokens += int64(len(t.OutputIDs))
	}
	if err := rctx.Err(); err != nil {
		return interrupted(context.Cause(rctx))
	}
	if reason, detail := p.failure(sid, serverErrors, ares, len(turns)); reason != "" {
		return abort(reason, detail)
	}
	segs, err := assembleSession(&session{id: sid, turns: turns}, assembly.Options{})
	if err != nil {
		return abort(abortExceptionPref+"assembly", err.Error())
	}
	res.turns, res.segments = turns, segs
	row.EndedAt = time.Now().UTC()
	return res
}

// sandboxOptions are the options of run j's sandbox: the task's image and
// environment, the harness's mounts, the endpoint served by the adapter
// (an agent flooding it ends its own run, and only its own), and the
// artifacts (the agent's log among them) saved under the attachment
// prefix artifacts.
func (p *runProducer) sandboxOptions(ctx context.Context, j *runJob, artifacts, logFile string, engineFailed context.CancelCauseFunc) sandbox.Options {
	opts := p.o.Sandbox
	opts.Rootfs, opts.Env = j.rootfs, j.env
	opts.ServeEndpoint = func(ln net.Listener) {
		p.rt.serve(ln, func(max int) { engineFailed(&endpointFloodError{max: max}) })
	}
	opts.Mounts = append(append([]sandbox.Mount(nil), opts.Mounts...), j.harness.Mounts()...)
	opts.Artifacts = storeSink{ctx: context.WithoutCancel(ctx), st: p.st, prefix: artifacts}
	opts.ArtifactFiles = []string{logFile}
	opts.BootLimiter = p.rt.boots
	if opts.Log == nil {
		opts.Log = p.env.Log
	}
	return opts
}

// runAgent runs j's agent in sb: it prepares the workspace, writes the
// harness's files, runs the agent for the budget (its exit code goes in
// row), kills what it left running and captures the patch. On an error,
// step names what failed (workspace, harness_config, agent_exec,
// patch_capture: the exception abort reasons' suffixes, docs/rollout.md
// §2.4).
func (p *runProducer) runAgent(ctx context.Context, sb sandbox.Sandbox, j *runJob, row *records.Rollout, sid, logFile string) (_ sandbox.Result, patch, step string, _ error) {
	baseline, err := workspace.Prepare(ctx, sb, j.workdir, j.setup)
	if err != nil {
		return sandbox.Result{}, "", "workspace", err
	}
	spec := harness.RunSpec{SessionID: sid, BaseURL: "http://" + sb.Endpoint(), Model: agentModel, Workdir: j.workdir,
		TaskFile: path.Join(j.workdir, workspace.ProblemFile), Budget: p.o.Budget, LogFile: logFile}
	for _, f := range j.harness.Files(spec) {
		if err := sb.WriteFile(ctx, f.Path, f.Data, f.Perm, f.User); err != nil {
			return sandbox.Result{}, "", "harness_config", err
		}
	}
	argv, env := j.harness.Command(spec)
	ares, err := sb.Exec(ctx, sandbox.Cmd{Argv: argv, Env: env, User: sandbox.Agent, Dir: j.workdir, Timeout: p.o.Budget + agentGrace})
	if err != nil {
		return sandbox.Result{}, "", "agent_exec", err
	}
	row.AgentExitCode = int64(ares.ExitCode)
	if ares.TimedOut {
		row.AgentExitCode = sandbox.BudgetExceeded
	}
	// The agent is gone (its process tree is killed at the budget); what
	// it left running in the background is killed too, so the workspace no
	// longer changes under the capture. Kill starts no process, so a
	// sandbox at its pids limit (a fork bomb) is emptied as well; if it
	// fails, the capture goes ahead (and may fail too).
	if err := sb.Kill(ctx, sandbox.Agent); err != nil && ctx.Err() == nil {
		p.env.Log.Warn("killing what the agent left running failed", "task", row.TaskID, "rollout", row.RolloutID, "err", err)
	}
	patch, err = workspace.Diff(ctx, sb, j.workdir, baseline)
	if err != nil {
		return ares, "", "patch_capture", err
	}
	return ares, patch, "", nil
}

// failure is why a finished run is aborted after all ("" when it is not):
// a replay the recording could not answer (abort fills in the mismatch),
// model calls that failed with a server error and an agent that then
// failed, an agent that crashed, or one that made no model call.
func (p *runProducer) failure(sid string, serverErrors sessionErrors, ares sandbox.Result, turns int) (reason, detail string) {
	switch {
	case p.rt.replay.failure(sid) != "":
		return AbortReplayMismatch, ""
	case serverErrors.n > 0 && ares.ExitCode != 0:
		return AbortEngineError, fmt.Sprintf("%d model calls failed with a server error (the first: %s); the agent exited %d: %s",
			serverErrors.n, serverErrors.first, ares.ExitCode, lastLines(ares.Stderr))
	case !ares.TimedOut && ares.ExitCode >= 126:
		return AbortAgentCrash, fmt.Sprintf("the agent exited %d (%s): %s", ares.ExitCode, crashCause(ares.ExitCode), lastLines(ares.Stderr))
	case turns == 0:
		return AbortSessionEmpty, fmt.Sprintf("the agent made no model call (exit %d): %s", ares.ExitCode, lastLines(ares.Stderr))
	}
	return "", ""
}

// errDeadline is the cause of a run context that passed its deadline.
var errDeadline = errors.New("whole-run deadline")

// crashCause reads an agent_crash exit status the shell's way: 126 and
// 127 say the command could not run, 128+n that signal n killed it.
func crashCause(code int) string {
	switch {
	case code == 126:
		return "not executable"
	case code == 127:
		return "command not found"
	case code > 128 && code < 128+65:
		return fmt.Sprintf("killed by signal %d, %s", code-128, syscall.Signal(code-128))
	}
	return "not runnable, or killed by a signal"
}

// lastLines is the end of a command's output, for a log line.
func lastLines(b []byte) string {
	s := strings.TrimSpace(string(b))
	if len(s) > 400 {
		s = "..." + s[len(s)-400:]
	}
	return s
}
