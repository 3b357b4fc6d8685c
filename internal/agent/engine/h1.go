package engine

import (
	"bufio"
	"context"
	"fmt"
	"math/bits"
	"net"
	"strconv"
	"strings"
	"sync"
	"time"

	"github.com/kilnrl/kiln/internal/agent/rawsock"
)

// h1Pool is the engine client's own HTTP/1.1 transport for plain-http
// engines: persistent connections, each request written with one writev and
// its reply read on the calling goroutine, both as raw system calls (package
// rawsock: they do not wake the runtime's monitor thread) where the system
// has them.
//
// Why not net/http.Transport: every request there hands off between three
// goroutines (caller, the connection's write loop and its read loop), and
// on the adapter's hot path — four engine exchanges per turn — those
// wake-ups and the futex traffic behind them were about a fifth of the
// adapter's CPU. The engine is one server the adapter owns the connections
// to, so a transport without proxies, HTTP/2 or redirects is enough.
//
// Contract: a request is sent on an idle connection when one is known to be
// open, else on a new one; the connection goes back to the pool only when
// its reply was read whole and the server did not ask to close. A request
// whose context ends closes its connection (that is how vLLM learns to abort
// the generation). A request on a reused connection that the server had
// is never sent again: a server that drops a connection may have acted on the
// request (a generation), so the failure goes to the caller. Idle
// connections are checked for a close by the server (keep-alive timeout)
// before reuse, which leaves that race a window of microseconds.
type h1Pool struct {
	addr    string // host:port
	host    string // Host header
	maxIdle int
	dialer  net.Dialer
	bufs    *bufPool // reply bodies

	mu   sync.Mutex
	idle []*h1Conn // most recently used last
}

type h1Conn struct {
	nc       net.Conn
	sock     *rawsock.Conn // nc's reads, writes and peeks (raw where the system allows)
	br       *bufio.Reader
	hdr      []byte // request head scratch, reused
	idleFrom time.Time
}

// h1IdleTimeout drops connections idle longer than this; servers close
// theirs after a few seconds anyway (uvicorn's default keep-alive is 5 s).
const h1IdleTimeout = 90 * time.Second

func newH1Pool(host string, maxIdle int, bufs *bufPool) *h1Pool {
	addr := host
	if _, _, err := net.SplitHostPort(host); err != nil {
		addr = net.JoinHostPort(host, "80")
	}
	return &h1Pool{addr: addr, host: host, maxIdle: maxIdle, bufs: bufs, dialer: net.Dialer{KeepAlive: 30 * time.Second}}
}

// get returns an open idle connection or dials a new one.
func (p *h1Pool) get(ctx context.Context) (c *h1Conn, err error) {
	now := time.Now()
	for {
		p.mu.Lock()
		n := len(p.idle)
		if n == 0 {
			p.mu.Unlock()
			break
		}
		c = p.idle[n-1]
		p.idle[n-1] = nil
		p.idle = p.idle[:n-1]
		p.mu.Unlock()
		if now.Sub(c.idleFrom) < h1IdleTimeout && c.br.Buffered() == 0 && c.sock.PeerOpen() {
			return c, nil
		}
		c.nc.Close()
	}
	nc, err := p.dialer.DialContext(ctx, "tcp", p.addr)
	if err != nil {
		return nil, err
	}
	c = &h1Conn{nc: nc, sock: rawsock.New(nc)}
	c.br = bufio.NewReaderSize(c.sock, 32<<10)
	return c, nil
}

func (p *h1Pool) put(c *h1Conn) {
	c.idleFrom = time.Now()
	p.mu.Lock()
	if len(p.idle) < p.maxIdle {
		p.idle = append(p.idle, c)
		c = nil
	}
	p.mu.Unlock()
	if c != nil {
		c.nc.Close()
	}
}

// closeIdle closes every idle connection.
func (p *h1Pool) closeIdle() {
	p.mu.Lock()
	idle := p.idle
	p.idle = nil
	p.mu.Unlock()
	for _, c := range idle {
		c.nc.Close()
	}
}

// h1Request is one request's parts.
type h1Request struct {
	method, path string
	body         []byte // nil for GET
	headers      [][2]string
}

// roundTrip sends r and returns the reply's status and whole body.
func (p *h1Pool) roundTrip(ctx context.Context, r *h1Request) (int, []byte, error) {
	if err := ctx.Err(); err != nil {
		return 0, nil, err // sent now, the request would only be aborted
	}
	c, err := p.get(ctx)
	if err != nil {
		return 0, nil, err
	}
	return p.exchange(ctx, c, r)
}

