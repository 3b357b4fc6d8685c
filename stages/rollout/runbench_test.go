package rollout

import (
	"context"
	"fmt"
	"os"
	"path/filepath"
	"slices"
	"strconv"
	"strings"
	"sync"
	"syscall"
	"testing"
	"time"

	"github.com/kilnrl/kiln/formats/dataset"
	"github.com/kilnrl/kiln/internal/agent/enginetest"
	"github.com/kilnrl/kiln/internal/sandbox"
	"github.com/kilnrl/kiln/internal/stagecmd"
	"github.com/kilnrl/kiln/internal/workspace"
)

// benchCommands are the bash tool calls of a benchmark session, one per
// turn (cycled): the reads an agent makes while it looks around a repo.
var benchCommands = []string{
	"ls -la",
	"git status --short",
	"cat " + workspace.ProblemFile,
	"grep -rn import . | head -20",
	"find . -type f | head -50",
	"wc -l $(git ls-files) | tail -1",
}

// benchCommand is the bash command of a benchmark session's turn.
func benchCommand(turn int) string { return benchCommands[turn%len(benchCommands)] }

// BenchmarkRun runs RUNS concurrent shell-agent runs of TURNS model calls
// each (32 × 10; 4 × 3 with -short) through Run, kiln-rollout run's code
// path, in real bwrap sandboxes on the fixture tasks against the scripted
// engine at zero latency (each turn but the last a bash call from
// benchCommands, the last a final answer), and in the same op the
// baseline: the same sandboxes booted the same way (workspace.Prepare,
// workspace.Diff, Close) with the same commands run directly through
// sandbox.Exec, RUNS at once. It reports both wall times and their ratio
// (goal ≤ 1.3), the time from run start to the first model call
// (p50/p99), the test process's CPU per turn while the stage runs (the
// stage, its adapter and the in-process scripted engine together) and the
// growth of its RSS per concurrent run (goal ≤ 10 MB). KILN_BENCH_RUNS and
// KILN_BENCH_TURNS override the size.
//
//	go test ./stages/rollout -run '^$' -bench '^BenchmarkRun$' -benchtime 1x
func BenchmarkRun(b *testing.B) {
	runs, turns := 32, 10
	if testing.Short() {
		runs, turns = 4, 3
	}
	if v, err := strconv.Atoi(os.Getenv("KILN_BENCH_RUNS")); err == nil && v > 0 {
		runs = v
	}
	if v, err := strconv.Atoi(os.Getenv("KILN_BENCH_TURNS")); err == nil && v > 0 {
		turns = v
	}
	w := newRunWorld(b)
	samples := (runs + len(w.set.Tasks) - 1) / len(w.set.Tasks)
	runs = samples * len(w.set.Tasks)

	var mu sync.Mutex
	first := map[string]time.Time{}
	url := startEngine(b, func(r enginetest.Request) enginetest.Output {
		if r.SessionID == "" {
			return enginetest.Output{Text: "ok"} // the engine probe
		}
		mu.Lock()
		if _, ok := first[r.SessionID]; !ok {
			first[r.SessionID] = time.Now()
		}
		mu.Unlock()
		if r.Turn < turns-1 {
			return enginetest.Output{Text: toolCall("bash", "command", benchCommand(r.Turn))}
		}
		return enginetest.Output{Text: finalAnswer}
	})
	o := w.options(url)
	o.Samples, o.Jobs, o.MaxTurns = samples, runs, turns+2

	ctx := context.Background()
	env := &stagecmd.Env{Stdout: nopWriter{}, Stderr: nopWriter{}, Log: stagecmd.NewLogger(nopWriter{}, false)}
	inputs, err := stagecmd.ResolveInputs(ctx, w.st, []string{o.Tasks, o.Images}, dataset.Part{})
	if err != nil {
		b.Fatal(err)
	}
	bundles, err := filepath.Abs(o.Bundles)
	if err != nil {
		b.Fatal(err)
	}
	jobs, err := planRuns(ctx, w.st, inputs, bundles, o, dataset.Part{})
	if err != nil {
		b.Fatal(err)
	}

	var kilnWall, directWall time.Duration
	var firstCalls []time.Duration
	var cpuPerTurn, rssPerRun float64
	iter := 0
	for b.Loop() {
		iter++
		// kiln: the stage, every run at once.
		rssBefore := rssBytes()
		stopRSS, peak := sampleRSS()
		cpu0 := selfCPU()
		start := time.Now()
		res, err := Run(ctx, env, w.st, RunOutput{Name: fmt.Sprintf("rollout/bench-%d-%d", runs, iter)}, withWeights(o, iter))
		kilnWall += time.Since(start)
		cpu := selfCPU() - cpu0
		stopRSS()
		if err != nil {
			b.Fatal(err)
		}
		rows := readRollouts(b, w.st, res.Rollouts.Ref)
		trs := readTurns(b, w.st, res.Turns.Ref)
		if len(rows) != runs || len(trs) != runs*turns {
			b.Fatalf("%d rows and %d turns, want %d and %d", len(rows), len(trs), runs, runs*turns)
		}
		sessionOf := map[int64]string{}
		for _, tr := range trs {
			sessionOf[tr.RolloutID] = tr.Session
		}
		for _, r := range rows {
			if r.AbortReason != nil {
				b.Fatalf("%s sample %d aborted: %s", r.TaskID, r.Sample, *r.AbortReason)
			}
			mu.Lock()
			f, ok := first[sessionOf[r.RolloutID]]
			mu.Unlock()
			if ok {
				firstCalls = append(firstCalls, f.Sub(r.StartedAt))
			}
		}
		cpuPerTurn = float64(cpu.Microseconds()) / 1000 / float64(len(trs))
		rssPerRun = float64(max(0, int64(peak())-int64(rssBefore))) / (1 << 20) / float64(runs)

		// Baseline: the same sandbox work, directly.
		start = time.Now()
		errs := make(chan error, len(jobs))
		for _, j := range jobs {
			go func() { errs <- directRun(ctx, o, j, turns) }()
		}
		for range jobs {
			if err := <-errs; err != nil {
				b.Fatal(err)
			}
		}
		directWall += time.Since(start)
	}
	n := float64(iter)
	sec := func(d time.Duration) float64 { return d.Seconds() / n }
	b.ReportMetric(sec(kilnWall), "kiln-wall-s")
	b.ReportMetric(sec(directWall), "direct-wall-s")
	b.ReportMetric(float64(kilnWall)/float64(directWall), "kiln/direct")
	b.ReportMetric(cpuPerTurn, "cpu-ms/turn")
	b.ReportMetric(rssPerRun, "rss-MB/run")
	if len(firstCalls) > 0 {
		ms := func(d time.Duration) float64 { return float64(d.Microseconds()) / 1000 }
		b.ReportMetric(ms(percentile(firstCalls, 50)), "first-call-p50-ms")
		b.ReportMetric(ms(percentile(firstCalls, 99)), "first-call-p99-ms")
	}
	b.ReportMetric(float64(runs), "runs")
	b.ReportMetric(float64(turns), "turns/run")
}

