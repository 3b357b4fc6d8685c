package adapter_test

import (
	"encoding/json"
	"io"
	"maps"
	"net"
	"net/http"
	"strings"
	"testing"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/kilnrl/kiln/internal/agent/adapter"
	"github.com/kilnrl/kiln/internal/agent/enginetest"
)

// The write timeout bounds each write, not the turn: turns that generate
// for several times HTTPLimits.WriteTimeout — answered whole, or streamed
// with keep-alives between — are answered in full. Served by net/http
// with the same WriteTimeout as a whole-request limit, the same turns are
// cut (which is why NewHTTPServer moves the deadline).
func TestWriteTimeoutOutlivedByLongTurns(t *testing.T) {
	const writeTimeout, latency = 100 * time.Millisecond, 400 * time.Millisecond
	for _, pr := range protoRequests {
		for _, stream := range []bool{false, true} {
			name := pr.name + map[bool]string{true: "/stream", false: "/json"}[stream]
			t.Run(name, func(t *testing.T) {
				t.Parallel()
				body := maps.Clone(pr.body)
				body["stream"] = stream
				eo := enginetest.Options{Script: constant("hi"), Latency: latency}
				ao := adapter.Options{KeepAlive: 30 * time.Millisecond}

				f := newFixtureLimits(t, eo, ao, adapter.HTTPLimits{WriteTimeout: writeTimeout})
				r := f.post(t, pr.path, "s", body)
				require.Equal(t, http.StatusOK, r.status, string(r.body))
				if stream {
					var rest strings.Builder
					n := 0
					for _, ev := range strings.SplitAfter(string(r.body), "\n\n") {
						if keepAliveEvent.MatchString(ev) {
							n++
							continue
						}
						rest.WriteString(ev)
					}
					assert.Positive(t, n, "keep-alives were sent")
					parseSSE(t, []byte(rest.String()))
				}
				turns, err := f.ad.Finish("s")
				require.NoError(t, err)
				assert.Len(t, turns, 1, "the turn is recorded")

				// The contrast: net/http's whole-request write timeout.
				g := newFixture(t, eo, ao)
				ln, err := net.Listen("tcp", "127.0.0.1:0")
				require.NoError(t, err)
				plain := &http.Server{Handler: g.ad, WriteTimeout: writeTimeout}
				go plain.Serve(ln)
				t.Cleanup(func() { plain.Close() })
				g.url = "http://" + ln.Addr().String()
				b, err := json.Marshal(body)
				require.NoError(t, err)
				req, err := http.NewRequest(http.MethodPost, g.url+pr.path, strings.NewReader(string(b)))
				require.NoError(t, err)
				req.Header.Set("Authorization", "Bearer s")
				req.Header.Set("Content-Type", "application/json")
				res, err := http.DefaultClient.Do(req)
				if err == nil {
					_, err = io.ReadAll(res.Body)
					res.Body.Close()
				}
				require.Error(t, err, "a whole-request write timeout cuts the turn")
			})
		}
	}
}
