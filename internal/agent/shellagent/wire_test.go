package shellagent_test

import (
	"bytes"
	"context"
	"encoding/json"
	"net"
	"net/http"
	"net/http/httptest"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/kilnrl/kiln/internal/agent/adapter"
	"github.com/kilnrl/kiln/internal/agent/enginetest"
	"github.com/kilnrl/kiln/internal/agent/shellagent"
)

// What goes on the wire, against a server that answers from a list: the
// request's shape and headers, the history re-sent in full with the tool
// results under their call ids, and calls whose arguments are not JSON.
func TestRequestsOnTheWire(t *testing.T) {
	f := &fake{replies: []fakeReply{
		{200, completion("", [2]string{"bash", `{"command":"echo hi"}`}, [2]string{"bash", `{not json`}, [2]string{"edit", `[1,2]`})},
		{200, completion("all done")},
	}}
	url := serve(t, f) + "/v1/"
	temp := 0.0
	res, evs := run(t, shellagent.Config{BaseURL: url, APIKey: "key-1", Session: "sess-9", Temperature: &temp, MaxTokens: 99})
	require.Equal(t, shellagent.ExitFinal, res.ExitCode, "%+v", res)
	assert.Equal(t, "all done", res.Final)
	assert.Equal(t, 2, res.Turns)
	require.Equal(t, 2, f.requests())

	for _, h := range f.headers {
		assert.Equal(t, "Bearer key-1", h.Get("Authorization"))
		assert.Equal(t, "sess-9", h.Get("X-Session-Id"))
		assert.Equal(t, "application/json", h.Get("Content-Type"))
	}
	var req [2]struct {
		Model      string           `json:"model"`
		Messages   []map[string]any `json:"messages"`
		Tools      []map[string]any `json:"tools"`
		ToolChoice string           `json:"tool_choice"`
		Stream     *bool            `json:"stream"`
		Temp       *float64         `json:"temperature"`
		MaxTokens  int              `json:"max_tokens"`
		Metadata   map[string]any   `json:"metadata"`
	}
	for i := range req {
		require.NoError(t, json.Unmarshal(f.bodies[i], &req[i]))
	}
	r0, r1 := req[0], req[1]
	assert.Equal(t, "m", r0.Model)
	assert.Equal(t, "auto", r0.ToolChoice)
	require.NotNil(t, r0.Stream)
	assert.False(t, *r0.Stream)
	require.NotNil(t, r0.Temp)
	assert.Equal(t, 0.0, *r0.Temp)
	assert.Equal(t, 99, r0.MaxTokens)
	assert.Equal(t, map[string]any{"session_id": "sess-9"}, r0.Metadata)
	require.Len(t, r0.Tools, 2)
	var names []string
	for _, tl := range r0.Tools {
		assert.Equal(t, "function", tl["type"])
		fn := tl["function"].(map[string]any)
		names = append(names, fn["name"].(string))
		assert.Equal(t, "object", fn["parameters"].(map[string]any)["type"])
	}
	assert.Equal(t, []string{"bash", "edit"}, names)
	assert.Equal(t, []any{"command"}, r0.Tools[0]["function"].(map[string]any)["parameters"].(map[string]any)["required"])
	assert.Equal(t, []any{"path", "old_str", "new_str"}, r0.Tools[1]["function"].(map[string]any)["parameters"].(map[string]any)["required"])

	require.Len(t, r0.Messages, 2)
	assert.Equal(t, "system", r0.Messages[0]["role"])
	assert.Equal(t, map[string]any{"role": "user", "content": "fix the bug"}, r0.Messages[1])
	// The second request re-sends the first two messages as they were,
	// then the assistant message as received and one tool message per call.
	require.Len(t, r1.Messages, 6)
	assert.Equal(t, r0.Messages, r1.Messages[:2])
	asst := r1.Messages[2]
	assert.Equal(t, "assistant", asst["role"])
	assert.Nil(t, asst["content"])
	calls := asst["tool_calls"].([]any)
	require.Len(t, calls, 3)
	assert.Equal(t, `{not json`, calls[1].(map[string]any)["function"].(map[string]any)["arguments"])
	for i, m := range r1.Messages[3:] {
		assert.Equal(t, "tool", m["role"])
		assert.Equal(t, calls[i].(map[string]any)["id"], m["tool_call_id"])
	}
	assert.Equal(t, "hi\n[exit code 0]", r1.Messages[3]["content"])
	assert.Contains(t, r1.Messages[4]["content"], "error: bash: invalid arguments")
	assert.Contains(t, r1.Messages[5]["content"], "error: edit: invalid arguments")
	assert.Len(t, toolResults(evs), 3)
}