// exchange runs one request on c and either returns c to the pool or closes
// it.
func (p *h1Pool) exchange(ctx context.Context, c *h1Conn, r *h1Request) (status int, body []byte, err error) {
	// Closing the connection is what unblocks the I/O below and tells the
	// engine to stop; the connection is then never reused. A Watch on ctx
	// does it for a run of calls; else the call registers on ctx itself.
	w := watchOf(ctx)
	var stop func() bool
	if !w.enter(c) {
		w, stop = nil, context.AfterFunc(ctx, func() { c.nc.Close() })
	}
	keep := false
	defer func() {
		var live bool
		if w != nil {
			live = w.leave()
		} else {
			live = stop()
		}
		if live && keep {
			p.put(c)
			return
		}
		c.nc.Close()
		if ctx.Err() != nil {
			err = ctx.Err()
		}
	}()

	for _, h := range r.headers {
		if strings.ContainsAny(h[0], "\r\n: ") || strings.ContainsAny(h[1], "\r\n") {
			return 0, nil, fmt.Errorf("header %q: %q is not a valid header line", h[0], h[1])
		}
	}
	c.hdr = appendRequestHead(c.hdr[:0], p.host, r)
	bufs := net.Buffers{c.hdr}
	if len(r.body) > 0 {
		bufs = append(bufs, r.body)
	}
	if err := c.sock.WriteBuffers(bufs); err != nil {
		return 0, nil, err
	}
	status, body, keep, err = readReply(c.br, p.bufs)
	return status, body, err
}

// appendRequestHead writes the request line and headers (checked by the
// caller for line breaks).
func appendRequestHead(b []byte, host string, r *h1Request) []byte {
	b = append(b, r.method...)
	b = append(b, ' ')
	b = append(b, r.path...)
	b = append(b, " HTTP/1.1\r\nHost: "...)
	b = append(b, host...)
	b = append(b, "\r\nUser-Agent: kiln\r\nAccept: application/json\r\n"...)
	if r.body != nil {
		b = append(b, "Content-Type: application/json\r\nContent-Length: "...)
		b = strconv.AppendInt(b, int64(len(r.body)), 10)
		b = append(b, "\r\n"...)
	}
	for _, h := range r.headers {
		b = append(b, h[0]...)
		b = append(b, ": "...)
		b = append(b, h[1]...)
		b = append(b, "\r\n"...)
	}
	return append(b, "\r\n"...)
}

// bufPool recycles request and reply bodies: a turn builds two /tokenize
// bodies and a generate body of the whole prompt and reads replies as large,
// and none of them outlives its call (parsed values are copies). Buffers
// are kept by size class, powers of two, so that a body finds one of its
// size: with one pool, a small buffer drawn for a large body was dropped.
//
// A pool holds *[]byte; the holders themselves are recycled (holders), so
// that returning a buffer does not allocate one.
type bufPool struct {
	classes [bufClasses]sync.Pool
	holders sync.Pool // empty *[]byte
}

// Pooled sizes: 4 KiB to 4 MiB; larger bodies (rare routed-experts
// replies) are not pooled.
const (
	minPooledShift = 12
	maxPooledShift = 22
	bufClasses     = maxPooledShift - minPooledShift + 1
)

// get returns an empty buffer with at least n bytes of capacity.
func (bp *bufPool) get(n int) []byte {
	c := 0
	if n > 1<<minPooledShift {
		c = bits.Len(uint(n-1)) - minPooledShift // the smallest class holding n
	}
	if c >= bufClasses {
		return make([]byte, 0, n)
	}
	if h, ok := bp.classes[c].Get().(*[]byte); ok {
		b := (*h)[:0]
		*h = nil
		bp.holders.Put(h)
		return b
	}
	return make([]byte, 0, 1<<(c+minPooledShift))
}

// put returns b for reuse; the caller must not touch b afterwards.
func (bp *bufPool) put(b []byte) {
	if cap(b) < 1<<minPooledShift || cap(b) >= 1<<(maxPooledShift+1) {
		return
	}
	c := bits.Len(uint(cap(b))) - 1 - minPooledShift // the largest class cap(b) holds
	h, ok := bp.holders.Get().(*[]byte)
	if !ok {
		h = new([]byte)
	}
	*h = b[:0]
	bp.classes[c].Put(h)
}
