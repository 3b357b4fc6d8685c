package adapter_test

import (
	"bytes"
	"context"
	"encoding/gob"
	"encoding/json"
	"fmt"
	"io"
	"net"
	"net/http"
	"net/http/httptest"
	"os"
	"path/filepath"
	"runtime"
	"slices"
	"strings"
	"sync"
	"sync/atomic"
	"syscall"
	"testing"
	"time"

	"github.com/kilnrl/kiln/stages/rollout/adapter"
	"github.com/kilnrl/kiln/stages/rollout/engine"
	"github.com/kilnrl/kiln/stages/rollout/enginetest"
	"github.com/kilnrl/kiln/stages/rollout/protocol"
)

// BenchmarkAdapterLoad is the adapter load test: N concurrent Anthropic
// sessions of T turns each, Claude Code style (every turn resends the whole
// history with the previous reply echoed exactly as returned plus a new
// tool_result), against the scripted engine with zero generation latency,
// everything over real HTTP on loopback in this process.
//
// Reported per turn: process CPU (getrusage user+sys) raw, the engine's share
// measured by replaying the identical engine traffic without the adapter, and
// their difference (net, which still contains the load client's own HTTP and
// JSON work); engine calls, /tokenize calls, engine bytes and new engine TCP
// connections; client-seen latency p50/p99 and the achieved rate (turns/s,
// closed loop: every session sends its next turn as soon as the last one is
// answered, so latency includes queueing at that rate); live heap per session
// at half and at all turns (engine logs cleared first), and the bytes the
// recorded turns themselves hold (records.Turn ids, logprobs, messages).
//
//	go test ./stages/rollout/adapter -run '^$' -bench AdapterLoad -benchtime 1x
//
// With -short only sessions=8 × 5 turns runs (for CI at -benchtime=1x).
func BenchmarkAdapterLoad(b *testing.B) {
	cases := []loadConfig{{sessions: 64, turns: 20}, {sessions: 256, turns: 20}, {sessions: 64, turns: 20, rate: 100}}
	if testing.Short() {
		cases = []loadConfig{{sessions: 8, turns: 5}}
	}
	for _, c := range cases {
		name := fmt.Sprintf("sessions=%d", c.sessions)
		if c.rate > 0 {
			name += fmt.Sprintf("/rate=%g", c.rate)
		}
		b.Run(name, func(b *testing.B) {
			for i := 0; i < b.N; i++ {
				runLoad(b, c)
			}
		})
	}
}

type loadConfig struct {
	sessions, turns int
	// rate, when > 0, caps the turns started per second over all sessions
	// (a shared ticker), to measure latency below saturation.
	rate float64
}

// loadScript makes every turn a reasoning block plus one qwen3_coder tool
// call; the text depends only on the prompt length (not on the engine's
// per-session turn counter, which the benchmark resets between phases), so
// the replayed baseline generates exactly the same outputs.
func loadScript(r enginetest.Request) enginetest.Output {
	n := len(r.PromptIDs)
	return enginetest.Output{Text: fmt.Sprintf("I should inspect part %d of the tree before editing anything.\n</think>\n\n"+
		"<tool_call>\n<function=lookup>\n<parameter=q>\nsrc/pkg%d/file_%d.go\n</parameter>\n</function>\n</tool_call>", n%97, n%13, n)}
}

func loadEngineOptions() enginetest.Options {
	return enginetest.Options{MaxModelLen: 65536, Script: loadScript,
		Template: enginetest.ChatTemplate{ToolCallStyle: enginetest.Qwen3CoderXML, OpenThinkInGenerationPrompt: true}}
}

// toolResult is the client's answer to turn k's call: ~240 bytes, like a
// short file listing.
func toolResult(sid string, k int) string {
	var sb strings.Builder
	for i := 0; i < 6; i++ {
		fmt.Fprintf(&sb, "%s/turn%02d/entry_%d.go  1.%dKB\n", sid, k, i, i+k)
	}
	return sb.String()
}

// replayReq is one engine request of the adapter run, kept for the baseline.
type replayReq struct {
	Path   string
	Header map[string][]string
	Body   []byte
}

type engineTotals struct {
	calls, tokenize, generate int
	bytes                     int64
}

