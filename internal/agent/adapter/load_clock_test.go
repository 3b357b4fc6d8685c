package adapter_test

import (
	"context"
	"fmt"
	"io"
	"net/http"
	"net/http/httptrace"
	"os"
	"os/exec"
	"runtime"
	"runtime/metrics"
	"slices"
	"strconv"
	"strings"
	"sync"
	"testing"
	"time"

	"golang.org/x/sys/unix"
)

// The adapter's own clock on each turn, kept inside the adapter process of
// the load benchmark: when its handler had the request's head (Start) and
// its whole body (Read), when it returned with the reply written and
// flushed (End), and how long the turn's engine calls took as the adapter
// saw them (each from its RoundTrip's start to its reply body being closed,
// by a Transport wrapped around engine.NewHTTPClient's). A turn's own
// added latency is End − Read − Engine: the time the adapter spent on the
// turn by its own clock, engine calls left out. The parent joins these to
// the client's spans and the engine handler's holds (turnPhases) to split
// the client-side added latency into where it was spent.

// turnTiming is one turn as the adapter process timed it. Times are Unix
// ns (the parent compares them with its own clock: CLOCK_REALTIME on one
// machine), durations ns.
type turnTiming struct {
	Start, Read, End int64
	// Engine is the time in engine calls; ConnWait the part of it spent
	// getting a connection from the pool (or dialing one: Dials counts
	// the calls that did not reuse one).
	Engine, ConnWait int64
	Calls, Dials     int
}

// turnClock collects the turnTimings of the adapter process, by session,
// in the order their turns ended (a session's turns run one at a time).
type turnClock struct {
	mu sync.Mutex
	by map[string][]turnTiming
}

type clockKey struct{}

// turnRec is the turn in progress, found by the engine calls in their
// request's context.
type turnRec struct {
	mu sync.Mutex
	t  turnTiming
}

// wrap times every POST /v1/messages on its way to h. The session is the
// one the benchmark's client names in x-api-key.
func (c *turnClock) wrap(h http.Handler) http.Handler {
	return http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		if r.URL.Path != "/v1/messages" {
			h.ServeHTTP(w, r)
			return
		}
		rec := &turnRec{t: turnTiming{Start: time.Now().UnixNano()}}
		r.Body = &readClock{ReadCloser: r.Body, want: r.ContentLength, rec: rec}
		h.ServeHTTP(w, r.WithContext(context.WithValue(r.Context(), clockKey{}, rec)))
		rec.mu.Lock()
		rec.t.End = time.Now().UnixNano()
		t := rec.t
		rec.mu.Unlock()
		sid := r.Header.Get("x-api-key")
		c.mu.Lock()
		if c.by == nil {
			c.by = map[string][]turnTiming{}
		}
		c.by[sid] = append(c.by[sid], t)
		c.mu.Unlock()
	})
}

// take returns what has been collected and forgets it.
func (c *turnClock) take() map[string][]turnTiming {
	c.mu.Lock()
	defer c.mu.Unlock()
	by := c.by
	c.by = nil
	return by
}

// readClock notes when the request body has been read whole (its length
// reached, or EOF).
type readClock struct {
	io.ReadCloser
	want, n int64
	rec     *turnRec
}

func (r *readClock) Read(p []byte) (int, error) {
	n, err := r.ReadCloser.Read(p)
	r.n += int64(n)
	if (err != nil || (r.want > 0 && r.n >= r.want)) && r.rec != nil {
		r.rec.mu.Lock()
		r.rec.t.Read = time.Now().UnixNano()
		r.rec.mu.Unlock()
		r.rec = nil
	}
	return n, err
}

// clockTransport times each engine call of a timed turn on its way to base.
type clockTransport struct{ base http.RoundTripper }

