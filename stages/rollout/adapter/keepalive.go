package adapter

import (
	"io"
	"net/http"
	"sync"
	"time"

	"github.com/kilnrl/kiln/stages/rollout/protocol"
)

// DefaultKeepAlive is Options.KeepAlive's default: well inside the usual
// silence limits between a client and the adapter (a proxy's read timeout
// is often a minute: nginx's default), and long enough that almost every
// turn answers before it, with a plain response.
const DefaultKeepAlive = 15 * time.Second

// keepAlive holds a streamed turn's answer while it is generated. Once the
// turn has gone Options.KeepAlive without an answer it sends the stream's
// head and the protocol's keep-alive frame (protocol.KeepAlive), and the
// frame again every KeepAlive after, until end. A turn that answers sooner
// sends nothing of it: its reply, or its error status, goes as before.
//
// The frames are written from a timer's goroutine while the turn's own
// goroutine runs the engine calls, so the writer is used under mu only
// until end, which waits for a frame being written.
type keepAlive struct {
	mu      sync.Mutex
	w       http.ResponseWriter
	flusher http.Flusher
	frame   string
	every   time.Duration
	timer   *time.Timer
	started bool // the head and at least one frame were sent
	ended   bool
}

// keepAlive starts the keep-alive of req's answer, or returns nil where
// there is none: a JSON reply, a protocol without a frame, a writer that
// cannot flush, or Options.KeepAlive < 0.
func (s *Server) keepAlive(w http.ResponseWriter, req *protocol.Request) *keepAlive {
	if !req.Stream || s.opts.KeepAlive < 0 {
		return nil
	}
	frame := protocol.KeepAlive(req.Protocol)
	f, ok := w.(http.Flusher)
	if frame == "" || !ok {
		return nil
	}
	every := s.opts.KeepAlive
	if every == 0 {
		every = DefaultKeepAlive
	}
	k := &keepAlive{w: w, flusher: f, frame: frame, every: every}
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
	if !k.started {
		k.started = true
		setSSEHeaders(k.w)
		k.w.WriteHeader(http.StatusOK)
	}
	// A failed write is the client gone, which ends the turn's context:
	// the turn ends on its own.
	if _, err := io.WriteString(k.w, k.frame); err == nil {
		k.flusher.Flush()
	}
	k.timer.Reset(k.every)
}

// end stops the keep-alive, after a frame being written, and reports
// whether the stream has started: then the answer, reply or error, must
// follow in it. Safe on nil (no keep-alive).
func (k *keepAlive) end() (started bool) {
	if k == nil {
		return false
	}
	k.mu.Lock()
	defer k.mu.Unlock()
	k.ended = true
	k.timer.Stop()
	return k.started
}

func setSSEHeaders(w http.ResponseWriter) {
	for k, v := range protocol.SSEHeaders {
		w.Header().Set(k, v)
	}
}
