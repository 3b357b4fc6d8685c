package h1server_test

import (
	"bufio"
	"bytes"
	"context"
	"fmt"
	"io"
	"log"
	"net"
	"net/http"
	"net/http/httptest"
	"path/filepath"
	"sort"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/kilnrl/kiln/internal/agent/h1server"
)

// serve starts s on a loopback listener and returns its address; the
// server is closed when the test ends.
func serve(t *testing.T, s *h1server.Server) string {
	t.Helper()
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	require.NoError(t, err)
	serveOn(t, s, ln)
	return ln.Addr().String()
}

// serveOn serves s on ln until the test ends, then closes it and checks
// that Serve said so.
func serveOn(t *testing.T, s *h1server.Server, ln net.Listener) {
	served := make(chan error, 1)
	go func() { served <- s.Serve(ln) }()
	t.Cleanup(func() {
		s.Close()
		assert.ErrorIs(t, <-served, http.ErrServerClosed)
	})
}

// lockedLog collects what a server logs.
type lockedLog struct {
	mu  sync.Mutex
	buf bytes.Buffer
}

func (l *lockedLog) Write(p []byte) (int, error) {
	l.mu.Lock()
	defer l.mu.Unlock()
	return l.buf.Write(p)
}

func (l *lockedLog) String() string {
	l.mu.Lock()
	defer l.mu.Unlock()
	return l.buf.String()
}

// echo answers with what it read of the request.
func echo(w http.ResponseWriter, r *http.Request) {
	b, err := io.ReadAll(r.Body)
	if err != nil {
		http.Error(w, err.Error(), http.StatusBadRequest)
		return
	}
	w.Header().Set("Content-Type", "text/plain")
	w.Header().Set("X-Method", r.Method)
	w.Header().Set("X-Path", r.URL.RequestURI())
	w.Header().Set("X-Auth", r.Header.Get("Authorization"))
	w.Header().Set("X-Host", r.Host)
	_, _ = w.Write(b)
}

// exchange writes raw to a new connection and returns everything the
// server sent until it closed the connection or went quiet for 300 ms.
func exchange(t *testing.T, addr, raw string) string {
	t.Helper()
	nc, err := net.Dial("tcp", addr)
	require.NoError(t, err)
	defer nc.Close()
	_, err = io.WriteString(nc, raw)
	require.NoError(t, err)
	var out bytes.Buffer
	buf := make([]byte, 64<<10)
	for {
		nc.SetReadDeadline(time.Now().Add(300 * time.Millisecond))
		n, err := nc.Read(buf)
		out.Write(buf[:n])
		if err != nil {
			return out.String()
		}
	}
}