func (t *engineTotals) add(st map[string]enginetest.EndpointStats) {
	for path, s := range st {
		t.calls += s.Calls
		t.bytes += s.RequestBytes + s.ResponseBytes
		switch path {
		case "/tokenize":
			t.tokenize += s.Calls
		case "/inference/v1/generate":
			t.generate += s.Calls
		}
	}
}

// cpuTime is the process's user+system CPU time so far.
func cpuTime(b *testing.B) time.Duration {
	var ru syscall.Rusage
	if err := syscall.Getrusage(syscall.RUSAGE_SELF, &ru); err != nil {
		b.Fatal(err)
	}
	return time.Duration(ru.Utime.Nano() + ru.Stime.Nano())
}

func liveHeap() uint64 {
	runtime.GC()
	runtime.GC()
	var ms runtime.MemStats
	runtime.ReadMemStats(&ms)
	return ms.HeapAlloc
}

// countingServer serves h on loopback and counts accepted connections.
func countingServer(h http.Handler, conns *atomic.Int64) *httptest.Server {
	s := httptest.NewUnstartedServer(h)
	s.Config.ConnState = func(_ net.Conn, st http.ConnState) {
		if st == http.StateNew {
			conns.Add(1)
		}
	}
	s.Start()
	return s
}

func runLoad(b *testing.B, cfg loadConfig) {
	b.StopTimer()
	dir := b.TempDir()
	if err := enginetest.WriteTokenizerFiles(dir); err != nil {
		b.Fatal(err)
	}
	eng := enginetest.New(loadEngineOptions())
	var engConns atomic.Int64
	esrv := countingServer(eng, &engConns)
	defer esrv.Close()
	// As in production (adaptercmd): no HTTPClient, so the default transport.
	ec, err := engine.New(engine.Options{BaseURL: esrv.URL, Mode: engine.ModeGenerate})
	if err != nil {
		b.Fatal(err)
	}
	if _, err := ec.Probe(context.Background()); err != nil {
		b.Fatal(err)
	}
	sp, err := engine.LoadSpecialTokens(dir)
	if err != nil {
		b.Fatal(err)
	}
	ad := adapter.New(adapter.Options{Engine: ec, Special: sp, ReasoningParser: "qwen3", ToolParser: "qwen3_coder",
		IDs: protocol.SeededIDs(7)})
	asrv := httptest.NewServer(ad)
	defer asrv.Close()
	eng.Reset()
	engConns.Store(0)

	client := &http.Client{Transport: &http.Transport{MaxIdleConns: cfg.sessions, MaxIdleConnsPerHost: cfg.sessions}}
	defer client.CloseIdleConnections()
	tools, _ := json.Marshal(anthropicTools)

	type sessState struct {
		id   string
		hist []json.RawMessage
		lat  []time.Duration
		err  error
	}
	sess := make([]*sessState, cfg.sessions)
	for i := range sess {
		id := fmt.Sprintf("load-%04d", i)
		first, _ := json.Marshal(map[string]any{"role": "user", "content": "Please fix the failing build in " + id + "; start by looking around."})
		sess[i] = &sessState{id: id, hist: []json.RawMessage{first}}
	}

	// oneTurn sends the history, checks the reply, echoes it and appends a
	// tool_result for the next turn.
	oneTurn := func(s *sessState, k int) error {
		body, _ := json.Marshal(map[string]any{"model": "claude-sonnet", "max_tokens": 512,
			"tools": json.RawMessage(tools), "messages": s.hist})
		req, err := http.NewRequest(http.MethodPost, asrv.URL+"/v1/messages", bytes.NewReader(body))
		if err != nil {
			return err
		}
		req.Header.Set("x-api-key", s.id)
		req.Header.Set("content-type", "application/json")
		req.Header.Set("anthropic-version", "2023-06-01")
		t0 := time.Now()
		res, err := client.Do(req)
		if err != nil {
			return err
		}
		out, err := io.ReadAll(res.Body)
		res.Body.Close()
		s.lat = append(s.lat, time.Since(t0))
		if err != nil {
			return err
		}
		if res.StatusCode != http.StatusOK {
			return fmt.Errorf("session %s turn %d: status %d: %s", s.id, k, res.StatusCode, out)
		}
		var m struct {
			Content []json.RawMessage `json:"content"`
		}
		if err := json.Unmarshal(out, &m); err != nil {
			return err
		}
		toolID := ""
		for _, c := range m.Content {
			var blk struct{ Type, ID string }
			_ = json.Unmarshal(c, &blk)
			if blk.Type == "tool_use" {
				toolID = blk.ID
			}
		}
		if toolID == "" {
			return fmt.Errorf("session %s turn %d: no tool_use in %s", s.id, k, out)
		}
		asst, _ := json.Marshal(map[string]any{"role": "assistant", "content": m.Content})
		user, _ := json.Marshal(map[string]any{"role": "user", "content": []any{map[string]any{
			"type": "tool_result", "tool_use_id": toolID, "content": toolResult(s.id, k)}}})
		s.hist = append(s.hist, asst, user)
		return nil
	}

	var (
		totals   engineTotals
		replays  []string
		cpu      time.Duration
		wall     time.Duration
		base     = liveHeap()
		heapAt   []float64
		phaseEnd = []int{cfg.turns / 2, cfg.turns}
	)
	done := 0
	for pi, end := range phaseEnd {
		from := done
		var pace <-chan time.Time
		if cfg.rate > 0 {
			tk := time.NewTicker(time.Duration(float64(time.Second) / cfg.rate))
			pace = tk.C
			defer tk.Stop()
		}
		c0, w0 := cpuTime(b), time.Now()
		b.StartTimer()
		var wg sync.WaitGroup
		for _, s := range sess {
			wg.Add(1)
			go func() {
				defer wg.Done()
				for k := from; k < end && s.err == nil; k++ {
					if pace != nil {
						<-pace
					}
					s.err = oneTurn(s, k)
				}
			}()
		}
		wg.Wait()
		b.StopTimer()
		wall += time.Since(w0)
		cpu += cpuTime(b) - c0
		for _, s := range sess {
			if s.err != nil {
				b.Fatal(s.err)
			}
		}
		done = end
		// Keep the engine traffic for the baseline (on disk, so it is not
		// counted as live heap), then clear the engine's log and history.
		totals.add(eng.Stats())
		var rr []replayReq
		for _, r := range eng.Requests() {
			rr = append(rr, replayReq{Path: r.Path, Header: r.Header, Body: r.Body})
		}
		p := filepath.Join(dir, fmt.Sprintf("replay-%d.gob", pi))
		writeGob(b, p, rr)
		replays = append(replays, p)
		eng.Reset()
		client.CloseIdleConnections()
		h := liveHeap()
		heapAt = append(heapAt, float64(h-min(base, h))/float64(cfg.sessions))
	}
	newConns := engConns.Load()

	// Every response was 200 (checked per turn); now check that reuse
	// happened: turn k's prompt starts with turn k-1's prompt+output.
	var recorded, promptTok, outTok int64
	for _, s := range sess {
		turns, err := ad.Finish(s.id)
		if err != nil {
			b.Fatal(err)
		}
		if len(turns) != cfg.turns {
			b.Fatalf("session %s: %d turns recorded, want %d", s.id, len(turns), cfg.turns)
		}
		for k, t := range turns {
			recorded += int64(4*(len(t.PromptIDs)+len(t.OutputIDs)+len(t.OutputLogProbs)) + len(t.PromptMessages))
			promptTok += int64(len(t.PromptIDs))
			outTok += int64(len(t.OutputIDs))
			if t.ResponseMessage != nil {
				recorded += int64(len(*t.ResponseMessage))
			}
			if k == 0 {
				continue
			}
			prev := turns[k-1]
			n := len(prev.PromptIDs) + len(prev.OutputIDs)
			if len(t.PromptIDs) <= n || !slices.Equal(t.PromptIDs[:len(prev.PromptIDs)], prev.PromptIDs) ||
				!slices.Equal(t.PromptIDs[len(prev.PromptIDs):n], prev.OutputIDs) {
				b.Fatalf("session %s turn %d: no prefix reuse (prompt does not start with turn %d's prompt+output)", s.id, k, k-1)
			}
		}
	}

	nTurns := cfg.sessions * cfg.turns
	if totals.tokenize > 2*nTurns {
		b.Fatalf("%d /tokenize calls for %d turns: more than 2 per turn on the reuse path", totals.tokenize, nTurns)
	}
	if totals.generate != nTurns {
		b.Fatalf("%d generate calls for %d turns", totals.generate, nTurns)
	}

	// Baseline: the same engine traffic without the adapter.
	baseCPU := replayBaseline(b, cfg.sessions, replays)

	var lat []time.Duration
	for _, s := range sess {
		lat = append(lat, s.lat...)
	}
	slices.Sort(lat)
	pct := func(p float64) float64 {
		return float64(lat[min(len(lat)-1, int(p*float64(len(lat))))].Microseconds()) / 1e3
	}
	per := func(d time.Duration) float64 { return float64(d.Microseconds()) / float64(nTurns) }
	b.ReportMetric(per(cpu), "cpu-µs/turn")
	b.ReportMetric(per(baseCPU), "engine-cpu-µs/turn")
	b.ReportMetric(per(cpu-baseCPU), "net-cpu-µs/turn")
	b.ReportMetric(float64(totals.calls)/float64(nTurns), "engine-calls/turn")
	b.ReportMetric(float64(totals.tokenize)/float64(nTurns), "tokenize/turn")
	b.ReportMetric(float64(totals.bytes)/float64(nTurns), "engine-B/turn")
	b.ReportMetric(float64(newConns)/float64(nTurns), "engine-conns/turn")
	b.ReportMetric(pct(0.50), "p50-ms")
	b.ReportMetric(pct(0.99), "p99-ms")
	b.ReportMetric(float64(nTurns)/wall.Seconds(), "turns/s")
	b.ReportMetric(heapAt[0], fmt.Sprintf("heap-B/session@%dturns", phaseEnd[0]))
	b.ReportMetric(heapAt[1], fmt.Sprintf("heap-B/session@%dturns", phaseEnd[1]))
	b.ReportMetric(float64(recorded)/float64(cfg.sessions), "recorded-B/session")
	b.ReportMetric(float64(promptTok)/float64(nTurns), "prompt-tok/turn")
	b.ReportMetric(float64(outTok)/float64(nTurns), "output-tok/turn")
}

