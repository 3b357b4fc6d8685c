package h1server

import (
	"bufio"
	"context"
	"errors"
	"fmt"
	"io"
	"net"
	"net/http"
	"runtime"
	"strings"
	"sync/atomic"
	"time"

	"github.com/kilnrl/kiln/internal/agent/rawsock"
)

// A connection's states: waiting for a request (Shutdown may close it),
// serving one, closed.
const (
	stateIdle int32 = iota
	stateActive
	stateClosed
)

// conn is one client connection. Its context is the context of each of its
// requests: it ends when the client hangs up (the watcher) or the
// connection closes. HTTP/1.1 serves one request at a time, so a hang-up
// during a request is that request's client going away, as net/http's
// request context has it.
type conn struct {
	s      *Server
	nc     net.Conn
	sock   *rawsock.Conn
	lim    limitReader
	br     *bufio.Reader
	ctx    context.Context
	cancel context.CancelFunc
	id     uint64 // the watcher's
	remote string // RemoteAddr of its requests
	state  atomic.Int32
	head   []byte // response head, reused
	out    []byte // response body, reused
	date   dateCache
}

func (s *Server) newConn(nc net.Conn) (*conn, error) {
	c := &conn{s: s, nc: nc, sock: rawsock.New(nc), remote: nc.RemoteAddr().String()}
	c.lim.r = c.sock
	c.lim.n = noLimit
	c.br = bufio.NewReaderSize(&c.lim, 32<<10)
	c.ctx, c.cancel = context.WithCancel(context.Background())
	s.mu.Lock()
	defer s.mu.Unlock()
	if s.closing.Load() {
		c.cancel()
		return nil, http.ErrServerClosed
	}
	id, err := s.hangups.add(nc, c.cancel)
	if err != nil {
		c.cancel()
		return nil, fmt.Errorf("watching %v for hang-ups: %w", nc.RemoteAddr(), err)
	}
	c.id = id
	s.conns[c] = struct{}{}
	return c, nil
}

func (c *conn) close() {
	c.state.Store(stateClosed)
	c.s.hangups.remove(c.id, c.nc)
	c.nc.Close()
	c.cancel()
	c.s.mu.Lock()
	delete(c.s.conns, c)
	c.s.mu.Unlock()
}

// noLimit is limitReader's "unlimited".
const noLimit = 1<<63 - 1

// limitReader reads at most n more bytes of r: the bound on a request
// head (the body is read with n reset to noLimit).
type limitReader struct {
	r   io.Reader
	n   int64
	hit bool
}

func (l *limitReader) Read(p []byte) (int, error) {
	if l.n <= 0 {
		l.hit = true
		return 0, io.EOF
	}
	if int64(len(p)) > l.n {
		p = p[:l.n]
	}
	n, err := l.r.Read(p)
	l.n -= int64(n)
	return n, err
}

func (c *conn) serve() {
	defer c.close()
	for {
		// An idle connection waits for its next request without a time
		// limit (Shutdown closes it meanwhile); the head's bytes are bounded
		// from here.
		c.lim.n, c.lim.hit = c.headLimit()-int64(c.br.Buffered()), false
		if _, err := c.br.Peek(1); err != nil {
			return
		}
		if !c.state.CompareAndSwap(stateIdle, stateActive) {
			return
		}
		req, status, err := c.readRequest()
		if err != nil {
			c.reject(status, err)
			return
		}
		if !c.handle(req) || c.s.closing.Load() {
			return
		}
		if !c.state.CompareAndSwap(stateActive, stateIdle) {
			return
		}
	}
}

// readRequest reads one request head with net/http's parser, and checks
// what net/http's server checks beyond it. On an error, status is the
// answer (0: none, the connection just closes).
func (c *conn) readRequest() (*http.Request, int, error) {
	if t := c.s.ReadHeaderTimeout; t > 0 {
		c.nc.SetReadDeadline(time.Now().Add(t))
		defer c.nc.SetReadDeadline(time.Time{})
	}
	req, err := http.ReadRequest(c.br)
	c.lim.n = noLimit
	switch {
	case err == nil:
	case c.lim.hit:
		return nil, http.StatusRequestHeaderFieldsTooLarge, err
	case strings.HasPrefix(err.Error(), "unsupported transfer encoding"):
		return nil, http.StatusNotImplemented, err
	case errors.Is(err, io.EOF), errors.Is(err, io.ErrUnexpectedEOF), errors.Is(err, net.ErrClosed):
		return nil, 0, err
	default:
		var ne net.Error
		if errors.As(err, &ne) && ne.Timeout() {
			return nil, 0, err
		}
		return nil, http.StatusBadRequest, err
	}
	if req.ProtoAtLeast(1, 1) && len(req.Header["Host"]) == 0 && req.Host == "" {
		return nil, http.StatusBadRequest, statusError("missing required Host header")
	}
	if len(req.Header["Host"]) > 1 {
		return nil, http.StatusBadRequest, errors.New("too many Host headers")
	}
	req.RemoteAddr = c.remote
	return req.WithContext(c.ctx), 0, nil
}