// The server and net/http's answer the same requests alike: what the
// handler sees and what the client gets.
func TestLikeNetHTTP(t *testing.T) {
	mux := http.NewServeMux()
	mux.HandleFunc("/", echo)
	mux.HandleFunc("/noread", func(w http.ResponseWriter, r *http.Request) { fmt.Fprint(w, "ok") })
	mux.HandleFunc("/sniff", func(w http.ResponseWriter, r *http.Request) { fmt.Fprint(w, "<html><body>x</body></html>") })
	mux.HandleFunc("/nosniff", func(w http.ResponseWriter, r *http.Request) {
		w.Header()["Content-Type"] = nil // no type, and none sniffed
		fmt.Fprint(w, "<html><body>x</body></html>")
	})
	mux.HandleFunc("/nocontent", func(w http.ResponseWriter, r *http.Request) { w.WriteHeader(http.StatusNoContent) })
	mux.HandleFunc("/late", func(w http.ResponseWriter, r *http.Request) {
		w.Header().Set("X-Early", "1")
		w.WriteHeader(http.StatusCreated)
		w.Header().Set("X-Late", "1") // after WriteHeader: not sent
		fmt.Fprint(w, "made")
	})
	mux.HandleFunc("/badfields", func(w http.ResponseWriter, r *http.Request) {
		w.Header().Set("X-Split", "a\r\nInjected: 1")
		w.Header()["Bad Name"] = []string{"v"}
		fmt.Fprint(w, "body")
	})
	mux.HandleFunc("/close", func(w http.ResponseWriter, r *http.Request) {
		w.Header().Set("Connection", "close")
		fmt.Fprint(w, "bye")
	})
	mux.HandleFunc("/headlength", func(w http.ResponseWriter, r *http.Request) {
		w.Header().Set("Content-Length", "10")
		if r.Method != http.MethodHead {
			fmt.Fprint(w, "0123456789")
		}
	})
	// Flushed responses: the head at the first Flush, then pieces.
	stream := func(w http.ResponseWriter, r *http.Request, parts ...string) {
		f := w.(http.Flusher)
		for _, p := range parts {
			if p == "|" {
				f.Flush()
				continue
			}
			fmt.Fprint(w, p)
		}
	}
	mux.HandleFunc("/stream", func(w http.ResponseWriter, r *http.Request) {
		w.Header().Set("Content-Type", "text/event-stream")
		stream(w, r, "event: a\n\n", "|", "event: b\n", "data: {}\n\n", "|", "|", "event: c\n\n")
	})
	mux.HandleFunc("/stream/empty", func(w http.ResponseWriter, r *http.Request) { stream(w, r, "|", "|") })
	mux.HandleFunc("/stream/sniffed", func(w http.ResponseWriter, r *http.Request) { stream(w, r, "<html>", "|", "</html>") })
	mux.HandleFunc("/stream/length", func(w http.ResponseWriter, r *http.Request) {
		w.Header().Set("Content-Length", "6")
		stream(w, r, "abc", "|", "def")
	})
	mux.HandleFunc("/stream/close", func(w http.ResponseWriter, r *http.Request) {
		w.Header().Set("Connection", "close")
		stream(w, r, "abc", "|", "def")
	})
	mux.HandleFunc("/stream/status", func(w http.ResponseWriter, r *http.Request) {
		w.WriteHeader(http.StatusAccepted)
		stream(w, r, "|", "late")
	})
	mux.HandleFunc("/stream/nocontent", func(w http.ResponseWriter, r *http.Request) {
		w.WriteHeader(http.StatusNoContent)
		stream(w, r, "|")
	})
	mux.HandleFunc("/stream/echo", func(w http.ResponseWriter, r *http.Request) {
		b, _ := io.ReadAll(r.Body)
		stream(w, r, string(b), "|", "!")
	})
	const maxHeader = 2048
	ours := serve(t, &h1server.Server{Handler: mux, MaxHeaderBytes: maxHeader})
	std := httptest.NewUnstartedServer(mux)
	std.Config.MaxHeaderBytes = maxHeader
	std.Start()
	t.Cleanup(std.Close)
	theirs := strings.TrimPrefix(std.URL, "http://")
	big := strings.Repeat("x", 3*maxHeader+4096)

	cases := []struct{ name, raw string }{
		{"post with length", "POST /v1/messages?beta=true HTTP/1.1\r\nHost: h\r\nAuthorization: Bearer s1\r\nContent-Length: 5\r\n\r\nhello"},
		{"chunked body", "POST /c HTTP/1.1\r\nHost: h\r\nTransfer-Encoding: chunked\r\n\r\n3\r\nabc\r\n2\r\nde\r\n0\r\n\r\n"},
		{"get", "GET /v1/models HTTP/1.1\r\nHost: h\r\n\r\n"},
		{"head", "HEAD /api/hello HTTP/1.1\r\nHost: h\r\n\r\n"},
		{"http/1.0", "GET /x HTTP/1.0\r\n\r\n"},
		{"connection close", "GET /x HTTP/1.1\r\nHost: h\r\nConnection: close\r\n\r\n"},
		{"pipelined", "POST /a HTTP/1.1\r\nHost: h\r\nContent-Length: 1\r\n\r\naGET /b HTTP/1.1\r\nHost: h\r\n\r\n"},
		{"missing host", "GET /x HTTP/1.1\r\n\r\n"},
		{"two hosts", "GET /x HTTP/1.1\r\nHost: a\r\nHost: b\r\n\r\n"},
		{"bad request line", "GARBAGE\r\n\r\n"},
		{"bad length", "POST /x HTTP/1.1\r\nHost: h\r\nContent-Length: x\r\n\r\n"},
		{"length and chunked", "POST /x HTTP/1.1\r\nHost: h\r\nContent-Length: 3\r\nTransfer-Encoding: chunked\r\n\r\n0\r\n\r\n"},
		{"unknown expectation", "POST /x HTTP/1.1\r\nHost: h\r\nExpect: teapot\r\nContent-Length: 1\r\n\r\na"},
		{"absolute target", "GET http://h/abs?q=1 HTTP/1.1\r\nHost: h\r\n\r\n"},
		{"http/1.0 keep-alive", "GET /x HTTP/1.0\r\nConnection: keep-alive\r\n\r\nGET /y HTTP/1.0\r\n\r\n"},
		{"head too large", "GET /x HTTP/1.1\r\nHost: h\r\nX-Big: " + big + "\r\n\r\n"},
		{"expect continue", "POST /x HTTP/1.1\r\nHost: h\r\nExpect: 100-continue\r\nContent-Length: 3\r\n\r\nabc"},
		{"expect continue unread", "POST /noread HTTP/1.1\r\nHost: h\r\nExpect: 100-continue\r\nContent-Length: 3\r\n\r\n"},
		{"body left unread", "POST /noread HTTP/1.1\r\nHost: h\r\nContent-Length: 3\r\n\r\nabcGET /x HTTP/1.1\r\nHost: h\r\n\r\n"},
		{"chunked body left unread", "POST /noread HTTP/1.1\r\nHost: h\r\nTransfer-Encoding: chunked\r\n\r\n3\r\nabc\r\n0\r\n\r\nGET /x HTTP/1.1\r\nHost: h\r\n\r\n"},
		{"sniffed type", "GET /sniff HTTP/1.1\r\nHost: h\r\n\r\n"},
		{"no content", "GET /nocontent HTTP/1.1\r\nHost: h\r\n\r\n"},
		{"sniffing suppressed", "GET /nosniff HTTP/1.1\r\nHost: h\r\n\r\n"},
		{"fields set late", "GET /late HTTP/1.1\r\nHost: h\r\n\r\n"},
		{"bad fields", "GET /badfields HTTP/1.1\r\nHost: h\r\n\r\n"},
		{"handler closes", "GET /close HTTP/1.1\r\nHost: h\r\n\r\nGET /x HTTP/1.1\r\nHost: h\r\n\r\n"},
		{"head with length", "HEAD /headlength HTTP/1.1\r\nHost: h\r\n\r\n"},
		{"not found", "GET /x/../../etc HTTP/1.1\r\nHost: h\r\n\r\n"},
		{"flushed", "GET /stream HTTP/1.1\r\nHost: h\r\n\r\nGET /x HTTP/1.1\r\nHost: h\r\n\r\n"},
		{"flushed http/1.0", "GET /stream HTTP/1.0\r\n\r\n"},
		{"flushed http/1.0 keep-alive", "GET /stream HTTP/1.0\r\nConnection: keep-alive\r\n\r\nGET /x HTTP/1.0\r\n\r\n"},
		{"flushed head", "HEAD /stream HTTP/1.1\r\nHost: h\r\n\r\nGET /x HTTP/1.1\r\nHost: h\r\n\r\n"},
		{"flushed nothing", "GET /stream/empty HTTP/1.1\r\nHost: h\r\n\r\nGET /x HTTP/1.1\r\nHost: h\r\n\r\n"},
		{"flushed sniffed", "GET /stream/sniffed HTTP/1.1\r\nHost: h\r\n\r\n"},
		{"flushed with length", "GET /stream/length HTTP/1.1\r\nHost: h\r\n\r\nGET /x HTTP/1.1\r\nHost: h\r\n\r\n"},
		{"flushed with length http/1.0", "GET /stream/length HTTP/1.0\r\nConnection: keep-alive\r\n\r\nGET /x HTTP/1.0\r\n\r\n"},
		{"flushed handler closes", "GET /stream/close HTTP/1.1\r\nHost: h\r\n\r\nGET /x HTTP/1.1\r\nHost: h\r\n\r\n"},
		{"flushed status", "GET /stream/status HTTP/1.1\r\nHost: h\r\n\r\n"},
		{"flushed no content", "GET /stream/nocontent HTTP/1.1\r\nHost: h\r\n\r\n"},
		{"flushed after reading", "POST /stream/echo HTTP/1.1\r\nHost: h\r\nContent-Length: 3\r\n\r\nabcGET /x HTTP/1.1\r\nHost: h\r\n\r\n"},
		{"flushed connection close", "GET /stream HTTP/1.1\r\nHost: h\r\nConnection: close\r\n\r\n"},
		{"unsupported encoding", "POST /x HTTP/1.1\r\nHost: h\r\nTransfer-Encoding: gzip\r\n\r\n"},
	}
	for _, c := range cases {
		t.Run(c.name, func(t *testing.T) {
			t.Parallel()
			head := strings.HasPrefix(c.raw, "HEAD")
			assert.Equal(t, normalize(exchange(t, theirs, c.raw), head), normalize(exchange(t, ours, c.raw), head))
		})
	}
}

