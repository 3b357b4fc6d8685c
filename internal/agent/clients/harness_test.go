package clients

import (
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"net"
	"net/http"
	"net/http/httptest"
	"os"
	"os/exec"
	"path/filepath"
	"slices"
	"strings"
	"sync"
	"syscall"
	"testing"
	"time"

	"github.com/stretchr/testify/require"

	"github.com/kilnrl/kiln/formats/records"
	"github.com/kilnrl/kiln/internal/agent/adapter"
	"github.com/kilnrl/kiln/internal/agent/engine"
	"github.com/kilnrl/kiln/internal/agent/enginetest"
	"github.com/kilnrl/kiln/internal/testenv"
)

// cliTimeout bounds one CLI run.
const cliTimeout = 60 * time.Second

// taskMarker is in every task prompt; the script answers with a tool call
// only to requests that carry it, tools, and no tool result yet.
const taskMarker = "KILN-CLIENT-TEST"

// findCLI returns the path of an npm CLI installed by
// scripts/install-test-deps.sh (recorded in ~/.cache/kiln/npm-clis-current).
// Missing: the test fails under CI=true, else it is skipped.
func findCLI(t *testing.T, name string) string {
	t.Helper()
	missing := func(why string) string {
		testenv.SkipOrFail(t, "%s CLI not available (%s): run scripts/install-test-deps.sh", name, why)
		return ""
	}
	home, err := os.UserHomeDir()
	if err != nil {
		return missing(err.Error())
	}
	cur, err := os.ReadFile(filepath.Join(home, ".cache", "kiln", "npm-clis-current"))
	if err != nil {
		return missing(err.Error())
	}
	dir := strings.TrimSpace(string(cur))
	if _, err := os.Stat(filepath.Join(dir, ".kiln-complete")); err != nil {
		return missing("incomplete install in " + dir)
	}
	bin := filepath.Join(dir, "node_modules", ".bin", name)
	if _, err := os.Stat(bin); err != nil {
		return missing(err.Error())
	}
	return bin
}

// wireRequest is one request a CLI sent to the adapter.
type wireRequest struct {
	Method, Path, Query string
	Header              http.Header
	Body                []byte
	Status              int
	Resp                []byte // first bytes of the answer (errors)
}

type recWriter struct {
	http.ResponseWriter
	status int
	buf    bytes.Buffer
}

func (w *recWriter) WriteHeader(code int) { w.status = code; w.ResponseWriter.WriteHeader(code) }
func (w *recWriter) Write(p []byte) (int, error) {
	if w.status == 0 {
		w.status = 200
	}
	// The first 4 KB (a kept-alive stream's frames and, when it fails, its
	// error event: the adapter writes an answer in one piece).
	if w.buf.Len() < 4096 {
		w.buf.Write(p[:min(len(p), 4096-w.buf.Len())])
	}
	return w.ResponseWriter.Write(p)
}
func (w *recWriter) Flush() {
	if f, ok := w.ResponseWriter.(http.Flusher); ok {
		f.Flush()
	}
}

// harness is a scripted engine behind the adapter, both on 127.0.0.1.
type harness struct {
	eng    *enginetest.Engine
	srv    *adapter.Server
	url    string // adapter base URL, no /v1
	client *engine.Client

	mu   sync.Mutex
	wire []wireRequest
}

// newHarness starts the engine and the adapter. reasoning selects the
// adapter's qwen3 reasoning parser (the RL run's setting).
// slowness makes a harness's engine take latency over every generation
// and its adapter send keep-alives every keepAlive (0: the default).
type slowness struct {
	latency, keepAlive time.Duration
}

func newHarness(t *testing.T, script enginetest.Script, reasoning bool, slow ...slowness) *harness {
	t.Helper()
	h := &harness{}
	var sl slowness
	if len(slow) > 0 {
		sl = slow[0]
	}
	h.eng = enginetest.New(enginetest.Options{Script: script, MaxModelLen: 1 << 20, Latency: sl.latency,
		Template: enginetest.ChatTemplate{ToolCallStyle: enginetest.Qwen3CoderXML}})
	es := httptest.NewServer(h.eng)
	t.Cleanup(es.Close)
	cl, err := engine.New(engine.Options{BaseURL: es.URL, Mode: engine.ModeGenerate})
	require.NoError(t, err)
	_, err = cl.Probe(context.Background())
	require.NoError(t, err)
	h.client = cl
	dir := t.TempDir()
	require.NoError(t, enginetest.WriteTokenizerFiles(dir))
	special, err := engine.LoadSpecialTokens(dir)
	require.NoError(t, err)
	rp := ""
	if reasoning {
		rp = "qwen3"
	}
	h.srv = adapter.New(adapter.Options{Engine: cl, Special: special, ToolParser: "qwen3_coder", ReasoningParser: rp,
		KeepAlive: sl.keepAlive})
	// Served as kiln-rollout adapter serves it.
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	require.NoError(t, err)
	hs := adapter.NewHTTPServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		body, _ := io.ReadAll(r.Body)
		r.Body = io.NopCloser(bytes.NewReader(body))
		rw := &recWriter{ResponseWriter: w}
		h.srv.ServeHTTP(rw, r)
		h.mu.Lock()
		h.wire = append(h.wire, wireRequest{Method: r.Method, Path: r.URL.Path, Query: r.URL.RawQuery,
			Header: r.Header.Clone(), Body: body, Status: rw.status, Resp: rw.buf.Bytes()})
		h.mu.Unlock()
	}), adapter.HTTPLimits{}, nil)
	served := make(chan struct{})
	go func() { _ = hs.Serve(ln); close(served) }()
	t.Cleanup(func() { hs.Close(); <-served })
	h.url = "http://" + ln.Addr().String()
	return h
}

