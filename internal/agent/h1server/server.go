// Package h1server serves HTTP/1.1 over plain connections for the
// adapter: the same http.Handler, http.Request and http.ResponseWriter as
// net/http's server, with less work per request.
//
// Why not net/http.Server: after a handler has read its request body, the
// server starts a goroutine per request that blocks in a read of the
// connection, so that a client hanging up cancels the request's context;
// when the handler returns it unblocks that goroutine (a deadline in the
// past) and waits for it to exit. On the adapter's hot path — one client
// request and four engine exchanges a turn — those wake-ups, the
// goroutine, the per-request context and the chunked response writer were
// about a seventh of the adapter's CPU per turn (BENCHMARKS.md). Here a
// connection's goroutine is the only one: the request is read with
// net/http's own parser (http.ReadRequest, so what is accepted and how it
// is read are net/http's), the response is written whole with one writev,
// and hang-ups are noticed by one watcher for the whole server (an epoll
// set waiting for the peer's close on every connection), which cancels the
// connection's context.
//
// What it serves: HTTP/1.1 and 1.0 without TLS, keep-alive and pipelined
// requests, bodies with a length or chunked, Expect: 100-continue, HEAD.
// A response is buffered and sent whole with its length (the adapter
// generates a turn before it answers) unless the handler flushes it
// (http.Flusher; the adapter's keep-alives on a long generation): then it
// is sent as net/http sends it, chunked on HTTP/1.1. Not
// HTTP/2, not hijacking, not trailers, not informational (1xx) responses
// from a handler (WriteHeader ignores them). A request's context is its
// connection's: it ends when the client hangs up or the connection
// closes, not when the handler returns (a handler that needs that derives
// its own). Where the hang-up watcher is not available (systems other than
// Linux) Serve is net/http's server.
package h1server

import (
	"context"
	"errors"
	"log"
	"net"
	"net/http"
	"sync"
	"sync/atomic"
	"time"
)

// Server serves Handler on the listeners given to Serve. Set its fields
// before the first Serve and do not change them after.
type Server struct {
	Handler http.Handler // nil: http.DefaultServeMux, as net/http's server

	// ReadHeaderTimeout bounds the reading of a request's head, from its
	// first byte; 0 means no limit. An idle kept-alive connection waits
	// for its next request without a limit, as net/http's does.
	ReadHeaderTimeout time.Duration

	// MaxHeaderBytes bounds a request head (0: http.DefaultMaxHeaderBytes);
	// a longer one is answered 431.
	MaxHeaderBytes int

	// ErrorLog receives handler panics and accept errors; nil: the log
	// package's standard logger.
	ErrorLog *log.Logger

	mu        sync.Mutex
	listeners map[net.Listener]struct{}
	conns     map[*conn]struct{}
	hangups   *hangups     // nil until the first Serve, or where unsupported
	std       *http.Server // the fallback, where hangups are unsupported
	closing   atomic.Bool
	done      chan struct{} // closed by Shutdown and Close
}

// Serve accepts connections on ln and serves each on its own goroutine
// until Shutdown or Close, when it returns http.ErrServerClosed; any other
// accept failure is returned as it is. ln is closed when Serve returns.
func (s *Server) Serve(ln net.Listener) error {
	std, err := s.start(ln)
	if err != nil {
		ln.Close()
		return err
	}
	if std != nil {
		return std.Serve(ln)
	}
	defer s.untrack(ln)
	var delay time.Duration
	for {
		nc, err := ln.Accept()
		if err != nil {
			if s.closing.Load() {
				return http.ErrServerClosed
			}
			var te interface{ Temporary() bool }
			if errors.As(err, &te) && te.Temporary() {
				// Out of file descriptors and the like: wait, as net/http does.
				delay = min(max(2*delay, 5*time.Millisecond), time.Second)
				s.logf("h1server: accept error: %v; retrying in %v", err, delay)
				select {
				case <-time.After(delay):
				case <-s.done:
				}
				continue
			}
			return err
		}
		delay = 0
		c, err := s.newConn(nc)
		if err != nil {
			if !errors.Is(err, http.ErrServerClosed) {
				s.logf("h1server: %v", err)
			}
			nc.Close()
			continue
		}
		go c.serve()
	}
}