// normalize drops what may differ between two correct servers: the Date
// value and the order of header fields within each response.
func normalize(resp string, head bool) string {
	var b strings.Builder
	for resp != "" {
		h, rest, ok := strings.Cut(resp, "\r\n\r\n")
		if !ok {
			b.WriteString("trailing:" + resp)
			break
		}
		lines := strings.Split(h, "\r\n")
		var fields []string
		n := -1
		for _, f := range lines[1:] {
			name, val, _ := strings.Cut(f, ":")
			switch strings.ToLower(name) {
			case "date":
				continue
			case "content-length":
				n, _ = strconv.Atoi(strings.TrimSpace(val))
			case "transfer-encoding":
				n = chunkedLen(rest)
			}
			fields = append(fields, f)
		}
		sort.Strings(fields)
		b.WriteString(lines[0] + "\n" + strings.Join(fields, "\n") + "\n")
		switch {
		case head || strings.HasPrefix(lines[0], "HTTP/1.1 1"):
			n = 0
		case n < 0 || n > len(rest):
			n = len(rest)
		}
		b.WriteString("body:" + rest[:n] + "\n")
		resp = rest[n:]
	}
	return b.String()
}

// chunkedLen is the length of the chunked body at the start of b (its
// framing included), or -1 when b does not hold a whole one.
func chunkedLen(b string) int {
	n := 0
	for {
		line, _, ok := strings.Cut(b[n:], "\r\n")
		size, err := strconv.ParseInt(line, 16, 32)
		if !ok || err != nil {
			return -1
		}
		n += len(line) + 2 + int(size) + 2
		if n > len(b) {
			return -1
		}
		if size == 0 {
			return n
		}
	}
}