func (h *harness) requests() []wireRequest {
	h.mu.Lock()
	defer h.mu.Unlock()
	return slices.Clone(h.wire)
}

// logWire logs every request: route, status, and the tools declared. With
// KILN_CLIENTS_DUMP=DIR the bodies are also written to DIR/TEST/NNN.json.
func (h *harness) logWire(t *testing.T) {
	dump := os.Getenv("KILN_CLIENTS_DUMP")
	if dump != "" {
		dump = filepath.Join(dump, strings.ReplaceAll(t.Name(), "/", "_"))
		_ = os.MkdirAll(dump, 0o755)
	}
	for i, r := range h.requests() {
		if dump != "" {
			_ = os.WriteFile(filepath.Join(dump, fmt.Sprintf("%03d.json", i)), r.Body, 0o644)
		}
		var body struct {
			Model     string            `json:"model"`
			Stream    bool              `json:"stream"`
			MaxTokens int               `json:"max_tokens"`
			Tools     []json.RawMessage `json:"tools"`
			Messages  []json.RawMessage `json:"messages"`
			Input     json.RawMessage   `json:"input"`
		}
		_ = json.Unmarshal(r.Body, &body)
		var names []string
		for _, raw := range body.Tools {
			var tl struct{ Name, Type string }
			_ = json.Unmarshal(raw, &tl)
			names = append(names, tl.Type+":"+tl.Name)
		}
		items := body.Messages
		if items == nil {
			_ = json.Unmarshal(body.Input, &items)
		}
		msg := fmt.Sprintf(" items=%d", len(items))
		if len(items) > 0 {
			msg += " last=" + trunc(string(items[len(items)-1]), 240)
		}
		if r.Status != 200 {
			msg += " answer=" + trunc(string(r.Resp), 300)
		}
		t.Logf("wire[%d] %s %s?%s status=%d body=%dB model=%q stream=%v max_tokens=%d tools=%v%s",
			i, r.Method, r.Path, r.Query, r.Status, len(r.Body), body.Model, body.Stream, body.MaxTokens, names, msg)
	}
}

// turnRequests counts the turn requests answered 200.
func (h *harness) turnRequests(path string) (ok, failed int) {
	for _, r := range h.requests() {
		if r.Method == "POST" && r.Path == path {
			if r.Status == 200 && !bytes.Contains(r.Resp, []byte("\nevent: error\n")) {
				ok++
			} else {
				failed++ // an error status, or a kept-alive stream ended by an error event
			}
		}
	}
	return ok, failed
}

func trunc(s string, n int) string {
	if len(s) <= n {
		return s
	}
	return s[:n/2] + "\n...[" + fmt.Sprint(len(s)-n) + " bytes]...\n" + s[len(s)-n/2:]
}

// taskScript answers a task request with toolCall, a request holding a
// tool result with final, and anything else (side requests, extra turns)
// with a short plain text. With think, final and the plain text come after
// a closed think block: under the qwen3 reasoning parser an output without
// </think> is all reasoning, and a reply with no visible text makes Claude
// Code ask again.
func taskScript(toolCall, final string, think bool) enginetest.Script {
	pre := ""
	if think {
		pre = "<think>\nAnswering.\n</think>\n\n"
	}
	return func(r enginetest.Request) enginetest.Output {
		p := r.PromptText
		switch {
		case strings.Contains(p, "<tool_response>"):
			return enginetest.Output{Text: pre + final}
		case strings.Contains(p, taskMarker) && strings.Contains(p, "<tools>"):
			return enginetest.Output{Text: toolCall}
		default:
			return enginetest.Output{Text: pre + "OK."}
		}
	}
}

