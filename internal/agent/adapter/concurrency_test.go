package adapter_test

import (
	"context"
	"net/http"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/kilnrl/kiln/internal/agent/adapter"
	"github.com/kilnrl/kiln/internal/agent/enginetest"
)

// docs/adapter.md §8 case 37: a client that goes away while the engine call is pending
// aborts the engine request; nothing is recorded; the session still works.
func TestClientDisconnectCancelsEngineCall(t *testing.T) {
	f := newFixture(t, enginetest.Options{Script: constant("ok"), Latency: 400 * time.Millisecond}, adapter.Options{})
	ctx, cancel := context.WithTimeout(context.Background(), 100*time.Millisecond)
	defer cancel()
	req, err := http.NewRequestWithContext(ctx, http.MethodPost, f.url+"/v1/messages",
		strings.NewReader(`{"max_tokens":5,"messages":[{"role":"user","content":"hi"}]}`))
	require.NoError(t, err)
	req.Header.Set("Authorization", "Bearer s")
	_, err = http.DefaultClient.Do(req)
	require.Error(t, err)
	require.Eventually(t, func() bool { return f.eng.Aborted() >= 1 }, 3*time.Second, 10*time.Millisecond)

	r := f.post(t, "/v1/messages", "s", protoRequests[0].body)
	require.Equal(t, http.StatusOK, r.status, string(r.body))
	turns, err := f.ad.Finish("s")
	require.NoError(t, err)
	require.Len(t, turns, 1)
}

// docs/adapter.md §2.3: the turns of one session run one at a time; other sessions run in
// parallel.
func TestTurnsOfOneSessionAreSerialized(t *testing.T) {
	var active, maxActive atomic.Int32
	script := func(r enginetest.Request) enginetest.Output {
		if r.SessionID == "s" {
			n := active.Add(1)
			for {
				m := maxActive.Load()
				if n <= m || maxActive.CompareAndSwap(m, n) {
					break
				}
			}
			time.Sleep(30 * time.Millisecond)
			active.Add(-1)
		}
		return enginetest.Output{Text: "ok"}
	}
	f := newFixture(t, enginetest.Options{Script: script}, adapter.Options{})
	var wg sync.WaitGroup
	for i := 0; i < 4; i++ {
		wg.Add(1)
		go func() {
			defer wg.Done()
			r := f.post(t, "/v1/messages", "s", protoRequests[0].body)
			assert.Equal(t, http.StatusOK, r.status)
		}()
	}
	wg.Wait()
	assert.Equal(t, int32(1), maxActive.Load())
	turns, err := f.ad.Finish("s")
	require.NoError(t, err)
	require.Len(t, turns, 4)
	for i, tr := range turns {
		assert.Equal(t, int32(i), tr.Turn)
	}
}