// countingListener counts the connections it accepts.
type countingListener struct {
	net.Listener
	n atomic.Int64
}

func (l *countingListener) Accept() (net.Conn, error) {
	c, err := l.Listener.Accept()
	if err == nil {
		l.n.Add(1)
	}
	return c, err
}

func serveCounting(t *testing.T, s *h1server.Server) (string, *countingListener) {
	t.Helper()
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	require.NoError(t, err)
	cl := &countingListener{Listener: ln}
	serveOn(t, s, cl)
	return "http://" + ln.Addr().String(), cl
}

// Bodies of every size both ways over kept-alive connections, with
// net/http's client.
func TestBodiesAndKeepAlive(t *testing.T) {
	url, ln := serveCounting(t, &h1server.Server{Handler: http.HandlerFunc(echo)})
	client := &http.Client{Transport: &http.Transport{MaxIdleConnsPerHost: 1}}
	defer client.CloseIdleConnections()
	for _, n := range []int{0, 1, 4095, 64 << 10, 9 << 20} {
		body := bytes.Repeat([]byte("0123456789abcdef"), n/16+1)[:n]
		resp, err := client.Post(url+"/b", "application/octet-stream", bytes.NewReader(body))
		require.NoError(t, err)
		got, err := io.ReadAll(resp.Body)
		resp.Body.Close()
		require.NoError(t, err)
		assert.Equal(t, http.StatusOK, resp.StatusCode)
		assert.Equal(t, int64(n), resp.ContentLength)
		assert.True(t, bytes.Equal(body, got), "a %d-byte body came back as %d bytes", n, len(got))
	}
	assert.EqualValues(t, 1, ln.n.Load(), "every request should have used the one kept-alive connection")
}

// A client that hangs up mid-request ends the request's context; one
// that waits does not.
func TestHangUp(t *testing.T) {
	ended := make(chan error, 1)
	entered := make(chan struct{}, 1)
	h := http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		entered <- struct{}{}
		select {
		case <-r.Context().Done():
			ended <- r.Context().Err()
		case <-time.After(300 * time.Millisecond):
			ended <- nil
			fmt.Fprint(w, "done")
		}
	})
	addr := serve(t, &h1server.Server{Handler: h})

	t.Run("client waits", func(t *testing.T) {
		resp, err := http.Get("http://" + addr + "/")
		require.NoError(t, err)
		b, _ := io.ReadAll(resp.Body)
		resp.Body.Close()
		assert.Equal(t, "done", string(b))
		assert.NoError(t, <-ended)
	})
	t.Run("client hangs up", func(t *testing.T) { hangUpEnds(t, "tcp", addr, "/", entered, ended) })
}

