package adapter_test

import (
	"bufio"
	"bytes"
	"encoding/json"
	"fmt"
	"io"
	"net"
	"net/http"
	"os"
	"slices"
	"strconv"
	"sync"
	"sync/atomic"
	"testing"
	"time"
)

// The relay is the load benchmark's baseline: the least any adapter must do
// per turn. It makes the very HTTP exchanges the adapter made, in number,
// endpoint and bytes, and none of the work between them: it reads the
// client's request, sends each engine request (as many bytes as the
// adapter's, over kept-alive HTTP/1.1 connections, each request written
// with one writev: the least a client can do) and reads each reply, then
// answers the client with as many bytes as the adapter did (served by the
// adapter's own server, NewHTTPServer). Its engine
// answers each call after as long as the scripted engine took over the
// adapter's (the process waits on its engine as the adapter did: a process
// that never waits wakes less, and each wake-up costs CPU). No JSON is
// parsed or written, nothing is rendered, hashed or recorded. Its CPU per
// turn is the floor that moving these bytes through five HTTP exchanges
// costs on the machine at hand, measured in the same run as the adapter.

// exchange is one engine call the adapter made, as the engine saw it:
// its bytes and when the engine's handler had it (Hold: for how long).
// Session is the load session it was made for, where the log tells them.
type exchange struct {
	Path       string
	Req, Reply int
	Hold       time.Duration
	Start, End time.Time `json:"-"`
	Session    string    `json:"-"`
}

// exchangeLog records the adapter's engine calls in arrival order.
type exchangeLog struct {
	// tagSessions keeps each request body to find the session it was made
	// for (sessionOf); else bodies are only counted.
	tagSessions bool
	mu          sync.Mutex
	all         []exchange
}

// wrap counts each request's and reply's body bytes on the way to h, and
// times the handler. The request body is counted as h reads it (what h
// leaves unread is read after it), not copied unless l tags sessions.
func (l *exchangeLog) wrap(h http.Handler) http.Handler {
	return http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		start := time.Now()
		body := &countingReader{r: r.Body, keep: l.tagSessions}
		r.Body = body
		cw := &countingWriter{ResponseWriter: w}
		h.ServeHTTP(cw, r)
		// What h left unread is counted too; net/http may have closed the
		// body once h's reply went out, after h read it to its end.
		_, _ = io.Copy(io.Discard, body)
		end := time.Now()
		x := exchange{Path: r.URL.Path, Req: body.n, Reply: cw.n, Hold: end.Sub(start), Start: start, End: end}
		if l.tagSessions {
			x.Session = sessionOf(r.Header, body.kept)
		}
		l.mu.Lock()
		l.all = append(l.all, x)
		l.mu.Unlock()
	})
}

// sessionOf names the load session an engine request was made for: its
// x-session-id (generate calls), else the first session name in its body —
// a render's messages hold their session's name, and a /detokenize call's
// ids are the bytes of a reply that begins with it (namedScript; the
// scripted tokenizer's ids below 256 are bytes). "" when none is found.
func sessionOf(h http.Header, body []byte) string {
	if id := h.Get("x-session-id"); id != "" {
		return id
	}
	text := body
	if i := bytes.IndexByte(body, '['); i >= 0 && !bytes.Contains(body, []byte("load-")) {
		// An id list: its byte ids as text.
		text = nil
		n, digits := 0, false
		for _, c := range body[i+1:] {
			switch {
			case c >= '0' && c <= '9':
				n, digits = 10*n+int(c-'0'), true
			case digits:
				if n < 256 {
					text = append(text, byte(n))
				}
				n, digits = 0, false
			}
		}
	}
	if i := bytes.Index(text, []byte("load-")); i >= 0 && i+9 <= len(text) {
		return string(text[i : i+9])
	}
	return ""
}

// addedLatencyBySession returns, sorted, each turn's latency less the
// engine handler's time on the exchanges its own session made while it was
// in flight: exact under any concurrency, for exchanges tagged by session.
func addedLatencyBySession(sess []*loadSession, xs []exchange) []time.Duration {
	bySession := map[string][]exchange{}
	for _, x := range xs {
		bySession[x.Session] = append(bySession[x.Session], x)
	}
	var added []time.Duration
	for _, s := range sess {
		own := bySession[s.id]
		for _, t := range s.spans {
			d := t.end.Sub(t.start)
			for _, x := range own {
				if !x.Start.Before(t.start) && !x.End.After(t.end) {
					d -= x.Hold
				}
			}
			added = append(added, d)
		}
	}
	slices.Sort(added)
	return added
}