func writeGob(b *testing.B, path string, v any) {
	f, err := os.Create(path)
	if err != nil {
		b.Fatal(err)
	}
	if err := gob.NewEncoder(f).Encode(v); err != nil {
		b.Fatal(err)
	}
	if err := f.Close(); err != nil {
		b.Fatal(err)
	}
}

// replayBaseline sends the recorded engine requests, in arrival order, from
// as many workers as there were sessions to a fresh scripted engine, and
// returns the process CPU time it took.
func replayBaseline(b *testing.B, workers int, files []string) time.Duration {
	eng := enginetest.New(loadEngineOptions())
	esrv := httptest.NewServer(eng)
	defer esrv.Close()
	client := &http.Client{Transport: &http.Transport{MaxIdleConns: workers, MaxIdleConnsPerHost: workers}}
	defer client.CloseIdleConnections()
	var total time.Duration
	for _, file := range files {
		f, err := os.Open(file)
		if err != nil {
			b.Fatal(err)
		}
		var rr []replayReq
		err = gob.NewDecoder(f).Decode(&rr)
		f.Close()
		if err != nil {
			b.Fatal(err)
		}
		ch := make(chan replayReq)
		var failed atomic.Value
		c0 := cpuTime(b)
		var wg sync.WaitGroup
		for w := 0; w < workers; w++ {
			wg.Add(1)
			go func() {
				defer wg.Done()
				for r := range ch {
					req, _ := http.NewRequest(http.MethodPost, esrv.URL+r.Path, bytes.NewReader(r.Body))
					for k, v := range r.Header {
						switch k {
						case "Content-Length", "Host", "Connection", "Accept-Encoding":
						default:
							req.Header[k] = v
						}
					}
					res, err := client.Do(req)
					if err != nil {
						failed.Store(err)
						continue
					}
					_, _ = io.Copy(io.Discard, res.Body)
					res.Body.Close()
					if res.StatusCode != http.StatusOK {
						failed.Store(fmt.Errorf("replay %s: status %d", r.Path, res.StatusCode))
					}
				}
			}()
		}
		for _, r := range rr {
			ch <- r
		}
		close(ch)
		wg.Wait()
		total += cpuTime(b) - c0
		if err, _ := failed.Load().(error); err != nil {
			b.Fatal(err)
		}
		eng.Reset()
		runtime.GC()
	}
	return total
}
