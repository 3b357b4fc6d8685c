package shellagent

import (
	"bytes"
	"context"
	"fmt"
	"io"
	"net"
	"net/http"
	"net/url"
	"time"
)

// The model calls go through net/http (http:// and https://, DNS names,
// chunked or any other framing net/http reads). kiln-agent stays a static
// binary by how it is built, CGO_ENABLED=0 (pure-Go resolver; see doc.go
// and CheckStatic), not by avoiding "net".

// maxResponseBytes bounds a reply body read into memory.
const maxResponseBytes = 64 << 20

// Transport timeouts. A model call as a whole has no timeout of its own:
// generation may take long, and the request's context carries the run's
// deadline (Config.Timeout), which bounds every phase. Connecting and the
// TLS handshake are bounded on their own so that an address that swallows
// packets is a connection error, retried, not a run that waits out its
// budget.
const (
	dialTimeout         = 30 * time.Second
	tlsHandshakeTimeout = 30 * time.Second
	idleConnTimeout     = 90 * time.Second
)

// transportError is a failure to reach the server or to read its reply: the
// kind of error that is retried.
type transportError struct{ err error }

func (e *transportError) Error() string { return e.err.Error() }
func (e *transportError) Unwrap() error { return e.err }

// newHTTPClient is a run's client. Proxy: none from the environment
// (HTTP_PROXY, HTTPS_PROXY, NO_PROXY are the image's or the task's, which
// the bash tool passes on to commands; the adapter is reached directly);
// proxy, when set (Config.Proxy, KILN_AGENT_PROXY), is used for every call.
// Redirects are not followed: a 3xx is a failed call like any non-2xx (a
// 301/302 would otherwise turn the POST into a GET).
func newHTTPClient(proxy *url.URL) *http.Client {
	tr := &http.Transport{
		DialContext:           (&net.Dialer{Timeout: dialTimeout, KeepAlive: 30 * time.Second}).DialContext,
		TLSHandshakeTimeout:   tlsHandshakeTimeout,
		IdleConnTimeout:       idleConnTimeout,
		MaxIdleConns:          2,
		ExpectContinueTimeout: time.Second,
		ForceAttemptHTTP2:     true,
	}
	if proxy != nil {
		tr.Proxy = http.ProxyURL(proxy)
	}
	return &http.Client{
		Transport:     tr,
		CheckRedirect: func(*http.Request, []*http.Request) error { return http.ErrUseLastResponse },
	}
}

// httpPost sends body to u with the given headers (name, value pairs) and
// returns the status and the whole reply body. ctx cancels it at any point.
func httpPost(ctx context.Context, hc *http.Client, u *url.URL, headers [][2]string, body []byte) (int, []byte, error) {
	req, err := http.NewRequestWithContext(ctx, http.MethodPost, u.String(), bytes.NewReader(body))
	if err != nil {
		return 0, nil, fmt.Errorf("model call: %w", err)
	}
	for _, h := range headers {
		req.Header.Set(h[0], h[1])
	}
	resp, err := hc.Do(req)
	if err != nil {
		return 0, nil, &transportError{err}
	}
	defer resp.Body.Close()
	b, err := io.ReadAll(io.LimitReader(resp.Body, maxResponseBytes+1))
	if err != nil {
		return 0, nil, &transportError{fmt.Errorf("read reply from %s: %w", u.Redacted(), err)}
	}
	if len(b) > maxResponseBytes {
		return 0, nil, &transportError{fmt.Errorf("reply from %s: body is over %d bytes", u.Redacted(), maxResponseBytes)}
	}
	return resp.StatusCode, b, nil
}
