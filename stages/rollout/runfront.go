package rollout

import (
	"bytes"
	"context"
	"crypto/rand"
	"encoding/hex"
	"errors"
	"fmt"
	"hash/fnv"
	"io"
	"net/http"
	"strings"
	"sync"

	"github.com/kilnrl/kiln/formats/store"
	"github.com/kilnrl/kiln/internal/agent/adapter"
)

// front is the HTTP handler every sandbox's endpoint reaches: it admits
// only requests carrying the token of a session this stage opened, hands
// each to the adapter of the engine its session was given, and counts the
// server errors each session was answered (docs/rollout.md §2.3).
type front struct {
	adapters []*adapter.Server // one per engine, in --engine order

	// weights is the run stage's --weights (nil without): the version
	// every token must be generated with (observeWeights).
	weights *pinnedWeights

	mu       sync.Mutex
	sessions map[string]*frontSession
	down     map[int]string // engines left out after a failed health check, and why
}

type frontSession struct {
	srv    *adapter.Server
	engine int
	errs   sessionErrors
	// abort ends the session's run (its context) when its engine fails,
	// or generates with other weights.
	abort context.CancelCauseFunc
	// calls counts the session's generations (observeWeights names the
	// turn); weightsChanged is set once one was generated with other
	// weights.
	calls          int
	weightsChanged bool
}

// errNoEngine is the error of opening a session when every engine has
// failed its health check.
var errNoEngine = errors.New("every engine failed its health check")

// engineDownError is the cause of a run ended because its engine failed
// its health check.
type engineDownError struct {
	engine int
	why    string
}

func (e *engineDownError) Error() string {
	return fmt.Sprintf("engine %d failed its health check: %s", e.engine, e.why)
}

func newFront(adapters []*adapter.Server) *front {
	return &front{adapters: adapters, sessions: map[string]*frontSession{}, down: map[int]string{}}
}

// newSessionID is an unguessable session token (128 random bits): the
// token is the only credential a sandbox holds, so one run's agent cannot
// speak in another run's session.
func newSessionID() string {
	var b [16]byte
	rand.Read(b[:])
	return "kiln-" + hex.EncodeToString(b[:])
}

// engineFor is the engine index a session goes to: a hash of its id over
// the engines still in service, so sessions spread evenly and every turn
// of one session meets the same engine's prefix cache. -1: none is left.
func (f *front) engineFor(id string) int {
	f.mu.Lock()
	defer f.mu.Unlock()
	return f.engineForLocked(id)
}

func (f *front) engineForLocked(id string) int {
	var up []int
	for i := range f.adapters {
		if _, down := f.down[i]; !down {
			up = append(up, i)
		}
	}
	if len(up) == 0 {
		return -1
	}
	h := fnv.New32a()
	h.Write([]byte(id))
	return up[h.Sum32()%uint32(len(up))]
}

// open opens a session on its engine's adapter and admits its token;
// abort is called with an *engineDownError if that engine fails its health
// check while the session is open.
func (f *front) open(id string, o adapter.SessionOptions, abort context.CancelCauseFunc) (engine int, err error) {
	f.mu.Lock()
	defer f.mu.Unlock()
	engine = f.engineForLocked(id)
	if engine < 0 {
		return 0, errNoEngine
	}
	if err := f.adapters[engine].Open(id, o); err != nil {
		return 0, err
	}
	f.sessions[id] = &frontSession{srv: f.adapters[engine], engine: engine, abort: abort}
	return engine, nil
}

// engineDown leaves engine i out of new sessions and ends the runs of its
// open sessions. It reports whether any engine is still in service.
func (f *front) engineDown(i int, why string) (anyLeft bool) {
	f.mu.Lock()
	defer f.mu.Unlock()
	if _, already := f.down[i]; !already {
		f.down[i] = why
		for _, s := range f.sessions {
			if s.engine == i && s.abort != nil {
				s.abort(&engineDownError{engine: i, why: why})
			}
		}
	}
	return len(f.down) < len(f.adapters)
}

// sessionErrors counts a session's model calls answered with a server
// error and keeps the first one's status and body, for its run's
// engine_error detail (docs/rollout.md §2.4).
type sessionErrors struct {
	n     int
	first string
}

