package rollout

import (
	"bufio"
	"bytes"
	"fmt"
	"math/rand/v2"
	"os"
	"os/exec"
	"path/filepath"
	"runtime"
	"strconv"
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
					segs, err := assembleSession(s, assembly.Options{})
					assembleTime += threadCPU() - start
					if err != nil || len(segs) == 0 {
						b.Fatalf("session %d: %d segments, %v", i, len(segs), err)
					}
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

// benchTurnsSessions is the size of the turns-JSONL benchmark in sessions of
// 100 turns: KILN_BENCH_TURNS_SESSIONS, else 20 (2,000 turns, ~195 MB), or 2
// under -short (CI).
func benchTurnsSessions(b *testing.B) int {
	if s := os.Getenv("KILN_BENCH_TURNS_SESSIONS"); s != "" {
		n, err := strconv.Atoi(s)
		if err != nil || n < 1 {
			b.Fatalf("KILN_BENCH_TURNS_SESSIONS=%q: want a positive number", s)
		}
		return n
	}
	if testing.Short() {
		return 2
	}
	return 20
}

// benchTurnsPerSession is the length of a generated session in turns.
const benchTurnsPerSession = 100

// benchWords are the words of generated message text, escapes included as
// JSON writes them (json.dumps' ensure_ascii escapes of non-ASCII text, new
// lines, quotes), so the text has the escapes real histories have.
var benchWords = []string{"the", "file", "def", "return", "import", "self", `\n`, `\n    `, `\"path\"`, "error:",
	"test_", "caf\\u00e9", "==", "x", "0", "diff", "--git", "a/src/main.py", "+", "-", "assert", "None", `\t`, "{}", "[]"}

// appendBenchText appends about n bytes of message text (inside a JSON
// string literal) to b.
func appendBenchText(b []byte, r *rand.Rand, n int) []byte {
	for end := len(b) + n; len(b) < end; {
		b = append(b, benchWords[r.IntN(len(benchWords))]...)
		b = append(b, ' ')
	}
	return b
}

// benchTokenID is a token id with a skew toward small ids, as a BPE
// vocabulary's frequent tokens have.
func benchTokenID(r *rand.Rand) int32 {
	if r.IntN(10) < 7 {
		return int32(r.IntN(3000))
	}
	return int32(r.IntN(152000))
}

// appendPyFloat appends v as Python's repr writes it (json.dumps of a
// float): the shortest round-trip digits, with ".0" on integral values.
func appendPyFloat(b []byte, v float64) []byte {
	start := len(b)
	b = strconv.AppendFloat(b, v, 'g', -1, 64)
	if !bytes.ContainsAny(b[start:], ".en") {
		b = append(b, ".0"...)
	}
	return b
}

// appendIDs appends ids as json.dumps writes a list: "a, b, c".
func appendIDs(b []byte, ids []int32) []byte {
	for i, id := range ids {
		if i > 0 {
			b = append(b, ", "...)
		}
		b = strconv.AppendInt(b, int64(id), 10)
	}
	return b
}

// writeBenchTurns writes sessions agent sessions of benchTurnsPerSession
// turns as a turns JSONL file, one json.dumps-style object a line (Python's
// default separators ", " and ": "), shaped like the dumps of other RL
// systems: each prompt resends the previous prompt and output plus a tool
// result (prompts grow from 1k to ~20k tokens; 3% of turns re-render an
// earlier token differently, a drift), output ids with float64 logprobs,
// and prompt_messages resending the whole history (the client echoes each
// response_message verbatim) with message text at ~bytesPerToken bytes a
// token. It is deterministic in seed.
func writeBenchTurns(path string, sessions int, seed uint64) (turns int, err error) {
	f, err := os.Create(path)
	if err != nil {
		return 0, err
	}
	w := bufio.NewWriterSize(f, 1<<20)
	const bytesPerToken = 2
	var line []byte
	for s := 0; s < sessions; s++ {
		r := rand.New(rand.NewPCG(seed, uint64(s)))
		prompt := make([]int32, 0, 24000)
		for i := 0; i < 1000; i++ {
			prompt = append(prompt, benchTokenID(r))
		}
		idsText := appendIDs(nil, prompt) // prompt's list without brackets
		hist := []byte(`[{"role": "system", "content": "`)
		hist = appendBenchText(hist, r, 700*bytesPerToken)
		hist = append(hist, `"}, {"role": "user", "content": "`...)
		hist = appendBenchText(hist, r, 300*bytesPerToken)
		hist = append(hist, `"}`...) // the history's list without its closing bracket
		id := fmt.Sprintf("sess-%04d", s)
		for t := 0; t < benchTurnsPerSession; t++ {
			if t > 0 && r.IntN(100) < 3 {
				prompt[len(prompt)-1-r.IntN(300)] = 701 // drift inside already-held tokens
				idsText = appendIDs(idsText[:0], prompt)
			}
			out := make([]int32, 40+r.IntN(120))
			for i := range out {
				out[i] = benchTokenID(r)
			}
			finish, call := "tool_calls", fmt.Sprintf("call_%d_%d", s, t)
			if t == benchTurnsPerSession-1 {
				finish = "stop"
			}
			resp := []byte(`{"role": "assistant", "content": "`)
			resp = appendBenchText(resp, r, len(out)*bytesPerToken/2)
			resp = fmt.Appendf(resp, `", "tool_calls": [{"id": "%s", "type": "function", "function": {"name": "bash", "arguments": "{\"command\": \"`, call)
			resp = appendBenchText(resp, r, len(out)*bytesPerToken/2)
			resp = append(resp, `\"}"}}]}`...)

			line = fmt.Appendf(line[:0], `{"session": %q, "index": %d, "group_index": %d, "rollout_id": %d, "turn": %d, "prompt_ids": [`,
				id, s, s/4, s, t)
			line = append(line, idsText...)
			line = append(line, `], "output_ids": [`...)
			line = appendIDs(line, out)
			line = append(line, `], "output_log_probs": [`...)
			for i := range out {
				if i > 0 {
					line = append(line, ", "...)
				}
				line = appendPyFloat(line, -r.ExpFloat64()*0.4)
			}
			line = fmt.Appendf(line, `], "finish_reason": %q, "prompt_messages": `, finish)
			line = append(line, hist...)
			line = append(line, `], "response_message": `...)
			line = append(line, resp...)
			line = append(line, `, "max_context_tokens": 32768, "reward": `...)
			if t == benchTurnsPerSession-1 {
				line = append(line, "1.0"...)
			} else {
				line = append(line, "null"...)
			}
			line = append(line, "}\n"...)
			if _, err := w.Write(line); err != nil {
				f.Close()
				return turns, err
			}
			turns++

			// The next prompt: this one, the output, a tool result.
			tool := 40 + r.IntN(100)
			prompt = append(prompt, out...)
			for i := 0; i < tool; i++ {
				prompt = append(prompt, benchTokenID(r))
			}
			idsText = append(idsText, ", "...)
			idsText = appendIDs(idsText, prompt[len(prompt)-len(out)-tool:])
			hist = append(hist, ", "...)
			hist = append(hist, resp...)
			hist = fmt.Appendf(hist, `, {"role": "tool", "tool_call_id": "%s", "content": "`, call)
			hist = appendBenchText(hist, r, tool*bytesPerToken)
			hist = append(hist, `"}`...)
		}
	}
	if err := w.Flush(); err != nil {
		f.Close()
		return turns, err
	}
	return turns, f.Close()
}

// pyParse is the baseline: CPython reading the file and parsing every line
// with json.loads, nothing else; it prints the lines it parsed.
const pyParse = `import json, sys
n = 0
with open(sys.argv[1], "rb") as f:
    for line in f:
        json.loads(line)
        n += 1
print(n)`

// BenchmarkAssembleJSONL times, in one run and on the same generated file
// (writeBenchTurns: 2,000 turns, ~195 MB at full size), kiln — the built
// kiln-rollout binary running "assemble --turns-jsonl" as a subprocess into
// a fresh local store: the file's sha256 for the version id, reading and
// decoding every line with the same validation and errors, assembly, the
// trajectories' Arrow encoding with zstd, the fsynced write and commit —
// and the baseline: python3 reading the file and calling json.loads on
// every line (CPython's parse alone). Reported: both times, the ratio
// cpython/kiln (the goal is >= 3), kiln's CPU time (all threads) against
// the baseline's, and kiln's peak RSS.
//
//	KILN_BENCH_TURNS_SESSIONS=20 go test ./stages/rollout -run '^$' -bench AssembleJSONL -benchtime 1x -timeout 30m
func BenchmarkAssembleJSONL(b *testing.B) {
	sessions := benchTurnsSessions(b)
	dir := b.TempDir()
	path := filepath.Join(dir, "turns.jsonl")
	turns, err := writeBenchTurns(path, sessions, 1)
	if err != nil {
		b.Fatal(err)
	}
	fi, err := os.Stat(path)
	if err != nil {
		b.Fatal(err)
	}
	mb := float64(fi.Size()) / 1e6
	bin := filepath.Join(dir, "kiln-rollout")
	if out, err := exec.Command("go", "build", "-o", bin, "../../cmd/kiln-rollout").CombinedOutput(); err != nil {
		b.Fatalf("go build: %v\n%s", err, out)
	}
	python, pyErr := exec.LookPath("python3")
	if pyErr != nil {
		b.Logf("no python3 (%v): timing kiln alone", pyErr)
	}
	b.ResetTimer()
	for i := 0; i < b.N; i++ {
		var base, baseCPU time.Duration
		if pyErr == nil {
			cmd := exec.Command(python, "-c", pyParse, path)
			start := time.Now()
			out, err := cmd.Output()
			base = time.Since(start)
			if err != nil {
				b.Fatalf("python3: %v", err)
			}
			if got := strings.TrimSpace(string(out)); got != strconv.Itoa(turns) {
				b.Fatalf("python3 parsed %s lines, want %d", got, turns)
			}
			baseCPU = cpuTime(cmd)
		}

		storeDir := filepath.Join(dir, fmt.Sprintf("store-%d", i))
		cmd := exec.Command(bin, "assemble", "--store", storeDir, "--turns-jsonl", path, "--out", "trajectories/bench")
		var stderr bytes.Buffer
		cmd.Stderr = &stderr
		start := time.Now()
		out, err := cmd.Output()
		kiln := time.Since(start)
		if err != nil {
			b.Fatalf("kiln-rollout assemble: %v\n%s%s", err, out, stderr.Bytes())
		}
		kilnCPU := cpuTime(cmd)
		maxRSS := cmd.ProcessState.SysUsage().(*syscall.Rusage).Maxrss // KiB on Linux
		os.RemoveAll(storeDir)

		b.ReportMetric(kiln.Seconds(), "kiln_s")
		b.ReportMetric(kilnCPU.Seconds(), "kiln_cpu_s")
		b.ReportMetric(mb/kiln.Seconds(), "kiln_MB/s")
		if pyErr == nil {
			b.ReportMetric(base.Seconds(), "cpython_s")
			b.ReportMetric(baseCPU.Seconds(), "cpython_cpu_s")
			b.ReportMetric(base.Seconds()/kiln.Seconds(), "cpython/kiln")
			b.ReportMetric(baseCPU.Seconds()/kilnCPU.Seconds(), "cpython_cpu/kiln_cpu")
		}
		b.ReportMetric(float64(maxRSS)/1024, "peak_rss_MiB")
		b.ReportMetric(mb, "input_MB")
		b.ReportMetric(float64(turns), "turns")
	}
}

// cpuTime is the user and system CPU time of a finished command.
func cpuTime(cmd *exec.Cmd) time.Duration {
	ru := cmd.ProcessState.SysUsage().(*syscall.Rusage)
	return time.Duration(ru.Utime.Nano() + ru.Stime.Nano())
}
