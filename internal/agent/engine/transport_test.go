package engine

import (
	"bufio"
	"context"
	"fmt"
	"io"
	"net"
	"net/http"
	"net/http/httptest"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
)

// countingServer is an httptest server that counts the connections it
// accepts; handler answers each request.
func countingServer(t *testing.T, handler http.HandlerFunc) (*httptest.Server, *atomic.Int64) {
	t.Helper()
	var conns atomic.Int64
	srv := httptest.NewUnstartedServer(handler)
	srv.Config.ConnState = func(_ net.Conn, st http.ConnState) {
		if st == http.StateNew {
			conns.Add(1)
		}
	}
	srv.Start()
	t.Cleanup(srv.Close)
	return srv, &conns
}

// engineClient is a client on the engine's own net/http client.
func engineClient(t *testing.T, base string) *Client {
	t.Helper()
	c, err := New(Options{BaseURL: base})
	require.NoError(t, err)
	return c
}

// The transport's contract, case by case: what is sent, what is read,
// when a connection is kept, and that a POST is never sent twice.
func TestTransport(t *testing.T) {
	ctx := context.Background()

	t.Run("tuned for many sessions", func(t *testing.T) {
		c := engineClient(t, "http://127.0.0.1:1")
		tr, ok := c.hc.Transport.(*http.Transport)
		require.True(t, ok, "net/http's Transport")
		assert.Equal(t, maxIdleConns, tr.MaxIdleConnsPerHost)
		assert.Equal(t, maxIdleConns, tr.MaxIdleConns)
		assert.Equal(t, idleConnTimeout, tr.IdleConnTimeout)
		assert.Nil(t, tr.Proxy, "the engine is reached directly")
		require.NotNil(t, tr.Protocols)
		assert.True(t, tr.Protocols.HTTP1() && !tr.Protocols.HTTP2() && !tr.Protocols.UnencryptedHTTP2(), "HTTP/1.1 only")
		assert.NotNil(t, c.hc.CheckRedirect, "redirects are not followed")

		own := &http.Client{}
		c2, err := New(Options{BaseURL: "http://127.0.0.1:1", HTTPClient: own})
		require.NoError(t, err)
		assert.Same(t, own, c2.hc, "Options.HTTPClient is used as given")
	})

	t.Run("request and reuse", func(t *testing.T) {
		var seen atomic.Value
		srv, conns := countingServer(t, func(w http.ResponseWriter, r *http.Request) {
			b, _ := io.ReadAll(r.Body)
			seen.Store(fmt.Sprintf("%s %s %s|%s|%s|%s|%d", r.Method, r.URL.Path, b, r.Header.Get("Content-Type"),
				r.Header.Get("Authorization"), r.Header.Get("x-session-id"), r.ContentLength))
			fmt.Fprint(w, `{"ok":1}`)
		})
		c, err := New(Options{BaseURL: srv.URL + "/prefix/", APIKey: "k"})
		require.NoError(t, err)
		for i := range 5 {
			r, err := c.do(ctx, http.MethodPost, "/tokenize", []byte(`{"n":`+fmt.Sprint(i)+`}`), map[string]string{"x-session-id": "s1"})
			require.NoError(t, err)
			assert.Equal(t, 200, r.status)
			assert.Equal(t, `{"ok":1}`, string(r.body))
			assert.Equal(t, fmt.Sprintf(`POST /prefix/tokenize {"n":%d}|application/json|Bearer k|s1|7`, i), seen.Load())
		}
		r, err := c.do(ctx, http.MethodGet, "/version", nil, nil)
		require.NoError(t, err)
		assert.Equal(t, "GET /prefix/version ||Bearer k||0", seen.Load())
		assert.Equal(t, 200, r.status)
		assert.Equal(t, int64(1), conns.Load(), "one keep-alive connection for every request")
	})

	t.Run("chunked reply", func(t *testing.T) {
		srv, conns := countingServer(t, func(w http.ResponseWriter, r *http.Request) {
			for _, part := range []string{`{"tokens":`, `[1,2,`, `3]}`} {
				fmt.Fprint(w, part)
				w.(http.Flusher).Flush() // no Content-Length: chunked
			}
		})
		c := engineClient(t, srv.URL)
		for range 3 {
			ids, err := c.tokenize(ctx, []byte(`{}`), nil)
			require.NoError(t, err)
			assert.Equal(t, []int32{1, 2, 3}, ids)
		}
		assert.Equal(t, int64(1), conns.Load(), "a chunked body read to its end leaves the connection reusable")
	})

	t.Run("server closes idle connections", func(t *testing.T) {
		srv, conns := countingServer(t, func(w http.ResponseWriter, r *http.Request) {
			if r.URL.Path == "/slow" {
				time.Sleep(50 * time.Millisecond) // the requests overlap: one connection each
			}
			fmt.Fprint(w, `{}`)
		})
		srv.Config.SetKeepAlivesEnabled(true)
		c := engineClient(t, srv.URL)
		for i := range 3 {
			_, err := c.do(ctx, http.MethodGet, "/health", nil, nil)
			require.NoError(t, err, "request %d", i)
			srv.CloseClientConnections() // what a keep-alive timeout does
			time.Sleep(20 * time.Millisecond)
		}
		assert.Equal(t, int64(3), conns.Load(), "a connection the server closed is not reused")

		// Several idle connections closed at once: the request passes over
		// all of them, sent on none, to one new connection.
		var wg sync.WaitGroup
		for range 3 {
			wg.Add(1)
			go func() {
				defer wg.Done()
				_, err := c.do(ctx, http.MethodGet, "/slow", nil, nil)
				assert.NoError(t, err)
			}()
		}
		wg.Wait()
		before := conns.Load()
		require.GreaterOrEqual(t, before, int64(5), "concurrent requests opened connections of their own")
		srv.CloseClientConnections()
		time.Sleep(20 * time.Millisecond)
		_, err := c.do(ctx, http.MethodPost, "/tokenize", []byte(`{}`), nil)
		require.NoError(t, err)
		assert.Equal(t, before+1, conns.Load(), "one new connection")
	})

	t.Run("connection close", func(t *testing.T) {
		srv, conns := countingServer(t, func(w http.ResponseWriter, r *http.Request) {
			w.Header().Set("Connection", "close")
			fmt.Fprint(w, `{}`)
		})
		c := engineClient(t, srv.URL)
		for range 3 {
			_, err := c.do(ctx, http.MethodGet, "/health", nil, nil)
			require.NoError(t, err)
		}
		assert.Equal(t, int64(3), conns.Load())
	})

	t.Run("error status keeps the body", func(t *testing.T) {
		srv, _ := countingServer(t, func(w http.ResponseWriter, r *http.Request) {
			http.Error(w, `{"error":{"message":"bad things"}}`, http.StatusBadRequest)
		})
		c := engineClient(t, srv.URL)
		_, err := c.tokenize(ctx, []byte(`{}`), nil)
		var he *HTTPError
		require.ErrorAs(t, err, &he)
		assert.Equal(t, 400, he.Status)
		assert.Equal(t, "bad things", he.Message)
	})

	t.Run("header with a line break", func(t *testing.T) {
		srv, _ := countingServer(t, func(w http.ResponseWriter, r *http.Request) { t.Error("request reached the server") })
		c := engineClient(t, srv.URL)
		_, err := c.do(ctx, http.MethodPost, "/x", []byte(`{}`), map[string]string{"x-session-id": "a\r\nEvil: 1"})
		require.ErrorContains(t, err, `"x-session-id"`)
	})

	t.Run("connection dropped mid-request", func(t *testing.T) {
		// A server that reads the request and hangs up may have acted on it:
		// the error goes to the caller and nothing is sent twice.
		ln, err := net.Listen("tcp", "127.0.0.1:0")
		require.NoError(t, err)
		defer ln.Close()
		var requests atomic.Int64
		go func() {
			for {
				nc, err := ln.Accept()
				if err != nil {
					return
				}
				go func() {
					defer nc.Close()
					br := bufio.NewReader(nc)
					for {
						req, err := http.ReadRequest(br)
						if err != nil {
							return
						}
						io.Copy(io.Discard, req.Body)
						if requests.Add(1) == 2 {
							return // hang up without a reply
						}
						fmt.Fprint(nc, "HTTP/1.1 200 OK\r\nContent-Length: 2\r\n\r\n{}")
					}
				}()
			}
		}()
		c := engineClient(t, "http://"+ln.Addr().String())
		_, err = c.do(ctx, http.MethodPost, "/inference/v1/generate", []byte(`{}`), nil)
		require.NoError(t, err)
		_, err = c.do(ctx, http.MethodPost, "/inference/v1/generate", []byte(`{}`), nil)
		require.Error(t, err)
		assert.True(t, strings.Contains(err.Error(), "/inference/v1/generate"), "%v", err)
		assert.Equal(t, int64(2), requests.Load(), "not retried")
		_, err = c.do(ctx, http.MethodPost, "/inference/v1/generate", []byte(`{}`), nil)
		require.NoError(t, err, "the next request dials anew")
		assert.Equal(t, int64(3), requests.Load())
	})

	t.Run("redirect not followed", func(t *testing.T) {
		var generates, elsewhere atomic.Int64
		srv, _ := countingServer(t, func(w http.ResponseWriter, r *http.Request) {
			_, _ = io.ReadAll(r.Body)
			if r.URL.Path == "/inference/v1/generate" {
				generates.Add(1)
				http.Redirect(w, r, "/elsewhere", http.StatusTemporaryRedirect)
				return
			}
			elsewhere.Add(1)
			fmt.Fprint(w, `{}`)
		})
		c := newClient(t, srv.URL, Options{Mode: ModeGenerate, ContextLength: 10})
		_, err := c.Generate(ctx, GenerateRequest{PromptIDs: []int32{1}, Sampling: SamplingParams{MaxTokens: 1}})
		var he *HTTPError
		require.ErrorAs(t, err, &he)
		assert.Equal(t, http.StatusTemporaryRedirect, he.Status)
		assert.Equal(t, int64(1), generates.Load())
		assert.Equal(t, int64(0), elsewhere.Load(), "the generate body was not sent again")
	})
}
