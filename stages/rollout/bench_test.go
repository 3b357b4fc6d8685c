package rollout

import (
	"bytes"
	"fmt"
	"math/rand/v2"
	"runtime"
	"strings"
	"syscall"
	"testing"
	"time"
	"unsafe"

	"github.com/kilnrl/kiln/formats/records"
	"github.com/kilnrl/kiln/internal/agent/assembly"
)

// benchSession generates one agent session: 40 turns whose prompts grow to
// about 8k tokens (each prompt extends the previous prompt and output with a
// tool result), 5% of turns re-rendering an earlier token differently
// (drift).
func benchSession(r *rand.Rand, id int) *session {
	s := &session{id: fmt.Sprintf("s%d", id)}
	prompt := make([]int32, 0, 9000)
	for i := 0; i < 400; i++ {
		prompt = append(prompt, int32(r.IntN(150000)))
	}
	// The prompt_messages text grows as a client resends it: the history so
	// far plus the new messages.
	history := []byte(fmt.Sprintf(`[{"role":"system","content":"S"},{"role":"user","content":"task %d"}`, id))
	for turn := 0; turn < 40; turn++ {
		out := make([]int32, 60+r.IntN(80))
		lps := make([]float32, len(out))
		for i := range out {
			out[i] = int32(r.IntN(150000))
			lps[i] = -r.Float32()
		}
		p := append([]int32(nil), prompt...)
		if r.IntN(100) < 5 && len(p) > 500 {
			p[len(p)-r.IntN(300)-1] = 701 // drift inside already-held tokens
		}
		m := append(history[:len(history):len(history)], ']')
		// Message text is about 4 bytes per token, as in real sessions.
		resp := fmt.Sprintf(`{"role":"assistant","content":"a%d %s","tool_calls":[{"id":"c%d"}]}`, turn, text(len(out)), turn)
		s.turns = append(s.turns, records.Turn{Session: s.id, Turn: int32(turn), Index: int64(id), RolloutID: int64(id),
			PromptIDs: p, OutputIDs: out, OutputLogProbs: lps, FinishReason: "tool_calls",
			PromptMessages: string(m), ResponseMessage: &resp})
		prompt = append(prompt, out...)
		toolTokens := 100 + r.IntN(60)
		for i := 0; i < toolTokens; i++ {
			prompt = append(prompt, int32(r.IntN(150000)))
		}
		history = fmt.Appendf(history, `,%s,{"role":"tool","content":"t%d %s"}`, resp, turn, text(toolTokens))
	}
	return s
}

// threadCPU is the calling thread's CPU time.
func threadCPU() time.Duration {
	const clockThreadCPUTime = 3 // CLOCK_THREAD_CPUTIME_ID
	var ts syscall.Timespec
	if _, _, errno := syscall.Syscall(syscall.SYS_CLOCK_GETTIME, clockThreadCPUTime, uintptr(unsafe.Pointer(&ts)), 0); errno != 0 {
		panic(errno)
	}
	return time.Duration(ts.Nano())
}

// int32Bytes views ids as bytes, for the vectorized comparison.
func int32Bytes(ids []int32) []byte {
	return unsafe.Slice((*byte)(unsafe.Pointer(unsafe.SliceData(ids))), 4*len(ids))
}

func boolInt(b bool) int {
	if b {
		return 1
	}
	return 0
}

func text(tokens int) string { return strings.Repeat("word", tokens) }

// BenchmarkAssemble streams 250, 1000 and 4000 sessions through assembly
// (one session in memory at a time) and, in the same run, one copy of the
// same prompt and output token arrays, one copy of those plus the
// prompt_messages text, and the comparisons exact assembly cannot skip; it
// reports input tokens/s, the ratios, and the peak heap. Every part is timed
// in the CPU time of the benchmark's own thread (CLOCK_THREAD_CPUTIME_ID), so
// the ratios hold on a loaded machine, where wall time counts the waits for
// a core.
//
//	go test ./stages/rollout -run '^$' -bench Assemble -benchtime 1x
func BenchmarkAssemble(b *testing.B) {
	sizes := []int{250, 1000, 4000}
	if testing.Short() {
		sizes = []int{25, 100}
	}
	for _, n := range sizes {
		b.Run(fmt.Sprint(n), func(b *testing.B) {
			runtime.LockOSThread()
			defer runtime.UnlockOSThread()
			for it := 0; it < b.N; it++ {
				r := rand.New(rand.NewPCG(uint64(n), 7))
				var assembleTime, copyTime, copyAllTime, verifyTime time.Duration
				var equal int
				var tokens int64
				var peak uint64
				var ms runtime.MemStats
				runtime.GC()
				sink := make([]int32, 0, 1<<16)
				textSink := make([]byte, 0, 1<<20)
				// As kiln-rollout assemble does per shard, segment memory is
				// reused once the segments are written (here: at once).
				arena := &assembly.Arena{}
				for i := 0; i < n; i++ {
					s := benchSession(r, i)
					start := threadCPU()
					for _, t := range s.turns {
						sink = append(sink[:0], t.PromptIDs...)
						sink = append(sink, t.OutputIDs...)
						tokens += int64(len(t.PromptIDs) + len(t.OutputIDs))
					}
					copyTime += threadCPU() - start
					// The copy of every input byte: tokens and message text.
					start = threadCPU()
					for _, t := range s.turns {
						sink = append(sink[:0], t.PromptIDs...)
						sink = append(sink, t.OutputIDs...)
						textSink = append(textSink[:0], t.PromptMessages...)
					}
					copyAllTime += threadCPU() - start
					// The comparisons exact assembly cannot skip: each
					// turn's prompt against the previous prompt and output
					// (drift), and its message text against the previous
					// turn's (the routing tree's deep equality).
					start = threadCPU()
					for k := 1; k < len(s.turns); k++ {
						p, t := &s.turns[k-1], &s.turns[k]
						np := len(p.PromptIDs)
						equal += boolInt(bytes.Equal(int32Bytes(t.PromptIDs[:np]), int32Bytes(p.PromptIDs)) &&
							bytes.Equal(int32Bytes(t.PromptIDs[np:np+len(p.OutputIDs)]), int32Bytes(p.OutputIDs)))
						n := len(p.PromptMessages) - 1
						equal = equal + boolInt(t.PromptMessages[:n] == p.PromptMessages[:n])
					}
					verifyTime += threadCPU() - start
					start = threadCPU()
					segs, err := assembleSession(s, assembly.Options{Arena: arena})
					assembleTime += threadCPU() - start
					if err != nil || len(segs) == 0 {
						b.Fatalf("session %d: %d segments, %v", i, len(segs), err)
					}
					arena.Reset()
					if i%50 == 0 {
						runtime.ReadMemStats(&ms)
						peak = max(peak, ms.HeapInuse)
					}
				}
				b.ReportMetric(float64(tokens)/assembleTime.Seconds()/1e6, "assemble-Mtok/s")
				b.ReportMetric(float64(tokens)/copyTime.Seconds()/1e6, "copy-Mtok/s")
				b.ReportMetric(assembleTime.Seconds()/copyTime.Seconds(), "x-copy")
				b.ReportMetric(assembleTime.Seconds()/copyAllTime.Seconds(), "x-copy-tokens+text")
				b.ReportMetric(assembleTime.Seconds()/verifyTime.Seconds(), "x-verify")
				b.ReportMetric(float64(peak)/(1<<20), "peak-heap-MB")
				if equal == 0 {
					b.Fatal("no turn extends its predecessor: the generator is broken")
				}
				b.ReportMetric(float64(tokens)/1e6, "Mtok")
			}
		})
	}
}