func (t clockTransport) RoundTrip(req *http.Request) (*http.Response, error) {
	rec, _ := req.Context().Value(clockKey{}).(*turnRec)
	if rec == nil {
		return t.base.RoundTrip(req)
	}
	start := time.Now()
	var got time.Time
	var dialed bool
	trace := &httptrace.ClientTrace{GotConn: func(i httptrace.GotConnInfo) { got, dialed = time.Now(), !i.Reused }}
	resp, err := t.base.RoundTrip(req.WithContext(httptrace.WithClientTrace(req.Context(), trace)))
	done := func() {
		end := time.Now()
		rec.mu.Lock()
		defer rec.mu.Unlock()
		rec.t.Calls++
		rec.t.Engine += int64(end.Sub(start))
		if !got.IsZero() {
			rec.t.ConnWait += int64(got.Sub(start))
		}
		if dialed {
			rec.t.Dials++
		}
	}
	if err != nil {
		done()
		return nil, err
	}
	resp.Body = &closeClock{ReadCloser: resp.Body, done: done}
	return resp, nil
}

// closeClock calls done once, when the body is closed (the engine client
// closes it after reading it whole).
type closeClock struct {
	io.ReadCloser
	once sync.Once
	done func()
}

func (c *closeClock) Close() error {
	err := c.ReadCloser.Close()
	c.once.Do(c.done)
	return err
}

// turnPhases is one client turn split into where its time went, in ns:
// the client's latency less the engine handler's holds on the session's
// exchanges (added, the client-side figure) is the sum of
//
//   - in: from the client's send to the adapter's handler having the head
//     (the client's Transport, loopback, the adapter's accept and read);
//   - body: reading the rest of the body;
//   - own: the adapter's own time (End − Read − Engine, its own clock);
//   - wire: the engine calls as the adapter saw them less the engine
//     handler's holds on them (both Transports, loopback, the engine
//     server's read and write outside its handler, and every wait for a
//     core in either process on the way);
//   - out: from the handler's return to the client having read the reply.
type turnPhases struct {
	added, in, body, own, wire, out, connWait int64
	at                                        time.Time // the client's send
}

// joinPhases matches each session's client spans to the adapter's
// timings, in order, and to the engine's exchanges for it, and splits
// every turn. It fails when the counts differ (a turn the adapter did not
// time).
func joinPhases(sess []*loadSession, clock map[string][]turnTiming, xs []exchange) ([]turnPhases, error) {
	bySession := map[string][]exchange{}
	for _, x := range xs {
		bySession[x.Session] = append(bySession[x.Session], x)
	}
	var out []turnPhases
	for _, s := range sess {
		ts := clock[s.id]
		if len(ts) != len(s.spans) {
			return nil, fmt.Errorf("session %s: the adapter timed %d turns, the client sent %d", s.id, len(ts), len(s.spans))
		}
		for k, sp := range s.spans {
			t := ts[k]
			var hold int64
			for _, x := range bySession[s.id] {
				if !x.Start.Before(sp.start) && !x.End.After(sp.end) {
					hold += int64(x.Hold)
				}
			}
			p := turnPhases{
				added: int64(sp.end.Sub(sp.start)) - hold,
				in:    t.Start - sp.start.UnixNano(),
				body:  t.Read - t.Start,
				own:   t.End - t.Read - t.Engine,
				wire:  t.Engine - hold,
				out:   sp.end.UnixNano() - t.End,

				connWait: t.ConnWait, at: sp.start,
			}
			out = append(out, p)
		}
	}
	return out, nil
}

// phaseQuantile is the p-quantile of one phase over ps, in ms.
func phaseQuantile(ps []turnPhases, field func(turnPhases) int64, p float64) float64 {
	v := make([]int64, len(ps))
	for i, x := range ps {
		v[i] = field(x)
	}
	slices.Sort(v)
	return float64(v[min(len(v)-1, int(p*float64(len(v))))]) / 1e6
}

// phaseFields names turnPhases' fields for the breakdown.
var phaseFields = []struct {
	name string
	f    func(turnPhases) int64
}{
	{"added", func(p turnPhases) int64 { return p.added }},
	{"in", func(p turnPhases) int64 { return p.in }},
	{"body", func(p turnPhases) int64 { return p.body }},
	{"own", func(p turnPhases) int64 { return p.own }},
	{"wire", func(p turnPhases) int64 { return p.wire }},
	{"out", func(p turnPhases) int64 { return p.out }},
	{"conn-wait", func(p turnPhases) int64 { return p.connWait }},
}