// tempRepo creates a git repository holding file.txt ("old value\n").
func tempRepo(t *testing.T) string {
	t.Helper()
	dir := t.TempDir()
	require.NoError(t, os.WriteFile(filepath.Join(dir, "file.txt"), []byte("old value\n"), 0o644))
	for _, args := range [][]string{
		{"init", "-q"},
		{"-c", "user.email=t@example.com", "-c", "user.name=t", "add", "file.txt"},
		{"-c", "user.email=t@example.com", "-c", "user.name=t", "commit", "-q", "-m", "init"},
	} {
		out, err := exec.Command("git", append([]string{"-C", dir}, args...)...).CombinedOutput()
		require.NoError(t, err, string(out))
	}
	return dir
}

// runResult is one CLI run.
type runResult struct {
	ExitCode       int
	TimedOut       bool
	Stdout, Stderr string
	Elapsed        time.Duration
}

// runCLI runs bin in dir with exactly env (no inherited environment),
// stdin /dev/null, in its own process group killed on timeout.
func runCLI(t *testing.T, bin, dir string, env, args []string) runResult {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), cliTimeout)
	defer cancel()
	cmd := exec.CommandContext(ctx, bin, args...)
	cmd.Dir = dir
	cmd.Env = env
	cmd.SysProcAttr = &syscall.SysProcAttr{Setpgid: true}
	cmd.Cancel = func() error { return syscall.Kill(-cmd.Process.Pid, syscall.SIGKILL) }
	cmd.WaitDelay = 5 * time.Second
	var stdout, stderr bytes.Buffer
	cmd.Stdout, cmd.Stderr = &stdout, &stderr
	start := time.Now()
	err := cmd.Run()
	res := runResult{Stdout: stdout.String(), Stderr: stderr.String(), Elapsed: time.Since(start)}
	var ee *exec.ExitError
	switch {
	case err == nil:
	case errors.As(err, &ee):
		res.ExitCode = ee.ExitCode()
	default:
		res.ExitCode = -1
		res.Stderr += "\n[run error] " + err.Error()
	}
	res.TimedOut = ctx.Err() != nil
	// The process group may have stragglers (e.g. a node wrapper's child).
	_ = syscall.Kill(-cmd.Process.Pid, syscall.SIGKILL)
	t.Logf("%s exited %d after %s (timed out: %v)", filepath.Base(bin), res.ExitCode, res.Elapsed.Round(time.Millisecond), res.TimedOut)
	return res
}

// baseEnv is the environment every CLI gets: PATH, a private HOME, no
// inherited credentials.
func baseEnv(home string) []string {
	return []string{
		"PATH=" + os.Getenv("PATH"),
		"HOME=" + home,
		"USER=" + os.Getenv("USER"),
		"LANG=C.UTF-8",
		"TERM=dumb",
		"NO_COLOR=1",
		"TMPDIR=" + os.TempDir(),
	}
}

// reuseOf reports whether turn 2's prompt begins with turn 1's
// prompt+output, and else the index of the first differing id.
func reuseOf(turns []records.Turn) (bool, int) {
	want := slices.Concat(turns[0].PromptIDs, turns[0].OutputIDs)
	got := turns[1].PromptIDs
	n := 0
	for n < len(got) && n < len(want) && got[n] == want[n] {
		n++
	}
	return n == len(want), n
}

// checkReuse asserts turn 2's prompt starts with turn 1's prompt + output.
func checkReuse(t *testing.T, turns []records.Turn) bool {
	t.Helper()
	if len(turns) < 2 {
		t.Errorf("want at least 2 recorded turns, got %d", len(turns))
		return false
	}
	want := slices.Concat(turns[0].PromptIDs, turns[0].OutputIDs)
	got := turns[1].PromptIDs
	if len(got) >= len(want) && slices.Equal(got[:len(want)], want) {
		t.Logf("reuse: turn 2 prompt (%d ids) begins with turn 1 prompt+output (%d+%d ids)",
			len(got), len(turns[0].PromptIDs), len(turns[0].OutputIDs))
		return true
	}
	n := 0
	for n < len(got) && n < len(want) && got[n] == want[n] {
		n++
	}
	t.Errorf("no reuse: turn 2 prompt (%d ids) diverges from turn 1 prompt+output (%d ids) at id %d", len(got), len(want), n)
	return false
}

// divergence decodes a window around where turn 2 diverges (for logs).
func divergence(h *harness, turns []records.Turn) string {
	if len(turns) < 2 {
		return ""
	}
	want := slices.Concat(turns[0].PromptIDs, turns[0].OutputIDs)
	got := turns[1].PromptIDs
	n := 0
	for n < len(got) && n < len(want) && got[n] == want[n] {
		n++
	}
	dec := func(ids []int32) string {
		s, err := h.client.Detokenize(context.Background(), ids)
		if err != nil {
			return err.Error()
		}
		return s
	}
	lo := max(0, n-200)
	return fmt.Sprintf("turn1 (from %d): %q\nturn2 (from %d): %q", lo, dec(want[lo:min(len(want), n+200)]), lo, dec(got[lo:min(len(got), n+200)]))
}
