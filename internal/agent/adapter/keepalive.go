package adapter

import (
	"net/http"
	"sync"
	"time"

	"github.com/kilnrl/kiln/internal/agent/protocol"
)

// DefaultKeepAlive is Options.KeepAlive's default: well inside the usual
// silence limits between a client and the adapter (a proxy's read timeout
// is often a minute: nginx's default), and long enough that almost every
// turn answers before it, with a plain response.
const DefaultKeepAlive = 15 * time.Second

// keepAlive holds a streamed turn's answer while it is generated. Once the
// turn has gone Options.KeepAlive without an answer it sends the stream's
// head and the protocol's keep-alive frame (protocol.Prelude), and a frame
// again every KeepAlive after, until end; the answer then follows in the
// same stream (reply, or fail). A turn that answers sooner sends nothing
// of it: its reply, or its error status, goes as before.
//
// The frames are written from a timer's goroutine while the turn's own
// goroutine runs the engine calls, so the writer and the prelude are used
// under mu only until end, which waits for a frame being written.
type keepAlive struct {
	mu      sync.Mutex
	w       http.ResponseWriter
	flusher http.Flusher
	req     *protocol.Request
	opt     protocol.ReplyOptions
	prelude *protocol.Prelude // made by the first beat, with the head
	every   time.Duration
	timer   *time.Timer
	ended   bool
}

// keepAlive starts the keep-alive of req's answer, or returns nil where
// there is none: a JSON reply, a writer that cannot flush, or
// Options.KeepAlive < 0. opt are the reply's options.
func (s *Server) keepAlive(w http.ResponseWriter, req *protocol.Request, opt protocol.ReplyOptions) *keepAlive {
	if !req.Stream || s.opts.KeepAlive < 0 {
		return nil
	}
	f, ok := w.(http.Flusher)
	if !ok {
		return nil
	}
	every := s.opts.KeepAlive
	if every == 0 {
		every = DefaultKeepAlive
	}
	k := &keepAlive{w: w, flusher: f, req: req, opt: opt, every: every}
	k.mu.Lock() // beat may run before the timer is stored
	k.timer = time.AfterFunc(every, k.beat)
	k.mu.Unlock()
	return k
}

func (k *keepAlive) beat() {
	k.mu.Lock()
	defer k.mu.Unlock()
	if k.ended {
		return
	}
	if k.prelude == nil {
		k.prelude = protocol.NewPrelude(k.req, k.opt)
		setSSEHeaders(k.w)
		k.w.WriteHeader(http.StatusOK)
	}
	// A failed write is the client gone, which ends the turn's context:
	// the turn ends on its own.
	if _, err := k.w.Write(k.prelude.Frame()); err == nil {
		k.flusher.Flush()
	}
	k.timer.Reset(k.every)
}

// end stops the keep-alive, after a frame being written, and returns the
// prelude when the stream has started: then the answer must follow in it
// (Prelude.Reply or Prelude.Error). Safe on nil (no keep-alive).
func (k *keepAlive) end() *protocol.Prelude {
	if k == nil {
		return nil
	}
	k.mu.Lock()
	defer k.mu.Unlock()
	k.ended = true
	k.timer.Stop()
	return k.prelude
}

func setSSEHeaders(w http.ResponseWriter) {
	for k, v := range protocol.SSEHeaders() {
		w.Header().Set(k, v)
	}
}
