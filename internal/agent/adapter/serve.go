package adapter

import (
	"log"
	"net/http"
	"time"
)

// The server's limits (HTTPLimits' defaults).
const (
	// DefaultReadHeaderTimeout bounds the reading of a request's head (from
	// the connection's start, or on a kept-alive connection from the next
	// request's first bytes): a client that trickles its head slower is
	// disconnected without an answer.
	DefaultReadHeaderTimeout = 30 * time.Second
	// DefaultIdleTimeout is how long a kept-alive connection may wait for
	// its next request. It is longer than the clients' own idle limits
	// (Node's agents close an idle connection after a few seconds, Codex's
	// pool after 90 s), so that the client, not the server, ends an idle
	// connection: a server closing it just as the client sends its next
	// turn on it would fail that turn. A coding CLI's connection is idle
	// while the tools of a turn run.
	DefaultIdleTimeout = 5 * time.Minute
	// DefaultWriteTimeout bounds each write of a response (see HTTPLimits):
	// a client that stops reading its reply is disconnected.
	DefaultWriteTimeout = time.Minute
	// DefaultMaxHeaderBytes bounds a request's head, as net/http's default
	// does; a longer one is answered 431.
	DefaultMaxHeaderBytes = http.DefaultMaxHeaderBytes
)

// HTTPLimits are the bounds NewHTTPServer puts on a client connection. A
// zero field takes its default.
type HTTPLimits struct {
	ReadHeaderTimeout time.Duration
	IdleTimeout       time.Duration
	// WriteTimeout bounds each write of a response, not the request: a
	// turn may generate for many minutes before its reply (or between a
	// streamed turn's keep-alive frames), so the server's deadline, set when
	// a request's head has been read, is moved to WriteTimeout past every
	// write and flush the handler makes (http.Server.WriteTimeout alone
	// would cut every turn longer than it).
	WriteTimeout   time.Duration
	MaxHeaderBytes int
}

func (l HTTPLimits) withDefaults() HTTPLimits {
	if l.ReadHeaderTimeout <= 0 {
		l.ReadHeaderTimeout = DefaultReadHeaderTimeout
	}
	if l.IdleTimeout <= 0 {
		l.IdleTimeout = DefaultIdleTimeout
	}
	if l.WriteTimeout <= 0 {
		l.WriteTimeout = DefaultWriteTimeout
	}
	if l.MaxHeaderBytes <= 0 {
		l.MaxHeaderBytes = DefaultMaxHeaderBytes
	}
	return l
}

// NewHTTPServer is the net/http server kiln-rollout adapter serves h with
// (h is normally a *Server): HTTP/1.1 without TLS under lim, every request
// body limited to MaxBodyBytes (a longer one fails the handler's read, and
// the connection closes after the answer). A request's context ends when
// its client hangs up (once the handler has read the body, as net/http
// has it) or when the handler returns. errLog receives what net/http
// logs (handler panics, accept errors); nil: the log package's logger.
func NewHTTPServer(h http.Handler, lim HTTPLimits, errLog *log.Logger) *http.Server {
	lim = lim.withDefaults()
	return &http.Server{
		Handler: http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
			// The limit is set on net/http's own writer, which is what
			// closes the connection once a body has gone past it.
			r.Body = http.MaxBytesReader(w, r.Body, MaxBodyBytes)
			if d, ok := w.(writeDeadliner); ok {
				w = &deadlineWriter{ResponseWriter: w, d: d, timeout: lim.WriteTimeout}
			}
			h.ServeHTTP(w, r)
			if d, ok := w.(*deadlineWriter); ok {
				// What net/http sends after the handler (a buffered reply,
				// the head of an empty one) gets its own time too.
				_ = d.d.SetWriteDeadline(time.Now().Add(lim.WriteTimeout))
			}
		}),
		ReadHeaderTimeout: lim.ReadHeaderTimeout,
		IdleTimeout:       lim.IdleTimeout,
		WriteTimeout:      lim.WriteTimeout,
		MaxHeaderBytes:    lim.MaxHeaderBytes,
		ErrorLog:          errLog,
	}
}

// writeDeadliner is net/http's response writer's deadline method (what
// http.ResponseController calls), asserted once per request.
type writeDeadliner interface{ SetWriteDeadline(time.Time) error }

// deadlineWriter moves the connection's write deadline to timeout past
// each write and flush, so that the deadline bounds how long one write may
// stall, not how long the turn may take before it writes.
type deadlineWriter struct {
	http.ResponseWriter
	d       writeDeadliner
	timeout time.Duration
}

func (w *deadlineWriter) Write(p []byte) (int, error) {
	_ = w.d.SetWriteDeadline(time.Now().Add(w.timeout))
	return w.ResponseWriter.Write(p)
}

// WriteHeader moves the deadline too: net/http may write the head on its
// own after the handler returns, within the same deadline.
func (w *deadlineWriter) WriteHeader(code int) {
	_ = w.d.SetWriteDeadline(time.Now().Add(w.timeout))
	w.ResponseWriter.WriteHeader(code)
}

func (w *deadlineWriter) Flush() {
	_ = w.d.SetWriteDeadline(time.Now().Add(w.timeout))
	if f, ok := w.ResponseWriter.(http.Flusher); ok {
		f.Flush()
	}
}

// Unwrap lets http.ResponseController reach net/http's writer.
func (w *deadlineWriter) Unwrap() http.ResponseWriter { return w.ResponseWriter }
