package rollout

import (
	"bufio"
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"io/fs"
	"net"
	"net/http"
	"os"
	"os/exec"
	"path/filepath"
	"runtime/pprof"
	"slices"
	"strconv"
	"strings"
	"sync"
	"syscall"
	"testing"
	"time"

	"github.com/kilnrl/kiln/formats/dataset"
	"github.com/kilnrl/kiln/formats/records"
	"github.com/kilnrl/kiln/formats/store"
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
// sandbox.Exec, RUNS at once. The engine runs in a process of its own. It
// reports both wall times and their ratio (goal ≤ 1.3); CPU per turn split
// into this process's (kiln: the stage and its adapter; direct: the
// sandboxes' host side), the sandboxes' processes' and the engine's, with
// the CPU ratios; the p50 of each phase of a run; the time from run start
// to the first model call (p50/p99); and the growth of this process's RSS
// per concurrent run (goal ≤ 10 MB) (docs/rollout.md §6). KILN_BENCH_RUNS
// and KILN_BENCH_TURNS override the size. Each op runs both sides, so
// -benchtime 5x averages five alternations, steadier on a shared machine.
//
//	go test ./stages/rollout -run '^$' -bench '^BenchmarkRun$' -benchtime 5x
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

	// The scripted engine runs in a process of its own (this test binary
	// re-executed), so that this process's CPU is the stage's alone.
	eng := startBenchEngine(b, turns)
	url := eng.url
	o := w.options(url)
	o.Samples, o.Jobs, o.MaxTurns = samples, runs, turns+2

	ctx := context.Background()
	env := &stagecmd.Env{Stdout: nopWriter{}, Stderr: nopWriter{}, Log: stagecmd.NewLogger(nopWriter{}, false)}
	jobs := planBenchRuns(b, w, o)

	// The sandboxes' processes are counted by a cpuacct cgroup of this
	// process (created after the engine started, so the engine is not in
	// it); without one the sandbox figures are not reported.
	acct := newCPUAcct(b)

	var kilnWall, directWall time.Duration
	var kiln, direct benchCPU
	var firstCalls []time.Duration
	var rssPerRun float64
	var kilnPhases, directPhases []runPhases
	iter := 0
	for b.Loop() {
		iter++
		// kiln: the stage, every run at once. Both sides are labelled in
		// CPU profiles (-tagfocus bench=kiln, bench=direct).
		rssBefore := rssBytes()
		stopRSS, peak := sampleRSS()
		c0 := readBenchCPU(b, acct, eng)
		start := time.Now()
		var res RunResults
		var err error
		pprof.Do(ctx, pprof.Labels("bench", "kiln"), func(ctx context.Context) {
			res, err = Run(ctx, env, w.st, RunOutput{Name: fmt.Sprintf("rollout/bench-%d-%d", runs, iter)}, withWeights(o, iter))
		})
		kilnWall += time.Since(start)
		kiln.add(readBenchCPU(b, acct, eng).sub(c0))
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
		first := eng.firstCalls(b)
		for _, r := range rows {
			if r.AbortReason != nil {
				b.Fatalf("%s sample %d aborted: %s", r.TaskID, r.Sample, *r.AbortReason)
			}
			if f, ok := first[sessionOf[r.RolloutID]]; ok {
				firstCalls = append(firstCalls, f.Sub(r.StartedAt))
			}
		}
		rssPerRun = float64(max(0, int64(peak())-int64(rssBefore))) / (1 << 20) / float64(runs)
		kilnPhases = append(kilnPhases, kilnRunPhases(b, w.st, rows)...)

		// Baseline: the same sandbox work, directly.
		c0 = readBenchCPU(b, acct, eng)
		start = time.Now()
		pprof.Do(ctx, pprof.Labels("bench", "direct"), func(ctx context.Context) {
			type result struct {
				ph  runPhases
				err error
			}
			results := make(chan result, len(jobs))
			for _, j := range jobs {
				go func() {
					ph, err := directRun(ctx, o, j, turns)
					results <- result{ph, err}
				}()
			}
			for range jobs {
				r := <-results
				if r.err != nil {
					b.Fatal(r.err)
				}
				directPhases = append(directPhases, r.ph)
			}
		})
		directWall += time.Since(start)
		direct.add(readBenchCPU(b, acct, eng).sub(c0))
	}
	n := float64(iter)
	sec := func(d time.Duration) float64 { return d.Seconds() / n }
	b.ReportMetric(sec(kilnWall), "kiln-wall-s")
	b.ReportMetric(sec(directWall), "direct-wall-s")
	b.ReportMetric(float64(kilnWall)/float64(directWall), "kiln/direct")
	// CPU per turn (runs × turns model calls, or direct's runs × turns
	// steps): this process (the stage and its adapter; direct: the
	// sandboxes' host side), the sandboxes' processes (the agent and its
	// commands; direct: the commands), and the scripted engine.
	perTurn := func(d time.Duration) float64 { return float64(d.Microseconds()) / 1000 / n / float64(runs*turns) }
	b.ReportMetric(perTurn(kiln.self), "kiln-cpu-ms/turn")
	b.ReportMetric(perTurn(direct.self), "direct-cpu-ms/turn")
	b.ReportMetric(perTurn(kiln.engine), "engine-cpu-ms/turn")
	if acct != nil {
		b.ReportMetric(perTurn(kiln.sandbox), "kiln-sandbox-cpu-ms/turn")
		b.ReportMetric(perTurn(direct.sandbox), "direct-sandbox-cpu-ms/turn")
		if all := direct.self + direct.sandbox; all > 0 {
			b.ReportMetric(float64(kiln.self+kiln.sandbox+kiln.engine)/float64(all), "kiln/direct-cpu")
			// Without the scripted engine, which stands in for a GPU server.
			b.ReportMetric(float64(kiln.self+kiln.sandbox)/float64(all), "kiln/direct-cpu-no-engine")
		}
	}
	b.ReportMetric(rssPerRun, "rss-MB/run")
	if len(firstCalls) > 0 {
		ms := func(d time.Duration) float64 { return float64(d.Microseconds()) / 1000 }
		b.ReportMetric(ms(percentile(firstCalls, 50)), "first-call-p50-ms")
		b.ReportMetric(ms(percentile(firstCalls, 99)), "first-call-p99-ms")
	}
	reportPhases(b, "kiln", kilnPhases, turns)
	reportPhases(b, "direct", directPhases, turns)
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
func directRun(ctx context.Context, o RunOptions, j *runJob, turns int) (runPhases, error) {
	var ph runPhases
	t0 := time.Now()
	mark := func(d *time.Duration) { *d = time.Since(t0); t0 = time.Now() }
	opts := o.Sandbox
	opts.Rootfs, opts.Env = j.rootfs, j.env
	sb, err := sandbox.Boot(ctx, opts)
	if err != nil {
		return ph, fmt.Errorf("baseline boot %q: %w", j.rootfs, err)
	}
	defer sb.Close()
	mark(&ph.boot)
	baseline, err := workspace.Prepare(ctx, sb, j.workdir, j.setup)
	if err != nil {
		return ph, err
	}
	mark(&ph.prepare)
	for turn := 0; turn < turns-1; turn++ {
		res, err := sb.Exec(ctx, sandbox.Cmd{Argv: []string{"bash", "-c", benchCommand(turn)}, User: sandbox.Agent, Dir: j.workdir,
			Timeout: time.Minute})
		if err != nil {
			return ph, err
		}
		ph.agentCPU += res.CPU
	}
	mark(&ph.agent)
	if _, err := workspace.Diff(ctx, sb, j.workdir, baseline); err != nil {
		return ph, err
	}
	err = sb.Close()
	mark(&ph.finish)
	return ph, err
}

// runPhases is where one run's wall time went: boot (run start to a booted
// sandbox, the boot limiter's wait included), prepare (to the agent's
// start: workspace.Prepare, and for kiln the harness directory and files),
// agent (the agent's Exec, or the direct commands), and finish (patch
// capture, the session's turns, Close with its artifacts, assembly).
// agentCPU is the CPU of the agent phase's sandbox commands (the agent
// with the commands it ran; direct: the commands).
type runPhases struct{ boot, prepare, agent, finish, agentCPU time.Duration }

// kilnRunPhases reads each run's phases from its row and its sandbox's
// artifacts (sandbox.json's creation time, commands.jsonl's agent command).
func kilnRunPhases(b *testing.B, st store.Store, rows []records.Rollout) []runPhases {
	ctx := context.Background()
	get := func(key string) []byte {
		rc, _, err := st.Get(ctx, key)
		if err != nil {
			b.Fatal(err)
		}
		defer rc.Close()
		data, err := io.ReadAll(rc)
		if err != nil {
			b.Fatal(err)
		}
		return data
	}
	var out []runPhases
	for _, r := range rows {
		if r.Artifacts == nil {
			continue
		}
		var rec sandbox.SandboxRecord
		if err := json.Unmarshal(get(*r.Artifacts+"sandbox.json"), &rec); err != nil {
			b.Fatal(err)
		}
		var agent *sandbox.CommandRecord
		for line := range bytes.Lines(get(*r.Artifacts + "commands.jsonl")) {
			var c sandbox.CommandRecord
			if err := json.Unmarshal(line, &c); err != nil {
				b.Fatal(err)
			}
			if len(c.Argv) > 0 && strings.Contains(c.Argv[0], "kiln-agent") {
				agent = &c
			}
		}
		if agent == nil {
			b.Fatalf("run %d: no agent command in its commands.jsonl", r.RolloutID)
		}
		agentEnd := agent.Started.Add(time.Duration(agent.DurationMs * float64(time.Millisecond)))
		out = append(out, runPhases{boot: rec.Created.Sub(r.StartedAt), prepare: agent.Started.Sub(rec.Created),
			agent: agentEnd.Sub(agent.Started), finish: r.EndedAt.Sub(agentEnd), agentCPU: time.Duration(agent.CPUMs * float64(time.Millisecond))})
	}
	return out
}

// reportPhases reports the median of each phase
// and the agent phase's sandbox CPU per turn.
func reportPhases(b *testing.B, name string, phs []runPhases, turns int) {
	if len(phs) == 0 {
		return
	}
	med := func(f func(runPhases) time.Duration) float64 {
		ds := make([]time.Duration, len(phs))
		for i, p := range phs {
			ds[i] = f(p)
		}
		return float64(percentile(ds, 50).Microseconds()) / 1000
	}
	b.ReportMetric(med(func(p runPhases) time.Duration { return p.boot }), name+"-boot-p50-ms")
	b.ReportMetric(med(func(p runPhases) time.Duration { return p.prepare }), name+"-prepare-p50-ms")
	b.ReportMetric(med(func(p runPhases) time.Duration { return p.agent }), name+"-agent-p50-ms")
	b.ReportMetric(med(func(p runPhases) time.Duration { return p.finish }), name+"-finish-p50-ms")
	var cpu time.Duration
	for _, p := range phs {
		cpu += p.agentCPU
	}
	b.ReportMetric(float64(cpu.Microseconds())/1000/float64(len(phs)*turns), name+"-agent-cpu-ms/turn")
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

// benchCPU is CPU time split by whose it is: this process's, the
// sandboxes' processes' (cpuacct less this process), the engine process's.
type benchCPU struct{ self, sandbox, engine time.Duration }

func (c benchCPU) sub(d benchCPU) benchCPU {
	return benchCPU{c.self - d.self, c.sandbox - d.sandbox, c.engine - d.engine}
}

func (c *benchCPU) add(d benchCPU) {
	c.self, c.sandbox, c.engine = c.self+d.self, c.sandbox+d.sandbox, c.engine+d.engine
}

func readBenchCPU(b *testing.B, acct *cpuAcct, eng *benchEngine) benchCPU {
	c := benchCPU{self: selfCPU(), engine: eng.cpu(b)}
	if acct != nil {
		c.sandbox = acct.usage(b) - c.self
	}
	return c
}

// cpuAcct is a cgroup v1 cpuacct group holding this process and so every
// process it starts from then on (bwrap and everything in the sandboxes:
// the sandboxes' own cgroups are memory and pids only, docs/rollout.md §6).
type cpuAcct struct {
	dir, parent string
	base        time.Duration // this process's CPU when it joined
}

// newCPUAcct moves this process into a fresh cpuacct group, or returns nil
// where there is none to make (cgroup v2 only, not root). The process
// moves back and the group goes at the end of the benchmark. Its usage
// starts at 0, so this process's CPU before the move is subtracted.
func newCPUAcct(b *testing.B) *cpuAcct {
	const root = "/sys/fs/cgroup/cpuacct"
	self, err := os.ReadFile("/proc/self/cgroup")
	if err != nil {
		return nil
	}
	own := ""
	for line := range strings.Lines(string(self)) {
		f := strings.SplitN(strings.TrimSpace(line), ":", 3)
		if len(f) == 3 && slices.Contains(strings.Split(f[1], ","), "cpuacct") {
			own = f[2]
		}
	}
	if own == "" {
		return nil
	}
	a := &cpuAcct{parent: filepath.Join(root, own), dir: filepath.Join(root, own, fmt.Sprintf("kiln-bench-%d", os.Getpid()))}
	// An earlier -count of this process may have left the group behind.
	if err := os.Mkdir(a.dir, 0o755); err != nil && !errors.Is(err, fs.ErrExist) {
		b.Logf("no cpuacct group (%v): the sandboxes' CPU is not reported", err)
		return nil
	}
	pid := []byte(strconv.Itoa(os.Getpid()))
	if err := os.WriteFile(filepath.Join(a.dir, "cgroup.procs"), pid, 0); err != nil {
		os.Remove(a.dir)
		b.Logf("no cpuacct group (%v): the sandboxes' CPU is not reported", err)
		return nil
	}
	before := selfCPU()
	b.Cleanup(func() {
		_ = os.WriteFile(filepath.Join(a.parent, "cgroup.procs"), pid, 0)
		os.Remove(a.dir)
	})
	a.base = before
	return a
}

// usage is the group's CPU so far, with this process's CPU before it
// joined added, so that usage less selfCPU is the other processes'.
func (a *cpuAcct) usage(b *testing.B) time.Duration {
	data, err := os.ReadFile(filepath.Join(a.dir, "cpuacct.usage"))
	if err != nil {
		b.Fatal(err)
	}
	ns, err := strconv.ParseInt(strings.TrimSpace(string(data)), 10, 64)
	if err != nil {
		b.Fatal(err)
	}
	return time.Duration(ns) + a.base
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

// Environment of the benchmark's engine process.
const (
	benchEngineChild = "KILN_BENCH_ENGINE_CHILD" // "1" in the engine process
	benchEngineTurns = "KILN_BENCH_ENGINE_TURNS"
	// benchEngineProfile, set by the caller, is where the engine process
	// writes its CPU profile.
	benchEngineProfile = "KILN_BENCH_ENGINE_PROFILE"
)

// TestRunBenchEngine is BenchmarkRun's scripted engine when the test binary
// is re-executed as it (skipped otherwise): it serves on a loopback port,
// prints its URL, then answers one line per line read from stdin: "cpu"
// its own CPU time in ns, "first" a JSON object of session id to the
// unix-ns time of the session's first generation. It exits at EOF.
func TestRunBenchEngine(t *testing.T) {
	if os.Getenv(benchEngineChild) != "1" {
		t.Skip("the engine process of BenchmarkRun")
	}
	turns, err := strconv.Atoi(os.Getenv(benchEngineTurns))
	if err != nil {
		t.Fatal(err)
	}
	var mu sync.Mutex
	first := map[string]int64{}
	h := enginetest.New(enginetest.Options{MaxModelLen: 1 << 16, Script: func(r enginetest.Request) enginetest.Output {
		if r.SessionID == "" {
			return enginetest.Output{Text: "ok"} // the engine probe
		}
		mu.Lock()
		if _, ok := first[r.SessionID]; !ok {
			first[r.SessionID] = time.Now().UnixNano()
		}
		mu.Unlock()
		if r.Turn < turns-1 {
			return enginetest.Output{Text: toolCall("bash", "command", benchCommand(r.Turn))}
		}
		return enginetest.Output{Text: finalAnswer}
	}})
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	srv := &http.Server{Handler: h}
	go func() { _ = srv.Serve(ln) }()
	defer srv.Close()
	out := bufio.NewWriter(os.Stdout)
	fmt.Fprintf(out, "http://%s\n", ln.Addr())
	out.Flush()
	in := bufio.NewScanner(os.Stdin)
	for in.Scan() {
		switch in.Text() {
		case "cpu":
			fmt.Fprintln(out, selfCPU().Nanoseconds())
		case "first":
			mu.Lock()
			data, _ := json.Marshal(first)
			mu.Unlock()
			fmt.Fprintf(out, "%s\n", data)
		default:
			t.Fatalf("engine process: unknown command %q", in.Text())
		}
		out.Flush()
	}
}

// benchEngine is BenchmarkRun's handle on its engine process.
type benchEngine struct {
	url string
	in  io.WriteCloser
	out *bufio.Scanner
}

// startBenchEngine starts the engine process, scripted for sessions of
// turns model calls; it stops at the end of the benchmark.
func startBenchEngine(b *testing.B, turns int) *benchEngine {
	args := []string{"-test.run=^TestRunBenchEngine$", "-test.count=1"}
	if p := os.Getenv(benchEngineProfile); p != "" {
		args = append(args, "-test.cpuprofile="+p)
	}
	cmd := exec.Command(os.Args[0], args...)
	cmd.Env = append(os.Environ(), benchEngineChild+"=1", benchEngineTurns+"="+strconv.Itoa(turns))
	cmd.Stderr = os.Stderr
	in, err := cmd.StdinPipe()
	if err != nil {
		b.Fatal(err)
	}
	out, err := cmd.StdoutPipe()
	if err != nil {
		b.Fatal(err)
	}
	if err := cmd.Start(); err != nil {
		b.Fatal(err)
	}
	e := &benchEngine{in: in, out: bufio.NewScanner(out)}
	e.out.Buffer(nil, 16<<20)
	b.Cleanup(func() { in.Close(); _ = cmd.Wait() })
	e.url = e.line(b)
	return e
}

func (e *benchEngine) line(b *testing.B) string {
	if !e.out.Scan() {
		b.Fatalf("the engine process ended: %v", e.out.Err())
	}
	return e.out.Text()
}

func (e *benchEngine) ask(b *testing.B, cmd string) string {
	if _, err := fmt.Fprintln(e.in, cmd); err != nil {
		b.Fatal(err)
	}
	return e.line(b)
}

// cpu is the engine process's CPU time so far.
func (e *benchEngine) cpu(b *testing.B) time.Duration {
	ns, err := strconv.ParseInt(e.ask(b, "cpu"), 10, 64)
	if err != nil {
		b.Fatal(err)
	}
	return time.Duration(ns)
}

// firstCalls is the time of each session's first generation so far.
func (e *benchEngine) firstCalls(b *testing.B) map[string]time.Time {
	var m map[string]int64
	if err := json.Unmarshal([]byte(e.ask(b, "first")), &m); err != nil {
		b.Fatal(err)
	}
	out := make(map[string]time.Time, len(m))
	for k, v := range m {
		out[k] = time.Unix(0, v)
	}
	return out
}

// planBenchRuns plans the runs of o as the stage does, for a benchmark's
// baseline to do the same runs' sandbox work.
func planBenchRuns(b *testing.B, w *runWorld, o RunOptions) []*runJob {
	ctx := context.Background()
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
	return jobs
}
