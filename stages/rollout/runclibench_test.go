package rollout

import (
	"context"
	"fmt"
	"os"
	"strconv"
	"testing"
	"time"

	"github.com/kilnrl/kiln/internal/agent/enginetest"
	"github.com/kilnrl/kiln/internal/agent/harness"
	"github.com/kilnrl/kiln/internal/sandbox"
	"github.com/kilnrl/kiln/internal/stagecmd"
	"github.com/kilnrl/kiln/internal/workspace"
)

// BenchmarkRunCLIFirstCall measures, for each agent (the real pinned
// Claude Code and Codex CLIs and kiln's shell agent), the time from a
// run's start to its first model call, with RUNS runs of the agent at once
// (8; 2 with -short; KILN_BENCH_CLI_RUNS overrides) through Run in real
// bwrap sandboxes on the fixture tasks, against the scripted engine
// answering every call with a final answer at once. In the same op, the
// baseline: the same RUNS sandboxes booted the same way at once (the
// agent's mounts, the endpoint), workspace.Prepare, and /bin/true run as
// the agent user in the workdir: all a run does before its agent starts,
// so the ratio says what starting the agent up to its first request costs.
// It reports per agent first-call and baseline p50/p99 (ms) and the p50
// ratio. It skips without the CLIs (fails under CI=true), like
// TestRunCLIAgents.
//
//	go test ./stages/rollout -run '^$' -bench '^BenchmarkRunCLIFirstCall$' -benchtime 1x
func BenchmarkRunCLIFirstCall(b *testing.B) {
	requireCLIs(b)
	runs := 8
	if testing.Short() {
		runs = 2
	}
	if v, err := strconv.Atoi(os.Getenv("KILN_BENCH_CLI_RUNS")); err == nil && v > 0 {
		runs = v
	}
	w := newRunWorld(b)
	// RUNS runs over the first fixture tasks, as many samples of each as
	// it takes.
	tasks := min(runs, len(w.set.Tasks))
	samples := (runs + tasks - 1) / tasks
	runs = samples * tasks

	first := newFirstCalls()
	url := startEngine(b, first.wrap(func(r enginetest.Request) enginetest.Output {
		if r.SessionID == "" {
			return enginetest.Output{Text: "ok"} // the engine probe
		}
		return enginetest.Output{Text: finalAnswer}
	}))
	ctx := context.Background()
	env := &stagecmd.Env{Stdout: nopWriter{}, Stderr: nopWriter{}, Log: stagecmd.NewLogger(nopWriter{}, false)}

	type agentBench struct {
		name     string
		o        RunOptions
		jobs     []*runJob
		lat      []time.Duration // run start to first model call
		baseline []time.Duration // boot, Prepare, /bin/true
	}
	var agents []*agentBench
	for _, name := range []string{harness.ClaudeCodeName, harness.CodexName, harness.ShellName} {
		o := w.options(url)
		o.Tasks = writeFirstTasksWithAgents(b, w, fmt.Sprintf("tasks-first-call-%s-%d", name, tasks), tasks, name)
		o.Samples, o.Jobs, o.MaxTurns = samples, runs, 4
		jobs := planBenchRuns(b, w, o)
		agents = append(agents, &agentBench{name: name, o: o, jobs: jobs})
	}

	iter := 0
	for b.Loop() {
		iter++
		for _, a := range agents {
			res, err := Run(ctx, env, w.st, RunOutput{Name: fmt.Sprintf("rollout/first-call-%s-%d-%d", a.name, runs, iter)}, withWeights(a.o, iter))
			if err != nil {
				b.Fatalf("%s: %v", a.name, err)
			}
			rows := readRollouts(b, w.st, res.Rollouts.Ref)
			if len(rows) != runs {
				b.Fatalf("%s: %d rows, want %d", a.name, len(rows), runs)
			}
			for _, r := range rows {
				if r.AbortReason != nil {
					b.Fatalf("%s: %s sample %d aborted: %s", a.name, r.TaskID, r.Sample, *r.AbortReason)
				}
			}
			lat := first.byAgent(rows, readTurns(b, w.st, res.Turns.Ref))[a.name]
			if len(lat) != runs {
				b.Fatalf("%s: %d of %d runs made a model call", a.name, len(lat), runs)
			}
			a.lat = append(a.lat, lat...)

			ds, err := bootToTrue(ctx, a.o, a.jobs)
			if err != nil {
				b.Fatalf("%s baseline: %v", a.name, err)
			}
			a.baseline = append(a.baseline, ds...)
		}
	}
	ms := func(d time.Duration) float64 { return float64(d.Microseconds()) / 1000 }
	for _, a := range agents {
		p50, base50 := percentile(a.lat, 50), percentile(a.baseline, 50)
		b.ReportMetric(ms(p50), a.name+"-first-call-p50-ms")
		b.ReportMetric(ms(percentile(a.lat, 99)), a.name+"-first-call-p99-ms")
		b.ReportMetric(ms(base50), a.name+"-baseline-p50-ms")
		b.ReportMetric(ms(percentile(a.baseline, 99)), a.name+"-baseline-p99-ms")
		b.ReportMetric(float64(p50)/float64(base50), a.name+"-first-call/baseline")
	}
	b.ReportMetric(float64(runs), "runs")
}

// bootToTrue is the baseline of one round of runs: every job's sandbox
// booted at once as runOne boots it (its rootfs, env, the harness's
// mounts, an endpoint), workspace.Prepare, then /bin/true as the agent
// user in the workdir; each duration is from before Boot to true's exit.
func bootToTrue(ctx context.Context, o RunOptions, jobs []*runJob) ([]time.Duration, error) {
	type result struct {
		d   time.Duration
		err error
	}
	results := make(chan result, len(jobs))
	for _, j := range jobs {
		go func() {
			start := time.Now()
			opts := o.Sandbox
			opts.Rootfs, opts.Env, opts.Endpoint = j.rootfs, j.env, "127.0.0.1:9" // never dialled
			opts.Mounts = append(append([]sandbox.Mount(nil), opts.Mounts...), j.harness.Mounts()...)
			sb, err := sandbox.Boot(ctx, opts)
			if err != nil {
				results <- result{err: fmt.Errorf("boot %q: %w", j.rootfs, err)}
				return
			}
			defer sb.Close()
			if _, err := workspace.Prepare(ctx, sb, j.workdir, j.setup); err != nil {
				results <- result{err: err}
				return
			}
			if _, err := sb.Exec(ctx, sandbox.Cmd{Argv: []string{"/bin/true"}, User: sandbox.Agent, Dir: j.workdir,
				Timeout: time.Minute, Check: true}); err != nil {
				results <- result{err: err}
				return
			}
			results <- result{d: time.Since(start)}
		}()
	}
	var out []time.Duration
	var firstErr error
	for range jobs {
		r := <-results
		if r.err != nil && firstErr == nil {
			firstErr = r.err
		}
		out = append(out, r.d)
	}
	return out, firstErr
}