// A panicking handler closes its connection and is logged, as net/http
// does (http.ErrAbortHandler silently); the server goes on serving.
func TestPanic(t *testing.T) {
	var logged lockedLog
	mux := http.NewServeMux()
	mux.HandleFunc("/boom", func(http.ResponseWriter, *http.Request) { panic("boom") })
	mux.HandleFunc("/abort", func(http.ResponseWriter, *http.Request) { panic(http.ErrAbortHandler) })
	mux.HandleFunc("/", echo)
	addr := serve(t, &h1server.Server{Handler: mux, ErrorLog: log.New(&logged, "", 0)})
	assert.Empty(t, exchange(t, addr, "GET /abort HTTP/1.1\r\nHost: h\r\n\r\n"))
	assert.Empty(t, logged.String())
	assert.Empty(t, exchange(t, addr, "GET /boom HTTP/1.1\r\nHost: h\r\n\r\n"))
	assert.Contains(t, logged.String(), "panic serving")
	assert.Contains(t, logged.String(), "boom")
	assert.True(t, strings.HasPrefix(exchange(t, addr, "GET /x HTTP/1.1\r\nHost: h\r\n\r\n"), "HTTP/1.1 200 OK"))
}

// Shutdown closes idle connections at once, lets an active request finish,
// then returns; with a request that does not finish, it returns when its
// context ends.
func TestShutdown(t *testing.T) {
	release := make(chan struct{})
	entered := make(chan struct{}, 1)
	h := http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		if r.URL.Path == "/slow" {
			entered <- struct{}{}
			<-release
		}
		fmt.Fprint(w, "ok")
	})
	s := &h1server.Server{Handler: h}
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	require.NoError(t, err)
	served := make(chan error, 1)
	go func() { served <- s.Serve(ln) }()
	addr := ln.Addr().String()

	idle, err := net.Dial("tcp", addr)
	require.NoError(t, err)
	defer idle.Close()
	_, err = io.WriteString(idle, "GET /x HTTP/1.1\r\nHost: h\r\n\r\n")
	require.NoError(t, err)
	br := bufio.NewReader(idle)
	resp, err := http.ReadResponse(br, nil)
	require.NoError(t, err)
	io.Copy(io.Discard, resp.Body)

	slow := make(chan string, 1)
	go func() {
		resp, err := http.Get("http://" + addr + "/slow")
		if err != nil {
			slow <- err.Error()
			return
		}
		b, _ := io.ReadAll(resp.Body)
		resp.Body.Close()
		slow <- string(b)
	}()
	<-entered

	short, cancel := context.WithTimeout(context.Background(), 100*time.Millisecond)
	defer cancel()
	assert.ErrorIs(t, s.Shutdown(short), context.DeadlineExceeded, "a request was still running")
	idle.SetReadDeadline(time.Now().Add(2 * time.Second))
	_, err = br.ReadByte()
	assert.ErrorIs(t, err, io.EOF, "the idle connection should have been closed")
	assert.ErrorIs(t, <-served, http.ErrServerClosed)
	_, err = net.Dial("tcp", addr)
	assert.Error(t, err, "the listener should be closed")

	done := make(chan error, 1)
	go func() { done <- s.Shutdown(context.Background()) }()
	close(release)
	assert.Equal(t, "ok", <-slow)
	assert.NoError(t, <-done)
}

// ReadHeaderTimeout bounds a request head once it has begun, not an idle
// connection's wait for one.
func TestReadHeaderTimeout(t *testing.T) {
	addr := serve(t, &h1server.Server{Handler: http.HandlerFunc(echo), ReadHeaderTimeout: 200 * time.Millisecond})

	stalled, err := net.Dial("tcp", addr)
	require.NoError(t, err)
	defer stalled.Close()
	_, err = io.WriteString(stalled, "GET / HTTP/1.1\r\nHo")
	require.NoError(t, err)
	stalled.SetReadDeadline(time.Now().Add(2 * time.Second))
	_, err = io.ReadAll(stalled) // net/http answers 400 here too: the head is cut mid-line
	assert.NoError(t, err, "a stalled head should close the connection")

	idle, err := net.Dial("tcp", addr)
	require.NoError(t, err)
	defer idle.Close()
	time.Sleep(400 * time.Millisecond)
	_, err = io.WriteString(idle, "GET / HTTP/1.1\r\nHost: h\r\n\r\n")
	require.NoError(t, err)
	resp, err := http.ReadResponse(bufio.NewReader(idle), nil)
	require.NoError(t, err, "an idle connection should wait for its request")
	assert.Equal(t, http.StatusOK, resp.StatusCode)
}

