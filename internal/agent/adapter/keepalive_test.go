package adapter_test

import (
	"bufio"
	"bytes"
	"context"
	"encoding/json"
	"io"
	"maps"
	"net/http"
	"regexp"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/kilnrl/kiln/internal/agent/adapter"
	"github.com/kilnrl/kiln/internal/agent/enginetest"
	"github.com/kilnrl/kiln/internal/agent/protocol"
)

// A streamed turn slower than Options.KeepAlive is answered at once with
// the stream's head and the protocol's keep-alive frames (protocol.Prelude),
// then the very reply a fast turn gets (on Responses: the same events, the
// first sent early, numbered on after the keep-alives); faster turns and
// JSON turns are answered as before, whole, with a length.
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
				if !stream {
					assert.Equal(t, string(fast.body), string(slow.body))
					assert.NotEmpty(t, slow.header.Get("Content-Length"), "no keep-alive: answered whole")
					return
				}
				assert.Empty(t, slow.header.Get("Content-Length"), "the head went before the reply's length was known")
				assert.Equal(t, protocol.ContentTypeSSE, slow.header.Get("Content-Type"))
				rest, n := withoutKeepAlives(string(slow.body))
				assert.GreaterOrEqual(t, n, 2, "keep-alive frames before the reply (one every %s for %s)", every, latency)
				want, _ := withoutKeepAlives(string(fast.body))
				assert.Equal(t, want, rest, "less the keep-alives, the reply a fast turn gets")
				if pr.name == "responses" {
					assert.True(t, strings.HasPrefix(string(slow.body), "event: response.created\n"), "the reply's first event goes first")
					assertNumbered(t, string(slow.body))
				}
			})
		}
	}
}

// keepAliveEvent matches the frames a prelude repeats.
var keepAliveEvent = regexp.MustCompile(`^(event: ping\n|: keep-alive\n|event: response\.in_progress\n)`)

// withoutKeepAlives drops a stream's keep-alive frames and its events'
// sequence numbers (which count the frames), and counts the frames.
func withoutKeepAlives(body string) (string, int) {
	var b strings.Builder
	n := 0
	for _, ev := range strings.SplitAfter(body, "\n\n") {
		if keepAliveEvent.MatchString(ev) {
			n++
			continue
		}
		b.WriteString(ev)
	}
	return regexp.MustCompile(`"sequence_number":\d+`).ReplaceAllString(b.String(), ""), n
}

// assertNumbered checks that a Responses stream's sequence numbers run
// from 0 without a gap.
func assertNumbered(t *testing.T, body string) {
	t.Helper()
	for i, m := range regexp.MustCompile(`"sequence_number":(\d+)`).FindAllStringSubmatch(body, -1) {
		require.Equal(t, strconv.Itoa(i), m[1], "sequence number of event %d", i)
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
		{protocol.Responses, "/v1/responses", `event: error` + "\n" + `data: {"type":"error","code":null,"message":"vllm upstream 500: boom","param":null,}` + "\n\n"},
	} {
		t.Run(string(c.proto), func(t *testing.T) {
			t.Parallel()
			f := newFixture(t, enginetest.Options{Script: constant("hi"), Latency: latency},
				adapter.Options{KeepAlive: 50 * time.Millisecond})
			f.eng.InjectFault(enginetest.FaultServerError)
			body := `{"stream":true,"max_tokens":5,"messages":[{"role":"user","content":"hi"}]}`
			if c.proto == protocol.Responses {
				body = `{"stream":true,"input":"hi"}`
			}
			req, err := http.NewRequest(http.MethodPost, f.url+c.path, strings.NewReader(body))
			require.NoError(t, err)
			req.Header.Set("Authorization", "Bearer s")
			start := time.Now()
			res, err := http.DefaultClient.Do(req)
			require.NoError(t, err)
			defer res.Body.Close()
			require.Equal(t, http.StatusOK, res.StatusCode)
			rd := bufio.NewReader(res.Body)
			first, err := rd.ReadString('\n')
			require.NoError(t, err)
			assert.Less(t, time.Since(start), latency, "the first frame comes before the generation ends")
			rest, err := io.ReadAll(rd)
			require.NoError(t, err)
			all := first + string(rest)
			stripped, n := withoutKeepAlives(all)
			assert.GreaterOrEqual(t, n, 1)
			if c.proto == protocol.Responses {
				assertNumbered(t, all)
				created, end, ok := strings.Cut(stripped, "\n\n")
				require.True(t, ok)
				assert.True(t, strings.HasPrefix(created, "event: response.created\n"), created)
				stripped = end
			}
			assert.Equal(t, c.wantEnd, stripped)
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
