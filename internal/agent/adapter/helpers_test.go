package adapter_test

import (
	"bufio"
	"bytes"
	"context"
	"encoding/json"
	"io"
	"net"
	"net/http"
	"net/http/httptest"
	"strings"
	"testing"

	"github.com/stretchr/testify/require"

	"github.com/kilnrl/kiln/internal/agent/adapter"
	"github.com/kilnrl/kiln/internal/agent/engine"
	"github.com/kilnrl/kiln/internal/agent/enginetest"
	"github.com/kilnrl/kiln/internal/agent/protocol"
)

type fixture struct {
	eng    *enginetest.Engine
	client *engine.Client
	ad     *adapter.Server
	url    string // the adapter's base URL
}

// newFixture starts a scripted engine and an adapter in front of it. The
// engine log is reset after the probe.
func newFixture(t *testing.T, eo enginetest.Options, ao adapter.Options) *fixture {
	t.Helper()
	return newFixtureLimits(t, eo, ao, adapter.HTTPLimits{})
}

// newFixtureLimits is newFixture with the adapter's server under lim.
func newFixtureLimits(t *testing.T, eo enginetest.Options, ao adapter.Options, lim adapter.HTTPLimits) *fixture {
	t.Helper()
	dir := t.TempDir()
	require.NoError(t, enginetest.WriteTokenizerFiles(dir))
	eng := enginetest.New(eo)
	esrv := httptest.NewServer(eng)
	t.Cleanup(esrv.Close)
	c, err := engine.New(engine.Options{BaseURL: esrv.URL, Mode: engine.ModeGenerate})
	require.NoError(t, err)
	_, err = c.Probe(context.Background())
	require.NoError(t, err)
	sp, err := engine.LoadSpecialTokens(dir)
	require.NoError(t, err)
	ao.Engine = c
	ao.Special = sp
	if ao.IDs == nil {
		ao.IDs = protocol.SeededIDs(7)
	}
	ad := adapter.New(ao)
	// Served as kiln-rollout adapter serves it.
	url := serveLoopback(t, ad, lim)
	eng.Reset()
	return &fixture{eng: eng, client: c, ad: ad, url: url}
}

// serveLoopback serves h on a new listener on 127.0.0.1 with the server
// kiln-rollout adapter serves with (adapter.NewHTTPServer under lim) until
// the test ends, and returns its base URL.
func serveLoopback(t testing.TB, h http.Handler, lim adapter.HTTPLimits) string {
	t.Helper()
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	require.NoError(t, err)
	srv := adapter.NewHTTPServer(h, lim, nil)
	served := make(chan struct{})
	go func() { _ = srv.Serve(ln); close(served) }()
	t.Cleanup(func() { srv.Close(); <-served })
	return "http://" + ln.Addr().String()
}

type response struct {
	status int
	header http.Header
	body   []byte
}

func (f *fixture) do(t *testing.T, method, path, sid string, body string, hdr ...string) response {
	t.Helper()
	req, err := http.NewRequest(method, f.url+path, strings.NewReader(body))
	require.NoError(t, err)
	req.Header.Set("Content-Type", "application/json")
	if sid != "" {
		req.Header.Set("Authorization", "Bearer "+sid)
	}
	for i := 0; i+1 < len(hdr); i += 2 {
		req.Header.Set(hdr[i], hdr[i+1])
	}
	res, err := http.DefaultClient.Do(req)
	require.NoError(t, err)
	defer res.Body.Close()
	b, err := io.ReadAll(res.Body)
	require.NoError(t, err)
	return response{status: res.StatusCode, header: res.Header, body: b}
}

func (f *fixture) post(t *testing.T, path, sid string, body any) response {
	t.Helper()
	b, err := json.Marshal(body)
	require.NoError(t, err)
	return f.do(t, http.MethodPost, path, sid, string(b))
}

// prompts returns the token_ids of every generate request, in order.
func (f *fixture) prompts(t *testing.T) [][]int32 {
	t.Helper()
	var out [][]int32
	for _, r := range f.eng.RequestsTo("/inference/v1/generate") {
		var b struct {
			TokenIDs []int32 `json:"token_ids"`
		}
		require.NoError(t, json.Unmarshal(r.Body, &b))
		out = append(out, b.TokenIDs)
	}
	return out
}

func (f *fixture) tokenizeCalls() int { return f.eng.Stats()["/tokenize"].Calls }

func (f *fixture) generateCalls() int { return f.eng.Stats()["/inference/v1/generate"].Calls }

type sseEvent struct {
	event string
	data  string
}

// parseSSE splits a stream into events and fails on a malformed frame.
func parseSSE(t *testing.T, body []byte) []sseEvent {
	t.Helper()
	var out []sseEvent
	var cur sseEvent
	sc := bufio.NewScanner(bytes.NewReader(body))
	sc.Buffer(make([]byte, 1<<20), 1<<24)
	for sc.Scan() {
		line := sc.Text()
		switch {
		case line == "":
			require.NotEmpty(t, cur.data, "event without data")
			out = append(out, cur)
			cur = sseEvent{}
		case strings.HasPrefix(line, "event: "):
			cur.event = strings.TrimPrefix(line, "event: ")
		case strings.HasPrefix(line, "data: "):
			cur.data = strings.TrimPrefix(line, "data: ")
			if cur.data != "[DONE]" {
				require.True(t, json.Valid([]byte(cur.data)), "data is not JSON: %s", cur.data)
			}
		default:
			t.Fatalf("malformed SSE line %q", line)
		}
	}
	require.Equal(t, sseEvent{}, cur, "stream must end with a blank line")
	return out
}

func concat(parts ...[]int32) []int32 {
	var out []int32
	for _, p := range parts {
		out = append(out, p...)
	}
	return out
}