type countingReader struct {
	r    io.ReadCloser
	n    int
	keep bool
	kept []byte
}

func (c *countingReader) Read(p []byte) (int, error) {
	n, err := c.r.Read(p)
	c.n += n
	if c.keep {
		c.kept = append(c.kept, p[:n]...)
	}
	return n, err
}

func (c *countingReader) Close() error { return c.r.Close() }

type countingWriter struct {
	http.ResponseWriter
	n int
}

func (w *countingWriter) Write(p []byte) (int, error) {
	n, err := w.ResponseWriter.Write(p)
	w.n += n
	return n, err
}

// turnsOf cuts the log into one group per turn, each ending at a generate
// call (the last group also takes what follows the last one). Sessions run
// concurrently, so a group is not one turn's calls; the groups together are
// every call, which is what a CPU total needs.
func (l *exchangeLog) turnsOf(turns int) ([][]exchange, error) {
	var groups [][]exchange
	start, last := 0, 0
	for i, x := range l.all {
		if x.Path == "/inference/v1/generate" {
			groups = append(groups, l.all[start:i+1])
			start, last = i+1, start
		}
	}
	if len(groups) != turns {
		return nil, fmt.Errorf("%d generate calls logged for %d turns", len(groups), turns)
	}
	groups[len(groups)-1] = l.all[last:]
	return groups, nil
}

// fillerEngine answers every request with as many bytes as the header
// X-Relay-Reply-Bytes asks for, after reading the request and waiting as
// long as X-Relay-Hold-Ns says: as long as the scripted engine took over
// the adapter's call, so the relay waits on its engine as the adapter did.
func fillerEngine(filler []byte) http.Handler {
	return http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		start := time.Now()
		if _, err := io.Copy(io.Discard, r.Body); err != nil {
			http.Error(w, err.Error(), http.StatusBadRequest)
			return
		}
		if hold, err := strconv.ParseInt(r.Header.Get("X-Relay-Hold-Ns"), 10, 64); err == nil {
			time.Sleep(time.Duration(hold) - time.Since(start))
		}
		writeFiller(w, r, filler)
	})
}

// writeFiller answers with as many bytes of filler as the request's
// X-Relay-Reply-Bytes says.
func writeFiller(w http.ResponseWriter, r *http.Request, filler []byte) {
	n, err := strconv.Atoi(r.Header.Get("X-Relay-Reply-Bytes"))
	if err != nil || n > len(filler) {
		http.Error(w, "bad X-Relay-Reply-Bytes", http.StatusBadRequest)
		return
	}
	w.Header().Set("Content-Type", "application/json")
	w.Header().Set("Content-Length", strconv.Itoa(n))
	w.Write(filler[:n])
}

const relayFillerSize = 8 << 20

// relayHandler is the relay process's server: each client request takes
// the next group of exchanges and makes them against engineAddr.
func relayHandler(groups [][]exchange, engineAddr string) http.Handler {
	filler := bytes.Repeat([]byte{'1'}, relayFillerSize)
	pool := &rawPool{addr: engineAddr}
	var next atomic.Int64
	return http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		if _, err := io.Copy(io.Discard, r.Body); err != nil {
			http.Error(w, err.Error(), http.StatusBadRequest)
			return
		}
		g := int(next.Add(1) - 1)
		if g >= len(groups) {
			http.Error(w, "relay: more turns than the adapter served", http.StatusInternalServerError)
			return
		}
		for _, x := range groups[g] {
			if err := pool.post(x.Path, filler[:x.Req], x.Reply, x.Hold); err != nil {
				http.Error(w, err.Error(), http.StatusBadGateway)
				return
			}
		}
		writeFiller(w, r, filler)
	})
}

// rawPool is a minimal HTTP/1.1 client: kept-alive connections, a request
// written with one writev (net.Buffers), a Content-Length reply read on the
// calling goroutine and discarded.
type rawPool struct {
	addr string
	mu   sync.Mutex
	idle []*rawConn
}

