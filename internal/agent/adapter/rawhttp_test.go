package adapter_test

import (
	"bufio"
	"errors"
	"fmt"
	"io"
	"net"
	"net/http"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/stretchr/testify/require"

	"github.com/kilnrl/kiln/internal/agent/adapter"
	"github.com/kilnrl/kiln/internal/agent/enginetest"
)

// rawOutcome is what a client sees of one raw exchange: the statuses of the
// responses it read (interim ones included), and whether the server had
// closed the connection after the last one.
type rawOutcome struct {
	statuses []int
	closed   bool
}

func (o rawOutcome) String() string {
	return fmt.Sprintf("statuses %v, closed %v", o.statuses, o.closed)
}

// rawCase is one raw exchange: what the client writes, in pieces, with a
// pause before each piece after the first.
type rawCase struct {
	name   string
	pieces []string
	pause  time.Duration
	// closeWrite half-closes the connection once every piece is written.
	closeWrite bool
	want       []int // the statuses expected of both servers
	wantClosed bool
}

// rawExchange writes c's pieces to addr and reads what comes back.
func rawExchange(t *testing.T, addr string, c rawCase) rawOutcome {
	t.Helper()
	conn, err := net.Dial("tcp", addr)
	require.NoError(t, err)
	defer conn.Close()
	go func() {
		// Written apart from the reads: a server may answer (and hang up)
		// before it has read everything.
		for i, p := range c.pieces {
			if i > 0 && c.pause > 0 {
				time.Sleep(c.pause)
			}
			if _, err := io.WriteString(conn, p); err != nil {
				return
			}
		}
		if c.closeWrite {
			_ = conn.(*net.TCPConn).CloseWrite()
		}
	}()
	var out rawOutcome
	require.NoError(t, conn.SetReadDeadline(time.Now().Add(10*time.Second)))
	br := bufio.NewReader(conn)
	for {
		res, err := http.ReadResponse(br, nil)
		if err != nil {
			out.closed = errors.Is(err, io.EOF) || errors.Is(err, io.ErrUnexpectedEOF) || isReset(err)
			require.True(t, out.closed, "%s: reading a response: %v", c.name, err)
			return out
		}
		out.statuses = append(out.statuses, res.StatusCode)
		_, err = io.Copy(io.Discard, res.Body)
		res.Body.Close()
		require.NoError(t, err, "%s: reading a response body", c.name)
		if res.StatusCode >= 200 && len(out.statuses) >= wantResponses(c) {
			break
		}
	}
	// Closed, or kept open for another request?
	require.NoError(t, conn.SetReadDeadline(time.Now().Add(300*time.Millisecond)))
	_, err = br.ReadByte()
	var ne net.Error
	out.closed = !(errors.As(err, &ne) && ne.Timeout())
	return out
}

// wantResponses is how many final responses c asks for (pipelined
// requests ask for one each).
func wantResponses(c rawCase) int {
	n := 0
	for _, s := range c.want {
		if s >= 200 {
			n++
		}
	}
	return max(n, 1)
}

func isReset(err error) bool { return errors.Is(err, syscall.ECONNRESET) }

