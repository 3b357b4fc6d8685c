// Package enginectltest is in-process fakes of the control routes of vLLM
// and SGLang that internal/enginectl calls (docs/sync.md §3, §5), written
// from their documented behaviour: vLLM in dev mode (VLLM_SERVER_DEV_MODE=1:
// /pause, /resume, /is_paused, /reset_prefix_cache, /collective_rpc
// reload_weights, the RL router's /update_weight_version and /weight_info,
// /v1/models) and SGLang's HTTP server (/pause_generation,
// /continue_generation, /flush_cache, /update_weights_from_disk,
// /get_weight_version, /update_weight_version). A fake records every call
// in order, holds its paused, version and path state, answers 404
// {"detail":"Not Found"} on an unknown route (as FastAPI), and injects the
// failures of Faults. It checks request shapes as the engines do (a bad
// pause mode, a missing path, a non-string new_version are 400/422) and
// nothing more: it never loads weights.
package enginectltest

import (
	"encoding/json"
	"fmt"
	"io"
	"net/http"
	"net/http/httptest"
	"sync"
	"testing"
	"time"
)

// Faults are failures a fake injects. The zero value is a healthy engine.
type Faults struct {
	// ReloadStatus: the reload route (vLLM /collective_rpc reload_weights,
	// SGLang /update_weights_from_disk) answers this status (400, 500)
	// with an error message and loads nothing.
	ReloadStatus int
	// ReloadSuccessFalse: SGLang's reload answers 200 {"success": false}
	// and loads nothing.
	ReloadSuccessFalse bool
	// FlushFailures: the first K flush calls are refused (vLLM 500,
	// SGLang 400, as when requests still hold the cache).
	FlushFailures int
	// WrongVersion, when set, is the version the engine reports whatever
	// it was told.
	WrongVersion string
	// Hang is a route path ("/pause", "/collective_rpc", ...) that reads
	// the request and never answers until the client gives up or the fake
	// closes.
	Hang string
	// Slow delays the answer of each route path it names (a reload that
	// takes minutes on a large model).
	Slow map[string]time.Duration
	// NoDevMode: a vLLM started without VLLM_SERVER_DEV_MODE=1: every
	// control route is 404.
	NoDevMode bool
	// ModelsVersion: vLLM's /v1/models card carries weight_version (as
	// kiln's serve.py's does); upstream vLLM's does not, so by default the
	// client must fall back to /weight_info.
	ModelsVersion bool
	// APIKey, when set, is required as "Authorization: Bearer APIKey" on
	// every route (401 otherwise).
	APIKey string
}

// Call is one request a fake received.
type Call struct {
	Method string
	Path   string
	Query  string // the raw query, "" when none
	Body   string // the raw body
	Auth   string // the Authorization header
}

// Route is "METHOD /path" with "?query" when there is one.
func (c Call) Route() string {
	s := c.Method + " " + c.Path
	if c.Query != "" {
		s += "?" + c.Query
	}
	return s
}

// Engine is a fake engine serving one protocol over HTTP.
type Engine struct {
	URL string

	sglang bool
	srv    *httptest.Server
	done   chan struct{} // closed at cleanup: releases hung handlers

	mu        sync.Mutex
	f         Faults
	calls     []Call
	paused    bool
	version   string
	path      string
	flushes   int
	reloads   int
	closeOnce sync.Once
}

// NewVLLM starts a fake vLLM (dev mode unless f.NoDevMode) serving model
// path "base" at version "" (none), closed at t's cleanup.
func NewVLLM(t testing.TB, f Faults) *Engine { return start(t, false, f) }

// NewSGLang starts a fake SGLang server, closed at t's cleanup.
func NewSGLang(t testing.TB, f Faults) *Engine { return start(t, true, f) }

func start(t testing.TB, sglang bool, f Faults) *Engine {
	t.Helper()
	e := &Engine{sglang: sglang, f: f, path: "base", done: make(chan struct{})}
	e.srv = httptest.NewServer(http.HandlerFunc(e.serve))
	e.URL = e.srv.URL
	t.Cleanup(e.Close)
	return e
}