// maxErrorBody bounds the body kept of a server error.
const maxErrorBody = 512

// close ends a session: later requests with its token are 401.
func (f *front) close(id string) sessionErrors {
	f.mu.Lock()
	defer f.mu.Unlock()
	s := f.sessions[id]
	delete(f.sessions, id)
	if s == nil {
		return sessionErrors{}
	}
	return s.errs
}

// token is the request's credential as the adapter resolves a session
// from headers (docs/adapter.md §2.1): the bearer token, else x-api-key.
func token(r *http.Request) string {
	if a := strings.TrimSpace(r.Header.Get("Authorization")); len(a) >= 7 && strings.EqualFold(a[:7], "bearer ") {
		return strings.TrimSpace(a[7:])
	}
	return strings.TrimSpace(r.Header.Get("X-Api-Key"))
}

func (f *front) ServeHTTP(w http.ResponseWriter, r *http.Request) {
	if r.Method == http.MethodGet || r.Method == http.MethodHead {
		// The auxiliary routes (health, models, Claude Code's probe) make
		// no engine call and hold no session state.
		f.adapters[0].ServeHTTP(w, r)
		return
	}
	id := token(r)
	f.mu.Lock()
	s := f.sessions[id]
	f.mu.Unlock()
	if s == nil {
		// Unknown or finished: refused before the adapter, so the request
		// is recorded nowhere (and never auto-opens a session).
		_, _ = io.Copy(io.Discard, io.LimitReader(r.Body, 1<<20))
		http.Error(w, `{"error":{"type":"authentication_error","message":"unknown or finished session token"}}`, http.StatusUnauthorized)
		return
	}
	sw := &statusWriter{ResponseWriter: w}
	s.srv.ServeHTTP(sw, r)
	if sw.failed() {
		f.mu.Lock()
		s.errs.n++
		if s.errs.n == 1 {
			s.errs.first = fmt.Sprintf("%d %s", sw.status, strings.TrimSpace(string(sw.body)))
		}
		f.mu.Unlock()
	}
}

// statusWriter remembers the status a handler answered, and the start of
// the body of a server error.
type statusWriter struct {
	http.ResponseWriter
	status int
	body   []byte
}

// failed: the call was answered with a server error. 503 is the adapter's
// "session closed" (the run is ending), not a failure of the engine.
func (s *statusWriter) failed() bool {
	return s.status >= 500 && s.status != http.StatusServiceUnavailable
}

func (s *statusWriter) WriteHeader(code int) {
	if s.status == 0 {
		s.status = code
	}
	s.ResponseWriter.WriteHeader(code)
}

func (s *statusWriter) Write(p []byte) (int, error) {
	if s.status == 0 {
		s.status = http.StatusOK
	}
	if s.failed() && len(s.body) < maxErrorBody {
		s.body = append(s.body, p[:min(len(p), maxErrorBody-len(s.body))]...)
	}
	return s.ResponseWriter.Write(p)
}

// Flush passes flushes on (the adapter streams SSE).
func (s *statusWriter) Flush() {
	if fl, ok := s.ResponseWriter.(http.Flusher); ok {
		fl.Flush()
	}
}

// Unwrap lets net/http's ResponseController reach the connection (the
// adapter's write deadlines).
func (s *statusWriter) Unwrap() http.ResponseWriter { return s.ResponseWriter }

// storeSink keeps a sandbox's artifacts in the store under prefix; each
// one is written whole when its writer closes, create-if-absent (artifacts
// are never overwritten).
type storeSink struct {
	ctx    context.Context
	st     store.Store
	prefix string // ends in "/"
}

func (s storeSink) Create(name string) (io.WriteCloser, error) {
	return &sinkFile{s: s, key: s.prefix + name}, nil
}

type sinkFile struct {
	s   storeSink
	key string
	buf bytes.Buffer
}

func (f *sinkFile) Write(p []byte) (int, error) { return f.buf.Write(p) }

func (f *sinkFile) Close() error {
	if _, err := f.s.st.PutIfAbsent(f.s.ctx, f.key, bytes.NewReader(f.buf.Bytes()), int64(f.buf.Len())); err != nil {
		return fmt.Errorf("saving artifact %q: %w", f.key, err)
	}
	return nil
}