type rawConn struct {
	c   net.Conn
	r   *bufio.Reader
	hdr []byte
}

func (p *rawPool) post(path string, body []byte, reply int, hold time.Duration) error {
	p.mu.Lock()
	var rc *rawConn
	if n := len(p.idle); n > 0 {
		rc, p.idle = p.idle[n-1], p.idle[:n-1]
	}
	p.mu.Unlock()
	if rc == nil {
		c, err := net.Dial("tcp", p.addr)
		if err != nil {
			return err
		}
		rc = &rawConn{c: c, r: bufio.NewReaderSize(c, 64<<10)}
	}
	rc.hdr = fmt.Appendf(rc.hdr[:0], "POST %s HTTP/1.1\r\nHost: %s\r\nContent-Type: application/json\r\n"+
		"Content-Length: %d\r\nX-Relay-Reply-Bytes: %d\r\nX-Relay-Hold-Ns: %d\r\n\r\n", path, p.addr, len(body), reply, hold)
	bufs := net.Buffers{rc.hdr, body}
	if _, err := bufs.WriteTo(rc.c); err != nil {
		rc.c.Close()
		return err
	}
	length := -1
	for first := true; ; first = false {
		line, err := rc.r.ReadSlice('\n')
		if err != nil {
			rc.c.Close()
			return err
		}
		if first {
			if !bytes.HasPrefix(line, []byte("HTTP/1.1 200")) {
				rc.c.Close()
				return fmt.Errorf("relay: engine answered %q", bytes.TrimSpace(line))
			}
			continue
		}
		if len(bytes.TrimSpace(line)) == 0 {
			break
		}
		if k, v, ok := bytes.Cut(line, []byte(":")); ok && bytes.EqualFold(k, []byte("Content-Length")) {
			length, _ = strconv.Atoi(string(bytes.TrimSpace(v)))
		}
	}
	if length != reply {
		rc.c.Close()
		return fmt.Errorf("relay: reply of %d bytes, want %d", length, reply)
	}
	if _, err := rc.r.Discard(length); err != nil {
		rc.c.Close()
		return err
	}
	p.mu.Lock()
	p.idle = append(p.idle, rc)
	p.mu.Unlock()
	return nil
}

// relayPlanEnv names the file (JSON [][]exchange) that turns the load
// benchmark's child process into the relay, and relayEngineEnv the filler
// engine's address.
const (
	relayPlanEnv   = "KILN_LOAD_RELAY_PLAN"
	relayEngineEnv = "KILN_LOAD_RELAY_ENGINE"
)

// relayFromEnv returns the relay's handler when this child is the relay.
func relayFromEnv(t *testing.T) http.Handler {
	plan := os.Getenv(relayPlanEnv)
	if plan == "" {
		return nil
	}
	b, err := os.ReadFile(plan)
	if err != nil {
		t.Fatal(err)
	}
	var groups [][]exchange
	if err := json.Unmarshal(b, &groups); err != nil {
		t.Fatal(err)
	}
	return relayHandler(groups, os.Getenv(relayEngineEnv))
}

// TestAddedLatency: a turn's added latency is its span less the engine time
// of the exchanges inside it; turns that overlap an exchange are untold.
func TestAddedLatency(t *testing.T) {
	at := func(ms int) time.Time { return time.Unix(1000, 0).Add(time.Duration(ms) * time.Millisecond) }
	x := func(from, to int) exchange { return exchange{Start: at(from), End: at(to)} }
	turns := []span{{at(30), at(50)}, {at(0), at(10)}, {at(12), at(20)}, {at(18), at(25)}}
	xs := []exchange{
		x(1, 3), x(4, 8), // turn [0,10]: 6 ms of engine
		x(31, 32), x(40, 45), // turn [30,50]: 6 ms
		x(13, 15), // turn [12,20] alone
		x(18, 19), // inside [12,20] and [18,25]: both untold
		x(60, 61), // inside no turn
	}
	added, untold := addedLatency(turns, xs)
	if untold != 2 {
		t.Errorf("untold %d, want 2", untold)
	}
	if want := []time.Duration{4 * time.Millisecond, 14 * time.Millisecond}; !slices.Equal(added, want) {
		t.Errorf("added %v, want %v", added, want)
	}
}