// The adapter, served as kiln-rollout adapter serves it, answers malformed
// and edge-case requests exactly as a plain net/http server under the same
// limits does: same statuses, same connection close.
func TestRawRequestsLikeNetHTTP(t *testing.T) {
	lim := adapter.HTTPLimits{ReadHeaderTimeout: 300 * time.Millisecond}
	f := newFixtureLimits(t, enginetest.Options{Script: func(enginetest.Request) enginetest.Output { return enginetest.Output{Text: "hi"} }}, adapter.Options{}, lim)
	adapterAddr := strings.TrimPrefix(f.url, "http://")

	// The plain server: net/http's under the same limits, whose handler
	// reads the body under the same size limit and answers 400 when that
	// fails, 200 otherwise (what the adapter answers the valid requests
	// below).
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	require.NoError(t, err)
	plain := &http.Server{
		Handler: http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
			if _, err := io.Copy(io.Discard, http.MaxBytesReader(w, r.Body, adapter.MaxBodyBytes)); err != nil {
				http.Error(w, err.Error(), http.StatusBadRequest)
				return
			}
			w.WriteHeader(http.StatusOK)
		}),
		ReadHeaderTimeout: lim.ReadHeaderTimeout,
		IdleTimeout:       adapter.DefaultIdleTimeout,
		WriteTimeout:      adapter.DefaultWriteTimeout,
		MaxHeaderBytes:    adapter.DefaultMaxHeaderBytes,
	}
	go plain.Serve(ln)
	t.Cleanup(func() { plain.Close() })
	plainAddr := ln.Addr().String()

	const body = `{"model":"m","max_tokens":16,"messages":[{"role":"user","content":"hi"}]}`
	post := func(head string, b string) string {
		return "POST /v1/messages HTTP/1.1\r\nHost: kiln\r\nX-Api-Key: raw\r\nContent-Type: application/json\r\n" + head + "\r\n" + b
	}
	withLen := func(b string) string { return post(fmt.Sprintf("Content-Length: %d\r\n", len(b)), b) }
	chunked := func(b string) string {
		return post("Transfer-Encoding: chunked\r\n", fmt.Sprintf("%x\r\n%s\r\n0\r\n\r\n", len(b), b))
	}
	get := "GET /healthz HTTP/1.1\r\nHost: kiln\r\n\r\n"
	oversized := strings.Repeat("a", adapter.MaxBodyBytes+1)

	cases := []rawCase{
		{name: "get", pieces: []string{get}, want: []int{200}},
		{name: "post with length", pieces: []string{withLen(body)}, want: []int{200}},
		{name: "post chunked", pieces: []string{chunked(body)}, want: []int{200}},
		{name: "pipelined", pieces: []string{get + withLen(body) + get}, want: []int{200, 200, 200}},
		{name: "expect 100-continue", pieces: []string{post(fmt.Sprintf("Content-Length: %d\r\nExpect: 100-continue\r\n", len(body)), ""), body},
			pause: 50 * time.Millisecond, want: []int{100, 200}},
		{name: "expect other", pieces: []string{post("Content-Length: 0\r\nExpect: 200-ok\r\n", "")}, want: []int{417}, wantClosed: true},
		{name: "connection close", pieces: []string{"GET /healthz HTTP/1.1\r\nHost: kiln\r\nConnection: close\r\n\r\n"}, want: []int{200}, wantClosed: true},
		{name: "HTTP/1.0", pieces: []string{"GET /healthz HTTP/1.0\r\n\r\n"}, want: []int{200}, wantClosed: true},
		{name: "HTTP/1.0 keep-alive", pieces: []string{"GET /healthz HTTP/1.0\r\nConnection: keep-alive\r\n\r\n"}, want: []int{200}},
		{name: "HTTP/0.9", pieces: []string{"GET /healthz HTTP/0.9\r\nHost: kiln\r\n\r\n"}, want: []int{505}, wantClosed: true},
		{name: "HTTP/2.0", pieces: []string{"GET / HTTP/2.0\r\nHost: kiln\r\n\r\n"}, want: []int{505}, wantClosed: true},
		{name: "HTTP/3.0", pieces: []string{"GET /healthz HTTP/3.0\r\nHost: kiln\r\n\r\n"}, want: []int{505}, wantClosed: true},
		{name: "HTTP/1.1 misspelt", pieces: []string{"GET /healthz HTTQ/1.1\r\nHost: kiln\r\n\r\n"}, want: []int{400}, wantClosed: true},
		{name: "no version", pieces: []string{"GET /healthz\r\nHost: kiln\r\n\r\n"}, want: []int{400}, wantClosed: true},
		{name: "bad host", pieces: []string{"GET /healthz HTTP/1.1\r\nHost: a b/c\r\n\r\n"}, want: []int{400}, wantClosed: true},
		{name: "missing host", pieces: []string{"GET /healthz HTTP/1.1\r\n\r\n"}, want: []int{400}, wantClosed: true},
		{name: "two hosts", pieces: []string{"GET /healthz HTTP/1.1\r\nHost: a\r\nHost: b\r\n\r\n"}, want: []int{400}, wantClosed: true},
		{name: "bad header name", pieces: []string{"GET /healthz HTTP/1.1\r\nHost: kiln\r\nBad Name: x\r\n\r\n"}, want: []int{400}, wantClosed: true},
		{name: "header value with NUL", pieces: []string{"GET /healthz HTTP/1.1\r\nHost: kiln\r\nX-A: a\x00b\r\n\r\n"}, want: []int{400}, wantClosed: true},
		{name: "duplicate equal lengths", pieces: []string{post(fmt.Sprintf("Content-Length: %d\r\nContent-Length: %[1]d\r\n", len(body)), body)},
			want: []int{200}},
		{name: "conflicting lengths", pieces: []string{post(fmt.Sprintf("Content-Length: %d\r\nContent-Length: %d\r\n", len(body), len(body)+1), body)},
			want: []int{400}, wantClosed: true},
		{name: "negative length", pieces: []string{post("Content-Length: -1\r\n", body)}, want: []int{400}, wantClosed: true},
		{name: "length and chunked", pieces: []string{post(fmt.Sprintf("Content-Length: %d\r\nTransfer-Encoding: chunked\r\n", len(body)),
			fmt.Sprintf("%x\r\n%s\r\n0\r\n\r\n", len(body), body))}, want: []int{200}}, // the length is ignored (RFC 9112 §6.3)
		{name: "unsupported transfer encoding", pieces: []string{post("Transfer-Encoding: gzip\r\n", body)}, want: []int{501}, wantClosed: true},
		{name: "chunk size not hex", pieces: []string{post("Transfer-Encoding: chunked\r\n", "zz\r\n"+body+"\r\n0\r\n\r\n")},
			want: []int{400}, wantClosed: true},
		{name: "chunk without its CRLF", pieces: []string{post("Transfer-Encoding: chunked\r\n", fmt.Sprintf("%x\r\n%sXX0\r\n\r\n", len(body), body))},
			want: []int{400}, wantClosed: true},
		{name: "chunked body cut short", pieces: []string{post("Transfer-Encoding: chunked\r\n", fmt.Sprintf("%x\r\n%s", len(body)+10, body))},
			closeWrite: true, want: []int{400}, wantClosed: true},
		{name: "body shorter than its length", pieces: []string{post(fmt.Sprintf("Content-Length: %d\r\n", len(body)+10), body)},
			closeWrite: true, want: []int{400}, wantClosed: true},
		{name: "oversized head", pieces: []string{"GET /healthz HTTP/1.1\r\nHost: kiln\r\nX-Big: " +
			strings.Repeat("b", adapter.DefaultMaxHeaderBytes+8<<10) + "\r\n\r\n"}, want: []int{431}, wantClosed: true},
		{name: "oversized body", pieces: []string{withLen(oversized)}, want: []int{400}, wantClosed: true},
		{name: "oversized chunked body", pieces: []string{chunked(oversized)}, want: []int{400}, wantClosed: true},
		{name: "head trickled past the timeout", pieces: strings.SplitAfter("GET /healthz HTTP/1.1\r\nHost: kiln\r\nX-Slow: 1234567\r\n\r\n", "\n"),
			pause: 200 * time.Millisecond, want: nil, wantClosed: true},
		{name: "head trickled within the timeout", pieces: strings.SplitAfter(get, "\n"), pause: 50 * time.Millisecond, want: []int{200}},
	}
	for _, c := range cases {
		t.Run(c.name, func(t *testing.T) {
			got := rawExchange(t, adapterAddr, c)
			ref := rawExchange(t, plainAddr, c)
			require.Equal(t, ref.String(), got.String(), "adapter (got) against plain net/http (want)")
			require.Equal(t, rawOutcome{statuses: c.want, closed: c.wantClosed}.String(), got.String())
		})
	}
}
