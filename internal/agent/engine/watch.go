package engine

import (
	"context"
	"sync"
)

// Watch returns a context for a run of engine calls made one after another
// under ctx — an adapter turn's tokenize, generate and detokenize calls —
// and the function that ends the run.
//
// A call on the HTTP/1.1 transport closes its connection when its context
// ends: that is how the engine learns to abort, and what unblocks the call.
// Alone, each call registers that on ctx (context.AfterFunc) and removes it
// again; under a Watch the run's calls share one registration. The
// contract is the same either way: a call whose context ends fails with
// ctx.Err() and its connection is closed, never reused. Calls made
// concurrently under one Watch stay correct — one of them uses the shared
// registration, the others register their own — and so do calls under a
// context derived from the watched one that can end before it (a request
// timeout): they register their own too.
//
// stop must be called once the run is over; it does not cancel ctx.
func Watch(ctx context.Context) (_ context.Context, stop func()) {
	w := &callWatch{done: ctx.Done()}
	unregister := context.AfterFunc(ctx, w.end)
	return context.WithValue(ctx, callWatchKey{}, w), func() { unregister() }
}

type callWatchKey struct{}

// callWatch closes the connection of the call in flight when its context
// ends.
type callWatch struct {
	done  <-chan struct{} // the watched context's
	mu    sync.Mutex
	conn  *h1Conn // the call in flight under the watch, if any
	ended bool    // the context ended
}

// watchOf returns the watch that ends with ctx, or nil: a context derived
// under a watch that can end on its own (a request timeout) is not the
// watch's to close, and its call registers itself.
func watchOf(ctx context.Context) *callWatch {
	w, _ := ctx.Value(callWatchKey{}).(*callWatch)
	if w == nil || ctx.Done() != w.done {
		return nil
	}
	return w
}

// enter makes w responsible for closing c, reporting false (and taking
// nothing on) when w is nil or another call holds it. A call entering
// after the context ended has its connection closed at once, so its I/O
// fails as it would have under its own registration.
func (w *callWatch) enter(c *h1Conn) bool {
	if w == nil {
		return false
	}
	w.mu.Lock()
	defer w.mu.Unlock()
	if w.conn != nil {
		return false
	}
	w.conn = c
	if w.ended {
		c.nc.Close()
	}
	return true
}

// leave releases c, reporting whether the context is still live (false:
// c was or may have been closed, and must not be reused).
func (w *callWatch) leave() bool {
	w.mu.Lock()
	defer w.mu.Unlock()
	w.conn = nil
	return !w.ended
}

func (w *callWatch) end() {
	w.mu.Lock()
	defer w.mu.Unlock()
	w.ended = true
	if w.conn != nil {
		w.conn.nc.Close()
	}
}