// phaseBreakdown writes each phase's p50 and p99, and the phases' means
// over the slowest 1% of turns by client-side added latency: where the
// tail is spent.
func phaseBreakdown(ps []turnPhases) string {
	var sb strings.Builder
	sb.WriteString("added latency by phase (ms, p50/p99):")
	for _, f := range phaseFields {
		fmt.Fprintf(&sb, " %s %.2f/%.2f", f.name, phaseQuantile(ps, f.f, 0.50), phaseQuantile(ps, f.f, 0.99))
	}
	tail := slices.Clone(ps)
	slices.SortFunc(tail, func(a, b turnPhases) int { return int(b.added - a.added) })
	tail = tail[:max(1, len(tail)/100)]
	fmt.Fprintf(&sb, "\nslowest %d turns by added latency, mean ms:", len(tail))
	for _, f := range phaseFields {
		var sum int64
		for _, x := range tail {
			sum += f.f(x)
		}
		fmt.Fprintf(&sb, " %s %.2f", f.name, float64(sum)/float64(len(tail))/1e6)
	}
	// When they were sent, from the first turn's send: clustered in a
	// few moments, they are a stall of the machine's, not the turns' own.
	first := ps[0].at
	for _, x := range ps {
		if x.at.Before(first) {
			first = x.at
		}
	}
	ats := make([]float64, len(tail))
	for i, x := range tail {
		ats[i] = x.at.Sub(first).Seconds()
	}
	slices.Sort(ats)
	sb.WriteString("\nthey were sent at (s):")
	for _, a := range ats {
		fmt.Fprintf(&sb, " %.2f", a)
	}
	return sb.String()
}

// schedStats is the adapter process's scheduling latency (how long its
// goroutines waited to run once runnable: the wait for a P, and under it
// for a core) and its GC stop-the-world pauses, p99 and max in ms, from
// runtime/metrics histograms since the process started or the last reset.
type schedStats struct {
	RunnableP99, RunnableMax, GCPauseP99, GCPauseMax float64
	GCs                                              uint64
}

// readSched reads schedStats less base (the histograms at the start of
// the measured span).
func readSched(base []metrics.Sample) (schedStats, []metrics.Sample) {
	s := []metrics.Sample{{Name: "/sched/latencies:seconds"}, {Name: "/sched/pauses/total/gc:seconds"}, {Name: "/gc/cycles/total:gc-cycles"}}
	metrics.Read(s)
	var st schedStats
	q := func(i int) (p99, max float64) {
		if s[i].Value.Kind() != metrics.KindFloat64Histogram {
			return 0, 0
		}
		h := s[i].Value.Float64Histogram()
		counts := slices.Clone(h.Counts)
		if base != nil && base[i].Value.Kind() == metrics.KindFloat64Histogram {
			for j, c := range base[i].Value.Float64Histogram().Counts {
				counts[j] -= c
			}
		}
		var total uint64
		for _, c := range counts {
			total += c
		}
		if total == 0 {
			return 0, 0
		}
		var seen uint64
		for j, c := range counts {
			seen += c
			if seen > 0 && c > 0 {
				// Buckets[j+1] is bucket j's upper bound.
				max = h.Buckets[j+1] * 1e3
			}
			if p99 == 0 && float64(seen) >= 0.99*float64(total) {
				p99 = h.Buckets[j+1] * 1e3
			}
		}
		return p99, max
	}
	st.RunnableP99, st.RunnableMax = q(0)
	st.GCPauseP99, st.GCPauseMax = q(1)
	if s[2].Value.Kind() == metrics.KindUint64 {
		st.GCs = s[2].Value.Uint64()
		if base != nil && base[2].Value.Kind() == metrics.KindUint64 {
			st.GCs -= base[2].Value.Uint64()
		}
	}
	return st, s
}

// The CPU split of the load benchmark: on a machine with at least two
// CPUs the adapter process runs on CPU 0 alone and this process (the load
// client and the scripted engine) on the others, so that the adapter never
// waits for a core the harness holds. KILN_LOAD_PIN=0 turns it off. Other
// processes on the machine are not moved: they still share every CPU.
const loadPinEnv = "KILN_LOAD_PIN"