// Close releases hung requests and stops the server.
func (e *Engine) Close() {
	e.closeOnce.Do(func() {
		close(e.done)
		e.srv.Close()
	})
}

// SetFaults replaces the injected failures (e.g. to heal an engine before
// a rerun).
func (e *Engine) SetFaults(f Faults) {
	e.mu.Lock()
	defer e.mu.Unlock()
	e.f = f
}

// Calls returns the calls received so far, in order.
func (e *Engine) Calls() []Call {
	e.mu.Lock()
	defer e.mu.Unlock()
	return append([]Call(nil), e.calls...)
}

// Routes returns Calls' Route()s.
func (e *Engine) Routes() []string {
	var out []string
	for _, c := range e.Calls() {
		out = append(out, c.Route())
	}
	return out
}

// Count returns how many calls went to path (any method and query).
func (e *Engine) Count(path string) int {
	n := 0
	for _, c := range e.Calls() {
		if c.Path == path {
			n++
		}
	}
	return n
}

// Paused reports whether the engine is paused.
func (e *Engine) Paused() bool {
	e.mu.Lock()
	defer e.mu.Unlock()
	return e.paused
}

// Version is the weights version the engine holds ("" when none), before
// WrongVersion.
func (e *Engine) Version() string {
	e.mu.Lock()
	defer e.mu.Unlock()
	return e.version
}

// Path is the model directory last loaded ("base" at start).
func (e *Engine) Path() string {
	e.mu.Lock()
	defer e.mu.Unlock()
	return e.path
}

// Reloads is how many reloads succeeded.
func (e *Engine) Reloads() int {
	e.mu.Lock()
	defer e.mu.Unlock()
	return e.reloads
}

// vllmControl reports whether path is a vLLM control route: 404 without
// dev mode.
func vllmControl(path string) bool {
	switch path {
	case "/pause", "/resume", "/is_paused", "/reset_prefix_cache", "/collective_rpc", "/update_weight_version", "/weight_info":
		return true
	}
	return false
}

func (e *Engine) serve(w http.ResponseWriter, r *http.Request) {
	raw, _ := io.ReadAll(r.Body)
	body := string(raw)
	e.mu.Lock()
	e.calls = append(e.calls, Call{Method: r.Method, Path: r.URL.Path, Query: r.URL.RawQuery, Body: body, Auth: r.Header.Get("Authorization")})
	f := e.f
	e.mu.Unlock()

	if f.Hang != "" && r.URL.Path == f.Hang {
		select {
		case <-r.Context().Done():
		case <-e.done:
		}
		return
	}
	if d := f.Slow[r.URL.Path]; d > 0 {
		select {
		case <-time.After(d):
		case <-r.Context().Done():
			return
		case <-e.done:
			return
		}
	}
	if f.APIKey != "" && r.Header.Get("Authorization") != "Bearer "+f.APIKey {
		reply(w, http.StatusUnauthorized, map[string]any{"error": "Unauthorized"})
		return
	}
	if e.sglang {
		e.serveSGLang(w, r, body, f)
		return
	}
	e.serveVLLM(w, r, body, f)
}

