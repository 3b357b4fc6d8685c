package adapter_test

import (
	"bufio"
	"bytes"
	"context"
	"encoding/json"
	"io"
	"maps"
	"net/http"
	"strings"
	"testing"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/kilnrl/kiln/stages/rollout/adapter"
	"github.com/kilnrl/kiln/stages/rollout/enginetest"
	"github.com/kilnrl/kiln/stages/rollout/protocol"
)

// A streamed turn slower than Options.KeepAlive is answered at once with
// the stream's head and the protocol's keep-alive frames, then the very
// reply a fast turn gets; faster turns, JSON turns and Responses streams
// (no frame: protocol.KeepAlive) are answered as before, with a length.
func TestKeepAlive(t *testing.T) {
	const latency, every = 500 * time.Millisecond, 60 * time.Millisecond
	clock := func() time.Time { return time.Unix(1_700_000_000, 0) }
	for _, pr := range protoRequests {
		for _, stream := range []bool{true, false} {
			name := pr.name + map[bool]string{true: "/stream", false: "/json"}[stream]
			t.Run(name, func(t *testing.T) {
				t.Parallel()
				body := maps.Clone(pr.body)
				body["stream"] = stream
				run := func(latency, keepAlive time.Duration) response {
					f := newFixture(t, enginetest.Options{Script: constant("hi"), Latency: latency},
						adapter.Options{KeepAlive: keepAlive, Clock: clock})
					r := f.post(t, pr.path, "s", body)
					require.Equal(t, http.StatusOK, r.status, string(r.body))
					turns, err := f.ad.Finish("s")
					require.NoError(t, err)
					assert.Len(t, turns, 1, "the turn is recorded")
					return r
				}
				fast := run(0, 0) // answered well within DefaultKeepAlive
				slow := run(latency, every)
				assert.NotEmpty(t, fast.header.Get("Content-Length"), "a fast turn is answered whole")

				frame := protocol.KeepAlive(protocol.Protocol(pr.name))
				if !stream || frame == "" {
					assert.Equal(t, string(fast.body), string(slow.body))
					assert.NotEmpty(t, slow.header.Get("Content-Length"), "no keep-alive: answered whole")
					return
				}
				assert.Empty(t, slow.header.Get("Content-Length"), "the head went before the reply's length was known")
				assert.Equal(t, protocol.ContentTypeSSE, slow.header.Get("Content-Type"))
				rest := slow.body
				n := 0
				for bytes.HasPrefix(rest, []byte(frame)) {
					rest, n = rest[len(frame):], n+1
				}
				assert.GreaterOrEqual(t, n, 2, "keep-alive frames before the reply (one every %s for %s)", every, latency)
				assert.Equal(t, string(fast.body), string(rest), "after the frames, the reply a fast turn gets")
			})
		}
	}
}

// A turn that fails after its stream began ends the stream with the
// protocol's error event; nothing is recorded. The first frame comes while
// the engine still generates: the stream really is sent as it goes.
func TestKeepAliveThenError(t *testing.T) {
	const latency = 600 * time.Millisecond
	for _, c := range []struct {
		proto   protocol.Protocol
		path    string
		wantEnd string
	}{
		{protocol.Anthropic, "/v1/messages", `event: error` + "\n" + `data: {"type":"error","error":{"type":"api_error","message":"vllm upstream 500: boom"}}` + "\n\n"},
		{protocol.Chat, "/v1/chat/completions", `data: {"error":{"message":"vllm upstream 500: boom","type":"api_error","param":null,"code":null}}` + "\n\n"},
	} {
		t.Run(string(c.proto), func(t *testing.T) {
			t.Parallel()
			f := newFixture(t, enginetest.Options{Script: constant("hi"), Latency: latency},
				adapter.Options{KeepAlive: 50 * time.Millisecond})
			f.eng.InjectFault(enginetest.FaultServerError)
			req, err := http.NewRequest(http.MethodPost, f.url+c.path,
				strings.NewReader(`{"stream":true,"max_tokens":5,"messages":[{"role":"user","content":"hi"}]}`))
			require.NoError(t, err)
			req.Header.Set("Authorization", "Bearer s")
			start := time.Now()
			res, err := http.DefaultClient.Do(req)
			require.NoError(t, err)
			defer res.Body.Close()
			require.Equal(t, http.StatusOK, res.StatusCode)
			rd := bufio.NewReader(res.Body)
			frame := protocol.KeepAlive(c.proto)
			first := make([]byte, len(frame))
			_, err = io.ReadFull(rd, first)
			require.NoError(t, err)
			assert.Less(t, time.Since(start), latency, "the first frame comes before the generation ends")
			assert.Equal(t, frame, string(first))
			rest, err := io.ReadAll(rd)
			require.NoError(t, err)
			for bytes.HasPrefix(rest, []byte(frame)) {
				rest = rest[len(frame):]
			}
			assert.Equal(t, c.wantEnd, string(rest))
			turns, err := f.ad.Finish("s")
			require.NoError(t, err)
			assert.Empty(t, turns, "a failed turn records nothing")
		})
	}
}

// A client that goes away after the stream began cancels the engine call
// as before, and the session records nothing of it.
func TestKeepAliveClientGone(t *testing.T) {
	f := newFixture(t, enginetest.Options{Script: constant("ok"), Latency: time.Second},
		adapter.Options{KeepAlive: 30 * time.Millisecond})
	ctx, cancel := context.WithCancel(context.Background())
	defer cancel()
	b, _ := json.Marshal(map[string]any{"stream": true, "max_tokens": 5, "messages": []any{map[string]any{"role": "user", "content": "hi"}}})
	req, err := http.NewRequestWithContext(ctx, http.MethodPost, f.url+"/v1/messages", bytes.NewReader(b))
	require.NoError(t, err)
	req.Header.Set("Authorization", "Bearer s")
	res, err := http.DefaultClient.Do(req)
	require.NoError(t, err)
	_, err = bufio.NewReader(res.Body).ReadString('\n') // the first ping
	require.NoError(t, err)
	cancel()
	res.Body.Close()
	require.Eventually(t, func() bool { return f.eng.Aborted() >= 1 }, 3*time.Second, 10*time.Millisecond)
	turns, err := f.ad.Finish("s")
	require.NoError(t, err)
	assert.Empty(t, turns)
}
