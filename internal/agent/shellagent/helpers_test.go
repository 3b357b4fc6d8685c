package shellagent_test

import (
	"bufio"
	"bytes"
	"context"
	"encoding/json"
	"fmt"
	"net"
	"net/http"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/stretchr/testify/require"

	"github.com/kilnrl/kiln/internal/agent/adapter"
	"github.com/kilnrl/kiln/internal/agent/engine"
	"github.com/kilnrl/kiln/internal/agent/enginetest"
	"github.com/kilnrl/kiln/internal/agent/protocol"
	"github.com/kilnrl/kiln/internal/agent/shellagent"
)

// stack is a scripted engine with kiln's adapter in front of it, served as
// kiln-rollout adapter serves it (adapter.NewHTTPServer on loopback).
type stack struct {
	eng *enginetest.Engine
	ad  *adapter.Server
	url string // the adapter's base URL, ending in /v1
}

// newStack builds the stack with the hermes tool parser (Qwen3's own
// format: the script writes calls as JSON, so arguments are exact).
func newStack(t *testing.T, script enginetest.Script, ao adapter.Options) *stack {
	t.Helper()
	return newStackWith(t, enginetest.Options{MaxModelLen: 1 << 16, Script: script}, ao)
}

// newStackWith is newStack with the engine's options.
func newStackWith(t *testing.T, eo enginetest.Options, ao adapter.Options) *stack {
	t.Helper()
	dir := t.TempDir()
	require.NoError(t, enginetest.WriteTokenizerFiles(dir))
	eng := enginetest.New(eo)
	esrv := serve(t, eng)
	c, err := engine.New(engine.Options{BaseURL: esrv, Mode: engine.ModeGenerate})
	require.NoError(t, err)
	_, err = c.Probe(context.Background())
	require.NoError(t, err)
	sp, err := engine.LoadSpecialTokens(dir)
	require.NoError(t, err)
	ao.Engine, ao.Special = c, sp
	if ao.ToolParser == "" {
		ao.ToolParser = "hermes"
	}
	ao.IDs = protocol.SeededIDs(7)
	ad := adapter.New(ao)
	url := serve(t, ad)
	eng.Reset()
	return &stack{eng: eng, ad: ad, url: url + "/v1"}
}

// serve serves h with the adapter's HTTP server on 127.0.0.1 until the test
// ends and returns its base URL.
func serve(t *testing.T, h http.Handler) string {
	t.Helper()
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	require.NoError(t, err)
	srv := adapter.NewHTTPServer(h, adapter.HTTPLimits{}, nil)
	done := make(chan struct{})
	go func() { _ = srv.Serve(ln); close(done) }()
	t.Cleanup(func() { srv.Close(); <-done })
	return "http://" + ln.Addr().String()
}

// call is a hermes tool call as the model writes it, and as the template
// renders it back (Python's json.dumps: ", " and ": " separators, keys in
// order), so that the next prompt extends this output exactly. kv is the
// arguments' string fields, in order.
func call(name string, kv ...string) string {
	var b strings.Builder
	b.WriteString(`<tool_call>` + "\n" + `{"name": ` + jsonString(name) + `, "arguments": {`)
	for i := 0; i+1 < len(kv); i += 2 {
		if i > 0 {
			b.WriteString(", ")
		}
		b.WriteString(jsonString(kv[i]) + ": " + jsonString(kv[i+1]))
	}
	b.WriteString("}}\n</tool_call>")
	return b.String()
}

func jsonString(s string) string {
	var b bytes.Buffer
	enc := json.NewEncoder(&b)
	enc.SetEscapeHTML(false)
	if err := enc.Encode(s); err != nil {
		panic(err)
	}
	return strings.TrimSuffix(b.String(), "\n")
}

func bash(cmd string) string { return call("bash", "command", cmd) }

// step is one scripted model turn: the output, and what the prompt must
// contain by then (the previous tool results, proving they were sent).
type step struct {
	out  string
	want []string
}