func (e *Engine) serveVLLM(w http.ResponseWriter, r *http.Request, body string, f Faults) {
	p := r.URL.Path
	if f.NoDevMode && vllmControl(p) {
		notFound(w)
		return
	}
	switch p {
	case "/health":
		if !method(w, r, http.MethodGet) {
			return
		}
		w.WriteHeader(http.StatusOK)
	case "/v1/models":
		if !method(w, r, http.MethodGet) {
			return
		}
		card := map[string]any{"id": "policy", "object": "model", "owned_by": "vllm", "root": e.Path(), "parent": nil, "max_model_len": 4096}
		if f.ModelsVersion {
			card["weight_version"] = e.reported(f)
		}
		reply(w, http.StatusOK, map[string]any{"object": "list", "data": []any{card}})
	case "/pause":
		if !method(w, r, http.MethodPost) {
			return
		}
		mode := r.URL.Query().Get("mode")
		if mode == "" {
			mode = "abort"
		}
		if mode != "abort" && mode != "wait" && mode != "keep" {
			reply(w, http.StatusBadRequest, map[string]any{"error": fmt.Sprintf("Invalid mode %q", mode)})
			return
		}
		e.setPaused(true)
		reply(w, http.StatusOK, map[string]any{"status": "paused"})
	case "/resume":
		if !method(w, r, http.MethodPost) {
			return
		}
		e.setPaused(false)
		reply(w, http.StatusOK, map[string]any{"status": "resumed"})
	case "/is_paused":
		if !method(w, r, http.MethodGet) {
			return
		}
		reply(w, http.StatusOK, map[string]any{"is_paused": e.Paused()})
	case "/reset_prefix_cache":
		if !method(w, r, http.MethodPost) {
			return
		}
		if e.flushRefused(f) {
			reply(w, http.StatusInternalServerError, map[string]any{"error": map[string]any{"message": "cannot reset the prefix cache while requests run", "type": "InternalServerError", "code": 500}})
			return
		}
		w.WriteHeader(http.StatusOK)
	case "/collective_rpc":
		if !method(w, r, http.MethodPost) {
			return
		}
		var req struct {
			Method string         `json:"method"`
			Kwargs map[string]any `json:"kwargs"`
		}
		if json.Unmarshal([]byte(body), &req) != nil || req.Method == "" {
			reply(w, http.StatusBadRequest, map[string]any{"detail": "body must be JSON with a method"})
			return
		}
		if req.Method != "reload_weights" {
			reply(w, http.StatusInternalServerError, map[string]any{"error": map[string]any{"message": fmt.Sprintf("worker has no method %q", req.Method), "code": 500}})
			return
		}
		path, _ := req.Kwargs["weights_path"].(string)
		if path == "" {
			reply(w, http.StatusBadRequest, map[string]any{"detail": "reload_weights needs kwargs.weights_path"})
			return
		}
		if f.ReloadStatus != 0 && f.ReloadStatus != http.StatusOK {
			reply(w, f.ReloadStatus, map[string]any{"error": map[string]any{"message": fmt.Sprintf("reload_weights from %s failed: injected", path), "code": f.ReloadStatus}})
			return
		}
		e.mu.Lock()
		e.path = path
		e.reloads++
		e.mu.Unlock()
		w.WriteHeader(http.StatusOK) // every worker returned None: empty body
	case "/update_weight_version":
		e.updateWeightVersion(w, r, body)
	case "/weight_info":
		if !method(w, r, http.MethodGet) {
			return
		}
		reply(w, http.StatusOK, map[string]any{"weight_version": e.reported(f)})
	default:
		notFound(w)
	}
}

