package adapter

import (
	"context"
	"encoding/json"
	"fmt"
	"net/http"
	"slices"
	"sync"
	"time"

	"github.com/kilnrl/kiln/formats/records"
	"github.com/kilnrl/kiln/internal/agent/engine"
	"github.com/kilnrl/kiln/internal/agent/protocol"
)

// session is one agent session (docs/adapter.md §2.2).
type session struct {
	id       string
	opts     SessionOptions
	sampling engine.SamplingParams // effective defaults, copied
	kwargs   json.RawMessage       // effective chat_template_kwargs, copied

	// turnSem serializes the turns of the session (capacity 1).
	turnSem chan struct{}
	// ctx is cancelled by Finish/Drop after the shutdown wait.
	ctx    context.Context
	cancel context.CancelFunc
	// inflight counts running requests; guarded by Server.mu for Add.
	inflight sync.WaitGroup
	asked    int // requests counted against MaxTurnsPerSession (Server.mu)

	// Guarded by turnSem.
	turns    []records.Turn // PromptMessages is joined by Finish, from msgs
	msgs     messageStore
	prefixes []prefix
	memo     hashMemo
	calls    engine.Memo // what the engine client remembers of this session's calls
	// The recorded prompts and the prefixes' message hashes, each list
	// beginning with the one before (chain).
	prompts chain[int32]
	hashes  chain[digest]
}

func (s *Server) newSession(id string, o SessionOptions) *session {
	sp := s.opts.Sampling
	if o.Sampling != nil {
		sp = *o.Sampling
	}
	sp = copySampling(sp)
	kw := s.opts.ChatTemplateKwargs
	if o.ChatTemplateKwargs != nil {
		kw = o.ChatTemplateKwargs
	}
	o.Sampling = nil
	o.ChatTemplateKwargs = nil
	ctx, cancel := context.WithCancel(context.Background())
	return &session{id: id, opts: o, sampling: sp, kwargs: slices.Clone(kw),
		turnSem: make(chan struct{}, 1), ctx: ctx, cancel: cancel}
}

func copySampling(sp engine.SamplingParams) engine.SamplingParams {
	sp.Stop = slices.Clone(sp.Stop)
	sp.StopTokenIDs = slices.Clone(sp.StopTokenIDs)
	if sp.LogitBias != nil {
		m := make(map[int32]float64, len(sp.LogitBias))
		for k, v := range sp.LogitBias {
			m[k] = v
		}
		sp.LogitBias = m
	}
	return sp
}

// Open registers a session. Ids must be unique per server: reopening an
// open or finished id is an error (docs/adapter.md §2.2).
func (s *Server) Open(id string, o SessionOptions) error {
	if o.ChatTemplateKwargs != nil && !json.Valid(o.ChatTemplateKwargs) {
		return fmt.Errorf("adapter: session %q: chat_template_kwargs is not valid JSON", id)
	}
	s.mu.Lock()
	defer s.mu.Unlock()
	if _, ok := s.sessions[id]; ok || s.closed[id] {
		return fmt.Errorf("adapter: session %q already exists (sids must be unique per agent run)", id)
	}
	s.sessions[id] = s.newSession(id, o)
	s.order = append(s.order, id)
	return nil
}

// Sessions lists the open sessions, in the order they were opened (by Open
// or, with AutoOpen, by their first request).
func (s *Server) Sessions() []string {
	s.mu.Lock()
	defer s.mu.Unlock()
	var ids []string
	for _, id := range s.order {
		if s.sessions[id] != nil {
			ids = append(ids, id)
		}
	}
	return ids
}

// Finish closes the session (later requests get 503 session closed), waits
// up to Options.ShutdownWait for in-flight turns, cancels the rest, and
// returns the recorded turns in order. A second call, or a call for an id
// never seen, returns nil (docs/adapter.md §2.2: idempotent).
func (s *Server) Finish(id string) ([]records.Turn, error) {
	sess := s.shutdown(id)
	if sess == nil {
		return nil, nil
	}
	for i := range sess.turns {
		sess.turns[i].PromptMessages = joinArray(sess.msgs.turns[i])
	}
	sess.msgs = messageStore{}
	return sess.turns, nil
}

// Drop closes the session like Finish and forgets its turns.
func (s *Server) Drop(id string) { s.shutdown(id) }

func (s *Server) shutdown(id string) *session {
	s.mu.Lock()
	s.closed[id] = true
	sess := s.sessions[id]
	delete(s.sessions, id)
	s.mu.Unlock()
	s.histories.Delete(id)
	if sess == nil {
		return nil
	}
	done := make(chan struct{})
	go func() { sess.inflight.Wait(); close(done) }()
	t := time.NewTimer(s.opts.ShutdownWait)
	defer t.Stop()
	select {
	case <-done:
	case <-t.C:
	}
	sess.cancel()
	<-done
	// No turn runs any more; take the semaphore so the turns are visible.
	sess.turnSem <- struct{}{}
	return sess
}

// acquire resolves the request's session, applies the closed check and the
// turn cap, and counts the request in flight. release must be called.
func (s *Server) acquire(sid string) (*session, *protocol.Error) {
	s.mu.Lock()
	defer s.mu.Unlock()
	if s.closed[sid] {
		return nil, &protocol.Error{Status: http.StatusServiceUnavailable, Type: "overloaded_error", Message: "session closed"}
	}
	sess := s.sessions[sid]
	if sess == nil {
		if s.opts.AutoOpen != nil && !*s.opts.AutoOpen {
			return nil, &protocol.Error{Status: http.StatusNotFound, Type: "not_found_error",
				Message: fmt.Sprintf("adapter: unknown session %q", sid)}
		}
		sess = s.newSession(sid, SessionOptions{})
		s.sessions[sid] = sess
		s.order = append(s.order, sid)
	}
	if n := s.opts.MaxTurnsPerSession; n > 0 {
		if sess.asked >= n {
			return nil, &protocol.Error{Status: http.StatusTooManyRequests, Type: "rate_limit_error",
				Message: fmt.Sprintf("adapter: sid '%s' exceeded max_turns_per_sid=%d; killing run", sid, n)}
		}
		sess.asked++
	}
	sess.inflight.Add(1)
	return sess, nil
}