// Failed model calls: what is retried, how often, and the exit status.
func TestModelCallFailures(t *testing.T) {
	ok := fakeReply{200, completion("fine")}
	e500 := fakeReply{500, `{"error":{"message":"boom"}}`}
	e503 := fakeReply{503, `{"error":{"message":"closed"}}`}
	cases := []struct {
		name     string
		replies  []fakeReply
		code     int
		requests int
		errText  string
	}{
		{"5xx twice then fine", []fakeReply{e500, e503, ok}, shellagent.ExitFinal, 3, ""},
		{"5xx three times", []fakeReply{e500, e500, e500, ok}, shellagent.ExitError, 3, "HTTP 500: {\"error\":{\"message\":\"boom\"}}"},
		{"400 at once", []fakeReply{{400, `{"error":{"message":"bad"}}`}, ok}, shellagent.ExitError, 1, "HTTP 400"},
		{"404 at once", []fakeReply{{404, `not here`}, ok}, shellagent.ExitError, 1, "HTTP 404: not here"},
		{"a reply that is not JSON is not retried", []fakeReply{{200, `<html>`}, ok}, shellagent.ExitError, 1, "model reply"},
		{"no choices", []fakeReply{{200, `{"choices":[]}`}, ok}, shellagent.ExitError, 1, "no choices"},
	}
	for _, tc := range cases {
		t.Run(tc.name, func(t *testing.T) {
			f := &fake{replies: tc.replies}
			res, evs := run(t, shellagent.Config{BaseURL: serve(t, f) + "/v1"})
			assert.Equal(t, tc.code, res.ExitCode, "%+v", res)
			assert.Equal(t, tc.requests, f.requests())
			if tc.errText != "" {
				assert.ErrorContains(t, res.Err, tc.errText)
			}
			assert.Len(t, ofKind(evs, "model_error"), tc.requests-boolInt(tc.code == shellagent.ExitFinal))
		})
	}
}

func boolInt(b bool) int {
	if b {
		return 1
	}
	return 0
}

// A server that is not there: connection errors are retried, then exit 1.
func TestConnectionRefused(t *testing.T) {
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	require.NoError(t, err)
	addr := ln.Addr().String()
	require.NoError(t, ln.Close())
	res, evs := run(t, shellagent.Config{BaseURL: "http://" + addr + "/v1"})
	assert.Equal(t, shellagent.ExitError, res.ExitCode)
	assert.ErrorContains(t, res.Err, "connection refused")
	errs := ofKind(evs, "model_error")
	require.Len(t, errs, 3)
	assert.Equal(t, []any{true, true, false}, []any{errs[0]["retry"], errs[1]["retry"], errs[2]["retry"]})
}

// Replies in every body framing net/http writes: Content-Length, chunked
// (a large body flushed in parts), and to EOF on a closed connection.
func TestReplyFraming(t *testing.T) {
	big := strings.Repeat("x", 200000)
	body := completion(big)
	cases := map[string]http.HandlerFunc{
		"content-length": func(w http.ResponseWriter, r *http.Request) {
			w.Header().Set("Content-Length", itoa(len(body)))
			_, _ = w.Write([]byte(body))
		},
		"chunked": func(w http.ResponseWriter, r *http.Request) {
			for i := 0; i < len(body); i += 7000 {
				_, _ = w.Write([]byte(body[i:min(i+7000, len(body))]))
				w.(http.Flusher).Flush()
			}
		},
		"to eof": func(w http.ResponseWriter, r *http.Request) {
			conn, buf, err := w.(http.Hijacker).Hijack()
			require.NoError(t, err)
			defer conn.Close()
			_, _ = buf.WriteString("HTTP/1.0 100 Continue\r\n\r\nHTTP/1.0 200 OK\r\nContent-Type: application/json\r\n\r\n" + body)
			_ = buf.Flush()
		},
	}
	for name, h := range cases {
		t.Run(name, func(t *testing.T) {
			srv := httptest.NewServer(h) // plain net/http: it can hijack
			defer srv.Close()
			res, _ := run(t, shellagent.Config{BaseURL: srv.URL + "/v1"})
			require.Equal(t, shellagent.ExitFinal, res.ExitCode, "%+v", res)
			assert.Equal(t, big, res.Final)
		})
	}
}

func itoa(n int) string { b, _ := json.Marshal(n); return string(b) }