func (e *Engine) serveSGLang(w http.ResponseWriter, r *http.Request, body string, f Faults) {
	switch r.URL.Path {
	case "/health", "/health_generate":
		w.WriteHeader(http.StatusOK)
	case "/pause_generation":
		if !method(w, r, http.MethodPost) {
			return
		}
		var req struct {
			Mode string `json:"mode"`
		}
		_ = json.Unmarshal([]byte(body), &req)
		switch req.Mode {
		case "", "abort", "retract", "in_place":
		default:
			reply(w, http.StatusBadRequest, map[string]any{"detail": fmt.Sprintf("invalid mode %q", req.Mode)})
			return
		}
		e.setPaused(true)
		reply(w, http.StatusOK, map[string]any{"message": "Generation paused successfully.", "status": "ok"})
	case "/continue_generation":
		if !method(w, r, http.MethodPost) {
			return
		}
		e.setPaused(false)
		reply(w, http.StatusOK, map[string]any{"message": "Generation continued successfully.", "status": "ok"})
	case "/flush_cache":
		if r.Method != http.MethodGet && r.Method != http.MethodPost {
			method(w, r, http.MethodGet)
			return
		}
		if e.flushRefused(f) {
			w.WriteHeader(http.StatusBadRequest)
			_, _ = w.Write([]byte("Cache not flushed. Please check backend logs for more details. (When there are running or waiting requests, the operation will not be performed.)"))
			return
		}
		w.WriteHeader(http.StatusOK)
		_, _ = w.Write([]byte("Cache flushed.\nPlease check backend logs for more details. (When there are running or waiting requests, the operation will not be performed.)\n"))
	case "/update_weights_from_disk":
		if !method(w, r, http.MethodPost) {
			return
		}
		var req struct {
			ModelPath     string  `json:"model_path"`
			WeightVersion *string `json:"weight_version"`
		}
		if err := json.Unmarshal([]byte(body), &req); err != nil || req.ModelPath == "" {
			reply(w, http.StatusBadRequest, map[string]any{"detail": "model_path is required (a string)"})
			return
		}
		switch {
		case f.ReloadSuccessFalse:
			reply(w, http.StatusOK, map[string]any{"success": false, "message": "Failed to update weights: injected", "num_paused_requests": 0})
			return
		case f.ReloadStatus == http.StatusBadRequest:
			reply(w, http.StatusBadRequest, map[string]any{"success": false, "message": fmt.Sprintf("Failed to get weights iterator: %s: injected", req.ModelPath), "num_paused_requests": 0})
			return
		case f.ReloadStatus != 0 && f.ReloadStatus != http.StatusOK:
			w.WriteHeader(f.ReloadStatus)
			_, _ = w.Write([]byte("Internal Server Error"))
			return
		}
		e.mu.Lock()
		e.path = req.ModelPath
		e.reloads++
		if req.WeightVersion != nil {
			e.version = *req.WeightVersion
		}
		e.mu.Unlock()
		reply(w, http.StatusOK, map[string]any{"success": true, "message": "Succeeded to update model weights.", "num_paused_requests": 0})
	case "/get_weight_version":
		if !method(w, r, http.MethodGet) {
			return
		}
		reply(w, http.StatusOK, map[string]any{"weight_version": e.reported(f)})
	case "/update_weight_version":
		e.updateWeightVersion(w, r, body)
	default:
		notFound(w)
	}
}

// updateWeightVersion is both engines' POST /update_weight_version
// {"new_version": str}: a non-string is 422, as pydantic answers.
func (e *Engine) updateWeightVersion(w http.ResponseWriter, r *http.Request, body string) {
	if !method(w, r, http.MethodPost) {
		return
	}
	var req struct {
		NewVersion json.RawMessage `json:"new_version"`
	}
	var v string
	if json.Unmarshal([]byte(body), &req) != nil || json.Unmarshal(req.NewVersion, &v) != nil {
		reply(w, http.StatusUnprocessableEntity, map[string]any{"detail": []any{map[string]any{"loc": []string{"body", "new_version"}, "msg": "Input should be a valid string"}}})
		return
	}
	e.mu.Lock()
	e.version = v
	e.mu.Unlock()
	reply(w, http.StatusOK, map[string]any{"status": "ok", "weight_version": v})
}

// reported is the version the engine reports: null when none.
func (e *Engine) reported(f Faults) any {
	if f.WrongVersion != "" {
		return f.WrongVersion
	}
	v := e.Version()
	if v == "" {
		return nil
	}
	return v
}

func (e *Engine) setPaused(p bool) {
	e.mu.Lock()
	defer e.mu.Unlock()
	e.paused = p
}

// flushRefused counts a flush and says whether it is one of the first
// FlushFailures.
func (e *Engine) flushRefused(f Faults) bool {
	e.mu.Lock()
	defer e.mu.Unlock()
	e.flushes++
	return e.flushes <= f.FlushFailures
}

func method(w http.ResponseWriter, r *http.Request, want string) bool {
	if r.Method == want {
		return true
	}
	reply(w, http.StatusMethodNotAllowed, map[string]any{"detail": "Method Not Allowed"})
	return false
}

func notFound(w http.ResponseWriter) {
	reply(w, http.StatusNotFound, map[string]any{"detail": "Not Found"})
}

func reply(w http.ResponseWriter, status int, v any) {
	b, _ := json.Marshal(v)
	w.Header().Set("Content-Type", "application/json")
	w.WriteHeader(status)
	_, _ = w.Write(b)
}
