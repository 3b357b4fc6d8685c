package engine

import (
	"bufio"
	"context"
	"fmt"
	"io"
	"net"
	"net/http"
	"net/http/httptest"
	"runtime/debug"
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

func h1Client(t *testing.T, base string) *Client {
	t.Helper()
	c, err := New(Options{BaseURL: base})
	require.NoError(t, err)
	require.NotNil(t, c.h1, "an http:// engine without Options.HTTPClient uses the h1 transport")
	return c
}

// The transport's contract, case by case: what is sent, what is read and
// when a connection is kept.
func TestH1Transport(t *testing.T) {
	ctx := context.Background()

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
			c.release(r)
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
		c := h1Client(t, srv.URL)
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
		c := h1Client(t, srv.URL)
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
		idle := len(c.h1.idle)
		require.GreaterOrEqual(t, idle, 2, "concurrent requests left idle connections")
		before := conns.Load()
		srv.CloseClientConnections()
		time.Sleep(20 * time.Millisecond)
		_, err := c.do(ctx, http.MethodPost, "/tokenize", []byte(`{}`), nil)
		require.NoError(t, err)
		assert.Equal(t, before+1, conns.Load(), "one new connection")
		assert.Equal(t, 1, len(c.h1.idle), "the closed connections were dropped")
	})

	t.Run("connection close", func(t *testing.T) {
		srv, conns := countingServer(t, func(w http.ResponseWriter, r *http.Request) {
			w.Header().Set("Connection", "close")
			fmt.Fprint(w, `{}`)
		})
		c := h1Client(t, srv.URL)
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
		c := h1Client(t, srv.URL)
		_, err := c.tokenize(ctx, []byte(`{}`), nil)
		var he *HTTPError
		require.ErrorAs(t, err, &he)
		assert.Equal(t, 400, he.Status)
		assert.Equal(t, "bad things", he.Message)
	})

	t.Run("header with a line break", func(t *testing.T) {
		srv, _ := countingServer(t, func(w http.ResponseWriter, r *http.Request) { t.Error("request reached the server") })
		c := h1Client(t, srv.URL)
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
		c := h1Client(t, "http://"+ln.Addr().String())
		_, err = c.do(ctx, http.MethodPost, "/inference/v1/generate", []byte(`{}`), nil)
		require.NoError(t, err)
		_, err = c.do(ctx, http.MethodPost, "/inference/v1/generate", []byte(`{}`), nil)
		require.Error(t, err)
		assert.True(t, strings.Contains(err.Error(), "/inference/v1/generate"), "%v", err)
		assert.Equal(t, int64(2), requests.Load(), "not retried")
		_, err = c.do(ctx, http.MethodPost, "/inference/v1/generate", []byte(`{}`), nil)
		require.NoError(t, err, "the next request dials anew")
	})
}

// TestBufPool: every buffer holds what it was asked for, whatever came back
// to the pool before, and one of the right size is found again.
func TestBufPool(t *testing.T) {
	var bp bufPool
	for _, n := range []int{0, 1, 4095, 4096, 4097, 30000, 1 << 20, 4 << 20, 5 << 20} {
		b := bp.get(n)
		if len(b) != 0 || cap(b) < n {
			t.Fatalf("get(%d): len %d cap %d", n, len(b), cap(b))
		}
		bp.put(append(b, make([]byte, n+n/2)...)) // grown past its class: pooled by what it holds
	}
	for _, n := range []int{100, 9000, 30000, 70000, 1 << 20} {
		b := bp.get(n)
		if cap(b) < n {
			t.Fatalf("get(%d) after puts: cap %d", n, cap(b))
		}
		if c := cap(b); c > 4*max(n, 4096) {
			t.Errorf("get(%d): a buffer of %d bytes, from a class far above n", n, c)
		}
	}

	// Once warm, drawing and returning a buffer allocates nothing (the
	// collector, which empties pools, held off meanwhile).
	defer debug.SetGCPercent(debug.SetGCPercent(-1))
	bp.put(bp.get(5000))
	if allocs := testing.AllocsPerRun(100, func() { bp.put(bp.get(5000)) }); allocs != 0 {
		t.Errorf("a get and put allocated %v times", allocs)
	}
}