// A Unix socket listener is served as a TCP one, hang-ups included (the
// sandbox's way out to the adapter is a Unix socket).
func TestUnixSocket(t *testing.T) {
	ended := make(chan error, 1)
	entered := make(chan struct{}, 1)
	h := http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		if r.URL.Path == "/wait" {
			entered <- struct{}{}
			<-r.Context().Done()
			ended <- r.Context().Err()
			return
		}
		echo(w, r)
	})
	path := filepath.Join(t.TempDir(), "adapter.sock")
	ln, err := net.Listen("unix", path)
	require.NoError(t, err)
	serveOn(t, &h1server.Server{Handler: h}, ln)

	client := &http.Client{Transport: &http.Transport{DialContext: func(ctx context.Context, _, _ string) (net.Conn, error) {
		return (&net.Dialer{}).DialContext(ctx, "unix", path)
	}}}
	defer client.CloseIdleConnections()
	resp, err := client.Post("http://adapter/x", "text/plain", strings.NewReader("over a unix socket"))
	require.NoError(t, err)
	b, _ := io.ReadAll(resp.Body)
	resp.Body.Close()
	assert.Equal(t, "over a unix socket", string(b))

	hangUpEnds(t, "unix", path, "/wait", entered, ended)
}

// hangUpEnds sends a request for path on a new connection, hangs up once
// the handler has it, and checks that the handler's context ends.
func hangUpEnds(t *testing.T, network, addr, path string, entered <-chan struct{}, ended <-chan error) {
	t.Helper()
	nc, err := net.Dial(network, addr)
	require.NoError(t, err)
	_, err = io.WriteString(nc, "GET "+path+" HTTP/1.1\r\nHost: h\r\n\r\n")
	require.NoError(t, err)
	<-entered
	nc.Close()
	select {
	case err := <-ended:
		assert.ErrorIs(t, err, context.Canceled)
	case <-time.After(2 * time.Second):
		t.Fatal("the handler's context did not end when the client hung up")
	}
}

// A Flush sends at once: the client reads each flushed piece while the
// handler is still running, and the response then ends and the
// connection serves the next request.
func TestFlushSends(t *testing.T) {
	next := make(chan struct{})
	url, ln := serveCounting(t, &h1server.Server{Handler: http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		if r.URL.Path != "/stream" {
			fmt.Fprint(w, "plain")
			return
		}
		w.Header().Set("Content-Type", "text/event-stream")
		for i := range 3 {
			fmt.Fprintf(w, "event: %d\n\n", i)
			w.(http.Flusher).Flush()
			<-next // the client has read event i
		}
		fmt.Fprint(w, "event: end\n\n")
	})})
	client := &http.Client{Transport: &http.Transport{MaxIdleConnsPerHost: 1}}
	defer client.CloseIdleConnections()
	resp, err := client.Get(url + "/stream")
	require.NoError(t, err)
	assert.Equal(t, []string{"chunked"}, resp.TransferEncoding)
	rd := bufio.NewReader(resp.Body)
	for i := range 3 {
		line, err := rd.ReadString('\n')
		require.NoError(t, err)
		assert.Equal(t, fmt.Sprintf("event: %d\n", i), line)
		_, err = rd.ReadString('\n')
		require.NoError(t, err)
		next <- struct{}{}
	}
	rest, err := io.ReadAll(rd)
	require.NoError(t, err)
	resp.Body.Close()
	assert.Equal(t, "event: end\n\n", string(rest))

	resp, err = client.Get(url + "/after")
	require.NoError(t, err)
	b, err := io.ReadAll(resp.Body)
	resp.Body.Close()
	require.NoError(t, err)
	assert.Equal(t, "plain", string(b))
	assert.EqualValues(t, 1, ln.n.Load(), "both requests on one connection")
}