// statusError is a rejection whose reason the client is told (net/http
// tells only some: a missing Host).
type statusError string

func (e statusError) Error() string { return string(e) }

// headLimit is how many bytes a request head may take from the
// connection: MaxHeaderBytes and net/http's slack for the request line.
func (c *conn) headLimit() int64 {
	max := c.s.MaxHeaderBytes
	if max <= 0 {
		max = http.DefaultMaxHeaderBytes
	}
	return int64(max) + 4096
}

// reject answers a request that could not be read, in net/http's words,
// and the connection then closes.
func (c *conn) reject(status int, err error) {
	if status == 0 {
		return
	}
	const fields = "\r\nContent-Type: text/plain; charset=utf-8\r\nConnection: close\r\n\r\n"
	public := fmt.Sprintf("%d %s", status, http.StatusText(status))
	if se, ok := err.(statusError); ok {
		public += ": " + string(se)
	}
	msg := "HTTP/1.1 " + public + fields + public
	if status == http.StatusNotImplemented {
		msg = "HTTP/1.1 " + public + fields + "Unsupported transfer encoding"
	}
	_, _ = c.sock.Write([]byte(msg))
}

// maxKeptBody bounds the response buffer a connection keeps for its next
// request: larger ones (a long SSE replay) are left to the collector
// rather than held by every idle connection.
const maxKeptBody = 64 << 10

// maxDrain is how much of a body its handler left unread is read to keep
// the connection (net/http's figure); more, and the connection closes.
const maxDrain = 256 << 10

// handle runs the handler on req and writes its response, reporting
// whether the connection may serve another request.
func (c *conn) handle(req *http.Request) (keep bool) {
	w := &response{c: c, req: req, header: make(http.Header), body: c.out[:0]}
	switch expect := req.Header.Get("Expect"); {
	case expect == "":
	case strings.EqualFold(expect, "100-continue") && req.ProtoAtLeast(1, 1):
		req.Body = &continueReader{c: c, r: req.Body}
	default:
		w.WriteHeader(http.StatusExpectationFailed)
		w.close = true
		c.write(w)
		return false
	}
	body := req.Body
	if !c.run(w, req) {
		return false
	}
	keep = !req.Close && !w.close
	if cr, ok := body.(*continueReader); ok && !cr.sent {
		keep = false // the client still holds the body back
	}
	if keep {
		// Read what the handler left of the body, so that the next request
		// starts where this one ends.
		n, err := io.CopyN(io.Discard, body, maxDrain+1)
		keep = err == io.EOF && n <= maxDrain
	}
	w.close = !keep
	if err := c.write(w); err != nil {
		return false
	}
	if cap(w.body) <= maxKeptBody {
		c.out = w.body[:0]
	}
	return keep
}

// run calls the handler, turning a panic into a closed connection (logged
// as net/http logs it; http.ErrAbortHandler silently).
func (c *conn) run(w *response, req *http.Request) (ok bool) {
	defer func() {
		if v := recover(); v != nil {
			if v != http.ErrAbortHandler {
				buf := make([]byte, 64<<10)
				buf = buf[:runtime.Stack(buf, false)]
				c.s.logf("h1server: panic serving %v: %v\n%s", c.nc.RemoteAddr(), v, buf)
			}
			ok = false
		}
	}()
	h := c.s.Handler
	if h == nil {
		h = http.DefaultServeMux // as net/http's server
	}
	h.ServeHTTP(w, req)
	return true
}

// continueReader answers "100 Continue" when the handler first reads the
// body the client is holding back.
type continueReader struct {
	c    *conn
	r    io.ReadCloser
	sent bool
	err  error
}

func (r *continueReader) Read(p []byte) (int, error) {
	if !r.sent {
		r.sent = true
		if _, r.err = r.c.sock.Write([]byte("HTTP/1.1 100 Continue\r\n\r\n")); r.err != nil {
			r.c.nc.Close()
		}
	}
	if r.err != nil {
		return 0, r.err
	}
	return r.r.Read(p)
}

func (r *continueReader) Close() error { return r.r.Close() }