// start registers ln, starting the hang-up watcher on the first call. It
// returns net/http's server where the watcher is unsupported.
func (s *Server) start(ln net.Listener) (*http.Server, error) {
	s.mu.Lock()
	defer s.mu.Unlock()
	if s.closing.Load() {
		return nil, http.ErrServerClosed
	}
	if s.done == nil {
		// Set up on the first Serve; a failure leaves nothing set up, so a
		// later Serve tries again.
		h, err := newHangups()
		switch {
		case errors.Is(err, errUnsupported):
			s.std = &http.Server{Handler: s.Handler, ReadHeaderTimeout: s.ReadHeaderTimeout,
				MaxHeaderBytes: s.MaxHeaderBytes, ErrorLog: s.ErrorLog}
		case err != nil:
			return nil, err
		}
		s.hangups = h
		s.done = make(chan struct{})
		s.listeners = map[net.Listener]struct{}{}
		s.conns = map[*conn]struct{}{}
	}
	if s.std != nil {
		return s.std, nil
	}
	s.listeners[ln] = struct{}{}
	return nil, nil
}

func (s *Server) untrack(ln net.Listener) {
	s.mu.Lock()
	delete(s.listeners, ln)
	s.mu.Unlock()
	ln.Close()
}

// Shutdown stops the server gracefully: it closes the listeners, then the
// connections as they go idle, and waits until none is left or ctx ends
// (returning ctx's error; the connections still active are left to
// finish). As net/http's Shutdown.
func (s *Server) Shutdown(ctx context.Context) error {
	std := s.stop()
	if std != nil {
		return std.Shutdown(ctx)
	}
	tick := time.NewTicker(5 * time.Millisecond)
	defer tick.Stop()
	for {
		if s.closeIdle() {
			s.stopHangups()
			return nil
		}
		select {
		case <-ctx.Done():
			return ctx.Err()
		case <-tick.C:
		}
	}
}

// Close closes the listeners and every connection at once.
func (s *Server) Close() error {
	std := s.stop()
	if std != nil {
		return std.Close()
	}
	s.mu.Lock()
	for c := range s.conns {
		c.nc.Close()
	}
	s.mu.Unlock()
	s.stopHangups()
	return nil
}

// stop marks the server closing and closes its listeners.
func (s *Server) stop() *http.Server {
	s.mu.Lock()
	defer s.mu.Unlock()
	if s.closing.Swap(true) || s.done == nil {
		return s.std
	}
	close(s.done)
	for ln := range s.listeners {
		ln.Close()
	}
	return s.std
}

// closeIdle closes the idle connections and reports whether none is left.
func (s *Server) closeIdle() bool {
	s.mu.Lock()
	defer s.mu.Unlock()
	for c := range s.conns {
		if c.state.CompareAndSwap(stateIdle, stateClosed) {
			c.nc.Close()
		}
	}
	return len(s.conns) == 0
}

func (s *Server) stopHangups() {
	s.mu.Lock()
	h := s.hangups
	s.mu.Unlock()
	if h != nil {
		h.close()
	}
}

func (s *Server) logf(format string, args ...any) {
	if s.ErrorLog != nil {
		s.ErrorLog.Printf(format, args...)
		return
	}
	log.Printf(format, args...)
}

// errUnsupported: no hang-up watcher on this system.
var errUnsupported = errors.New("h1server: no hang-up watcher on this system")

// ServeLoopback serves h on a new listener on 127.0.0.1, as kiln-rollout
// adapter serves, for tests and tools that need a server of their own. It
// returns the base URL ("http://127.0.0.1:PORT") and the function that
// closes the server.
func ServeLoopback(h http.Handler) (url string, stop func(), err error) {
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		return "", nil, err
	}
	s := &Server{Handler: h}
	served := make(chan struct{})
	go func() { _ = s.Serve(ln); close(served) }()
	return "http://" + ln.Addr().String(), func() { s.Close(); <-served }, nil
}