// steps scripts a session turn by turn; a prompt missing a wanted string
// fails the turn with a 500 and the test.
func steps(t *testing.T, s ...step) enginetest.Script {
	return func(r enginetest.Request) enginetest.Output {
		if r.Turn >= len(s) {
			return enginetest.Output{Err: fmt.Errorf("script exhausted at turn %d", r.Turn)}
		}
		for _, w := range s[r.Turn].want {
			if !strings.Contains(r.PromptText, w) {
				t.Errorf("turn %d: prompt lacks %q:\n%s", r.Turn, w, r.PromptText)
				return enginetest.Output{Err: fmt.Errorf("prompt lacks %q", w)}
			}
		}
		return enginetest.Output{Text: s[r.Turn].out}
	}
}

// run runs the loop with quick retries and returns the result and the
// transcript's events.
func run(t *testing.T, cfg shellagent.Config) (shellagent.Result, []map[string]any) {
	t.Helper()
	var log bytes.Buffer
	cfg.Log = &log
	if cfg.RetryBackoff == 0 {
		cfg.RetryBackoff = 10 * time.Millisecond
	}
	if cfg.Model == "" {
		cfg.Model = "m"
	}
	if cfg.Task == "" {
		cfg.Task = "fix the bug"
	}
	if cfg.Workdir == "" {
		cfg.Workdir = t.TempDir()
	}
	res := shellagent.Run(context.Background(), cfg)
	return res, events(t, log.Bytes())
}

// events parses a JSONL transcript.
func events(t *testing.T, b []byte) []map[string]any {
	t.Helper()
	var out []map[string]any
	sc := bufio.NewScanner(bytes.NewReader(b))
	sc.Buffer(nil, 1<<24)
	for sc.Scan() {
		var m map[string]any
		require.NoError(t, json.Unmarshal(sc.Bytes(), &m), sc.Text())
		require.NotEmpty(t, m["time"])
		out = append(out, m)
	}
	return out
}

// ofKind returns the events of one kind.
func ofKind(evs []map[string]any, kind string) []map[string]any {
	var out []map[string]any
	for _, e := range evs {
		if e["event"] == kind {
			out = append(out, e)
		}
	}
	return out
}

// toolResults returns the transcript's tool results, in order.
func toolResults(evs []map[string]any) []map[string]any {
	var out []map[string]any
	for _, e := range ofKind(evs, "tool") {
		out = append(out, e["result"].(map[string]any))
	}
	return out
}

// fake is a Chat Completions server that answers from a list: each entry
// is a status and a body (a chat.completion or an error), and it records
// every request body.
type fake struct {
	mu      sync.Mutex
	replies []fakeReply
	bodies  [][]byte
	headers []http.Header
}

type fakeReply struct {
	status int
	body   string
}

func (f *fake) ServeHTTP(w http.ResponseWriter, r *http.Request) {
	var buf bytes.Buffer
	_, _ = buf.ReadFrom(r.Body)
	f.mu.Lock()
	n := len(f.bodies)
	f.bodies = append(f.bodies, buf.Bytes())
	f.headers = append(f.headers, r.Header.Clone())
	f.mu.Unlock()
	if r.URL.Path != "/v1/chat/completions" || n >= len(f.replies) {
		http.Error(w, `{"error":{"message":"unexpected request"}}`, http.StatusNotFound)
		return
	}
	w.Header().Set("Content-Type", "application/json")
	w.WriteHeader(f.replies[n].status)
	_, _ = w.Write([]byte(f.replies[n].body))
}

func (f *fake) requests() int {
	f.mu.Lock()
	defer f.mu.Unlock()
	return len(f.bodies)
}

// completion is a chat.completion whose message makes the given tool calls
// (name, raw arguments string pairs), or answers text when there are none.
func completion(text string, calls ...[2]string) string {
	msg := map[string]any{"role": "assistant", "content": text}
	var tcs []any
	for i, c := range calls {
		tcs = append(tcs, map[string]any{"id": fmt.Sprintf("call_%d", i), "type": "function",
			"function": map[string]any{"name": c[0], "arguments": c[1]}})
	}
	finish := "stop"
	if len(tcs) > 0 {
		msg["content"] = nil
		msg["tool_calls"] = tcs
		finish = "tool_calls"
	}
	b, _ := json.Marshal(map[string]any{"id": "chatcmpl_1", "object": "chat.completion", "model": "m",
		"choices": []any{map[string]any{"index": 0, "message": msg, "finish_reason": finish}}})
	return string(b)
}