// cpuSplit is the affinity the load benchmark runs under.
type cpuSplit struct {
	on       bool
	adapter  unix.CPUSet
	harness  unix.CPUSet
	old      unix.CPUSet
	oldProcs int
	desc     string
}

// splitCPUs decides the split: off with fewer than two CPUs in this
// process's affinity, or when KILN_LOAD_PIN=0.
func splitCPUs() *cpuSplit {
	c := &cpuSplit{desc: "not pinned"}
	if err := unix.SchedGetaffinity(0, &c.old); err != nil {
		c.desc = "not pinned: " + err.Error()
		return c
	}
	if os.Getenv(loadPinEnv) == "0" {
		c.desc = "not pinned (" + loadPinEnv + "=0)"
		return c
	}
	var cpus []int
	for i := 0; i < 1024 && len(cpus) < c.old.Count(); i++ {
		if c.old.IsSet(i) {
			cpus = append(cpus, i)
		}
	}
	if len(cpus) < 2 {
		c.desc = fmt.Sprintf("not pinned: %d CPU", len(cpus))
		return c
	}
	c.on = true
	c.adapter.Set(cpus[0])
	for _, i := range cpus[1:] {
		c.harness.Set(i)
	}
	c.desc = fmt.Sprintf("adapter on CPU %d, harness on %d of %d CPUs", cpus[0], len(cpus)-1, len(cpus))
	return c
}

// start starts cmd on the adapter's CPU: the child inherits the affinity
// of the thread that forks it, this goroutine's, locked to its thread for
// the purpose and given back its own affinity after.
func (c *cpuSplit) start(cmd *exec.Cmd) error {
	if !c.on {
		return cmd.Start()
	}
	runtime.LockOSThread()
	defer runtime.UnlockOSThread()
	var mine unix.CPUSet
	if err := unix.SchedGetaffinity(0, &mine); err != nil {
		return err
	}
	if err := unix.SchedSetaffinity(0, &c.adapter); err != nil {
		return fmt.Errorf("pinning the adapter process (%s=0 runs it unpinned): %w", loadPinEnv, err)
	}
	err := cmd.Start()
	if rerr := unix.SchedSetaffinity(0, &mine); err == nil && rerr != nil {
		err = rerr
	}
	return err
}

// pinHarness moves every thread of this process to the harness's CPUs
// (threads started later inherit it from the threads that start them) and
// sets GOMAXPROCS to their number; unpin undoes both. Where the kernel
// refuses (a sandbox without sched_setaffinity), the split is turned off
// and says so in desc: the benchmark runs unpinned.
func (c *cpuSplit) pinHarness() {
	if !c.on {
		return
	}
	c.oldProcs = runtime.GOMAXPROCS(c.harness.Count())
	if err := c.setAll(&c.harness); err != nil {
		_ = c.setAll(&c.old)
		runtime.GOMAXPROCS(c.oldProcs)
		c.on, c.desc = false, "not pinned: "+err.Error()
	}
}

func (c *cpuSplit) unpin() {
	if !c.on {
		return
	}
	_ = c.setAll(&c.old)
	runtime.GOMAXPROCS(c.oldProcs)
}

// setAll sets the affinity of every thread of this process, listing them
// again until a pass finds no thread it has not set.
func (c *cpuSplit) setAll(set *unix.CPUSet) error {
	done := map[int]bool{}
	for pass := 0; pass < 10; pass++ {
		ents, err := os.ReadDir("/proc/self/task")
		if err != nil {
			return err
		}
		fresh := false
		for _, e := range ents {
			tid, err := strconv.Atoi(e.Name())
			if err != nil || done[tid] {
				continue
			}
			fresh = true
			if err := unix.SchedSetaffinity(tid, set); err != nil && err != unix.ESRCH {
				return fmt.Errorf("thread %d: %w", tid, err)
			}
			done[tid] = true
		}
		if !fresh {
			return nil
		}
	}
	return nil
}

