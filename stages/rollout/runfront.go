package rollout

import (
	"bytes"
	"context"
	"crypto/rand"
	"encoding/hex"
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

	mu       sync.Mutex
	sessions map[string]*frontSession
}

type frontSession struct {
	srv          *adapter.Server
	serverErrors int
}

func newFront(adapters []*adapter.Server) *front {
	return &front{adapters: adapters, sessions: map[string]*frontSession{}}
}

// newSessionID is an unguessable session token (128 random bits): the
// token is the only credential a sandbox holds, so one run's agent cannot
// speak in another run's session.
func newSessionID() string {
	var b [16]byte
	rand.Read(b[:])
	return "kiln-" + hex.EncodeToString(b[:])
}

// engineFor is the engine index a session goes to: a hash of its id, so
// sessions spread evenly and every turn of one session meets the same
// engine's prefix cache.
func (f *front) engineFor(id string) int {
	h := fnv.New32a()
	h.Write([]byte(id))
	return int(h.Sum32() % uint32(len(f.adapters)))
}

// open opens a session on its engine's adapter and admits its token.
func (f *front) open(id string, o adapter.SessionOptions) (engine int, err error) {
	engine = f.engineFor(id)
	srv := f.adapters[engine]
	if err := srv.Open(id, o); err != nil {
		return 0, err
	}
	f.mu.Lock()
	f.sessions[id] = &frontSession{srv: srv}
	f.mu.Unlock()
	return engine, nil
}

// close ends a session: later requests with its token are 401.
func (f *front) close(id string) (serverErrors int) {
	f.mu.Lock()
	defer f.mu.Unlock()
	s := f.sessions[id]
	delete(f.sessions, id)
	if s == nil {
		return 0
	}
	return s.serverErrors
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
	// 503 is the adapter's "session closed" (the run is ending), not a
	// failure of the engine.
	if sw.status >= 500 && sw.status != http.StatusServiceUnavailable {
		f.mu.Lock()
		s.serverErrors++
		f.mu.Unlock()
	}
}

// statusWriter remembers the status a handler answered.
type statusWriter struct {
	http.ResponseWriter
	status int
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