// With a reasoning parser the reply carries reasoning_content; kiln-agent
// echoes it, so the engine renders the model's own history and the adapter
// reuses each turn's exact tokens even with Qwen3's template, which drops
// an earlier assistant's <think> block when it has no reasoning.
func TestReasoningEchoKeepsPrefixReuse(t *testing.T) {
	s := newStackWith(t, enginetest.Options{MaxModelLen: 1 << 16, Template: enginetest.ChatTemplate{OpenThinkInGenerationPrompt: true},
		Script: steps(t,
			step{out: "I should look.\n</think>\n\n" + bash("ls")},
			step{out: "Now answer.\n</think>\n\nNothing to do.", want: []string{"a.txt"}},
		)}, adapter.Options{ReasoningParser: "qwen3"})
	work := t.TempDir()
	require.NoError(t, os.WriteFile(filepath.Join(work, "a.txt"), nil, 0o644))
	res, evs := run(t, shellagent.Config{BaseURL: s.url, APIKey: "r", Workdir: work})
	require.Equal(t, shellagent.ExitFinal, res.ExitCode, "%+v", res)
	assert.Equal(t, "Nothing to do.", res.Final)
	turns, err := s.ad.Finish("r")
	require.NoError(t, err)
	require.Len(t, turns, 2)
	full := append(append([]int32{}, turns[0].PromptIDs...), turns[0].OutputIDs...)
	require.Greater(t, len(turns[1].PromptIDs), len(full))
	assert.Equal(t, full, turns[1].PromptIDs[:len(full)])
	msg := ofKind(evs, "assistant")[0]["message"].(map[string]any)
	assert.Equal(t, "I should look.\n", msg["reasoning_content"])
}

// Cancelling Run's context (kiln-agent: SIGTERM or SIGINT) kills the
// running command and ends the run as interrupted, exit 1.
func TestInterrupted(t *testing.T) {
	f := &fake{replies: []fakeReply{{200, completion("", [2]string{"bash", `{"command":"sleep 30"}`})}}}
	ctx, cancel := context.WithCancel(context.Background())
	time.AfterFunc(300*time.Millisecond, cancel)
	var log bytes.Buffer
	start := time.Now()
	res := shellagent.Run(ctx, shellagent.Config{BaseURL: serve(t, f) + "/v1", Model: "m", Task: "t", Workdir: t.TempDir(), Log: &log})
	assert.Less(t, time.Since(start), 10*time.Second)
	assert.Equal(t, shellagent.ExitError, res.ExitCode)
	assert.Equal(t, "interrupted", res.Reason)
	assert.ErrorIs(t, res.Err, context.Canceled)
	r := toolResults(events(t, log.Bytes()))
	require.Len(t, r, 1)
	assert.Equal(t, true, r[0]["timed_out"])
	assert.Contains(t, r[0]["output"], "[killed: the run was interrupted]")
}

// An IPv6 adapter address works as well (skipped where there is no ::1).
func TestIPv6(t *testing.T) {
	ln, err := net.Listen("tcp6", "[::1]:0")
	if err != nil {
		t.Skipf("no IPv6 loopback: %v", err)
	}
	srv := &http.Server{Handler: &fake{replies: []fakeReply{{200, completion("v6")}}}}
	go func() { _ = srv.Serve(ln) }()
	t.Cleanup(func() { _ = srv.Close() })
	res, _ := run(t, shellagent.Config{BaseURL: "http://" + ln.Addr().String() + "/v1"})
	require.Equal(t, shellagent.ExitFinal, res.ExitCode, "%+v", res)
	assert.Equal(t, "v6", res.Final)
}

// A redirect is not followed (a 302 would turn the POST into a GET): the
// 3xx is a failed call, not retried.
func TestRedirectNotFollowed(t *testing.T) {
	f := &fake{replies: []fakeReply{{200, completion("should not be asked")}}}
	target := serve(t, f)
	var hits int
	redirect := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		hits++
		http.Redirect(w, r, target+r.URL.Path, http.StatusFound)
	}))
	defer redirect.Close()
	res, evs := run(t, shellagent.Config{BaseURL: redirect.URL + "/v1"})
	assert.Equal(t, shellagent.ExitError, res.ExitCode, "%+v", res)
	assert.ErrorContains(t, res.Err, "HTTP 302")
	assert.Equal(t, 1, hits)
	assert.Equal(t, 0, f.requests())
	errs := ofKind(evs, "model_error")
	require.Len(t, errs, 1)
	assert.Equal(t, false, errs[0]["retry"])
}