// runQueueWait is how long this process's threads have waited on a run
// queue, runnable but not running, since they started (the second field
// of each thread's /proc schedstat): the wait for a core, however it was
// taken (this process's other threads, other processes). Threads that
// have exited are not counted; Go's rarely exit. 0 where /proc does not
// tell.
func runQueueWait() time.Duration {
	ents, err := os.ReadDir("/proc/self/task")
	if err != nil {
		return 0
	}
	var sum time.Duration
	for _, e := range ents {
		b, err := os.ReadFile("/proc/self/task/" + e.Name() + "/schedstat")
		if err != nil {
			continue
		}
		f := strings.Fields(string(b))
		if len(f) < 2 {
			continue
		}
		n, _ := strconv.ParseInt(f[1], 10, 64)
		sum += time.Duration(n)
	}
	return sum
}

// cpuPressure is the machine's total time with at least one task waiting
// for a CPU (/proc/pressure/cpu, "some"), 0 where the kernel does not
// tell.
func cpuPressure() time.Duration {
	b, err := os.ReadFile("/proc/pressure/cpu")
	if err != nil {
		return 0
	}
	line, _, _ := strings.Cut(string(b), "\n")
	for _, f := range strings.Fields(line) {
		if v, ok := strings.CutPrefix(f, "total="); ok {
			n, _ := strconv.ParseInt(v, 10, 64)
			return time.Duration(n) * time.Microsecond
		}
	}
	return 0
}

// loadAvg is /proc/loadavg's first three fields ("?" where unreadable).
func loadAvg() string {
	b, err := os.ReadFile("/proc/loadavg")
	if err != nil {
		return "?"
	}
	f := strings.Fields(string(b))
	if len(f) < 3 {
		return "?"
	}
	return strings.Join(f[:3], " ")
}

// joinPhases splits a turn's client-side added latency into phases that
// add up to it, and refuses a session whose turns the adapter did not all
// time.
func TestJoinPhases(t *testing.T) {
	t0 := time.Unix(1000, 0)
	at := func(ms float64) time.Time { return t0.Add(time.Duration(ms * float64(time.Millisecond))) }
	ns := func(ms float64) int64 { return at(ms).UnixNano() }
	s := &loadSession{id: "load-0001", spans: []span{{at(0), at(100)}}}
	other := &loadSession{id: "load-0002"}
	// The adapter had the head at 1 ms, the body at 1.5, replied at 99.5;
	// its two engine calls took 90 ms as it saw them, 85 ms of it in the
	// engine's handler.
	clock := map[string][]turnTiming{s.id: {{Start: ns(1), Read: ns(1.5), End: ns(99.5), Engine: int64(90 * time.Millisecond), ConnWait: int64(time.Millisecond)}}}
	xs := []exchange{
		{Session: s.id, Start: at(2), End: at(12), Hold: 10 * time.Millisecond},
		{Session: s.id, Start: at(14), End: at(89), Hold: 75 * time.Millisecond},
		{Session: other.id, Start: at(3), End: at(50), Hold: 47 * time.Millisecond}, // another session's
	}
	ps, err := joinPhases([]*loadSession{s, other}, clock, xs)
	if err != nil {
		t.Fatal(err)
	}
	if len(ps) != 1 {
		t.Fatalf("%d turns, want 1", len(ps))
	}
	p := ps[0]
	ms := func(v int64) float64 { return float64(v) / 1e6 }
	want := map[string]float64{"added": 15, "in": 1, "body": 0.5, "own": 8, "wire": 5, "out": 0.5}
	got := map[string]float64{"added": ms(p.added), "in": ms(p.in), "body": ms(p.body), "own": ms(p.own), "wire": ms(p.wire), "out": ms(p.out)}
	for k, w := range want {
		if d := got[k] - w; d > 1e-6 || d < -1e-6 {
			t.Errorf("%s = %v ms, want %v", k, got[k], w)
		}
	}
	if sum := p.in + p.body + p.own + p.wire + p.out; sum != p.added {
		t.Errorf("phases add up to %d ns, added is %d", sum, p.added)
	}
	if _, err := joinPhases([]*loadSession{s}, map[string][]turnTiming{}, xs); err == nil {
		t.Error("a session the adapter did not time: no error")
	}
}