// withWeights gives each op its own version (a fresh stage, not a resume).
func withWeights(o RunOptions, iter int) RunOptions {
	o.WeightsVersion = fmt.Sprintf("%s-bench-%d", o.WeightsVersion, iter)
	return o
}

// directRun is one baseline run: what runOne does in the sandbox, with
// the agent's bash calls run through sandbox.Exec instead of an agent and
// a model.
func directRun(ctx context.Context, o RunOptions, j *runJob, turns int) error {
	opts := o.Sandbox
	opts.Rootfs, opts.Env = j.rootfs, j.env
	sb, err := sandbox.Boot(ctx, opts)
	if err != nil {
		return fmt.Errorf("baseline boot %q: %w", j.rootfs, err)
	}
	defer sb.Close()
	baseline, err := workspace.Prepare(ctx, sb, j.workdir, j.setup)
	if err != nil {
		return err
	}
	for turn := 0; turn < turns-1; turn++ {
		if _, err := sb.Exec(ctx, sandbox.Cmd{Argv: []string{"bash", "-c", benchCommand(turn)}, User: sandbox.Agent, Dir: j.workdir,
			Timeout: time.Minute}); err != nil {
			return err
		}
	}
	if _, err := workspace.Diff(ctx, sb, j.workdir, baseline); err != nil {
		return err
	}
	return sb.Close()
}

// percentile is the p-th percentile (nearest rank) of ds.
func percentile(ds []time.Duration, p int) time.Duration {
	s := slices.Clone(ds)
	slices.Sort(s)
	i := (len(s)*p+99)/100 - 1
	return s[max(0, min(i, len(s)-1))]
}

// selfCPU is this process's user + system CPU time.
func selfCPU() time.Duration {
	var ru syscall.Rusage
	if err := syscall.Getrusage(syscall.RUSAGE_SELF, &ru); err != nil {
		panic(err)
	}
	return time.Duration(ru.Utime.Nano() + ru.Stime.Nano())
}

// rssBytes is this process's resident set size (0 if unknown).
func rssBytes() uint64 {
	data, err := os.ReadFile("/proc/self/status")
	if err != nil {
		return 0
	}
	for _, line := range strings.Split(string(data), "\n") {
		if rest, ok := strings.CutPrefix(line, "VmRSS:"); ok {
			kb, _ := strconv.ParseUint(strings.TrimSuffix(strings.TrimSpace(rest), " kB"), 10, 64)
			return kb << 10
		}
	}
	return 0
}

// sampleRSS samples the RSS every 20 ms until stop; peak is the largest.
func sampleRSS() (stop func(), peak func() uint64) {
	var mu sync.Mutex
	var top uint64
	done := make(chan struct{})
	finished := make(chan struct{})
	go func() {
		defer close(finished)
		t := time.NewTicker(20 * time.Millisecond)
		defer t.Stop()
		for {
			v := rssBytes()
			mu.Lock()
			top = max(top, v)
			mu.Unlock()
			select {
			case <-done:
				return
			case <-t.C:
			}
		}
	}()
	return func() { close(done); <-finished }, func() uint64 { mu.Lock(); defer mu.Unlock(); return top }
}

type nopWriter struct{}

func (nopWriter) Write(p []byte) (int, error) { return len(p), nil }
