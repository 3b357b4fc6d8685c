package enginectl_test

import (
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"log/slog"
	"net"
	"net/http"
	"net/http/httptest"
	"reflect"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/kilnrl/kiln/internal/enginectl"
	"github.com/kilnrl/kiln/internal/enginectl/enginectltest"
)

// fast are Options whose waits fit a unit test.
func fast(p enginectl.Protocol) enginectl.Options {
	return enginectl.Options{Protocol: p, CallTimeout: 5 * time.Second, RetryEvery: time.Millisecond}
}

func newFake(t *testing.T, p enginectl.Protocol, f enginectltest.Faults) *enginectltest.Engine {
	if p == enginectl.SGLang {
		return enginectltest.NewSGLang(t, f)
	}
	return enginectltest.NewVLLM(t, f)
}

func urls(es ...*enginectltest.Engine) []string {
	var out []string
	for _, e := range es {
		out = append(out, e.URL)
	}
	return out
}

func jsonEqual(t *testing.T, what, got, want string) {
	t.Helper()
	var g, w any
	if err := json.Unmarshal([]byte(got), &g); err != nil {
		t.Fatalf("%s: body %q is not JSON: %v", what, got, err)
	}
	if err := json.Unmarshal([]byte(want), &w); err != nil {
		t.Fatal(err)
	}
	if !reflect.DeepEqual(g, w) {
		t.Errorf("%s: body %s, want %s", what, got, want)
	}
}

// The vLLM sequence of docs/sync.md §3 (spec §5.1 item 12): pause keep
// without clearing the cache, the flush only when asked, reload from the
// path, the version recorded, read back (from the model card when it has
// one, else /weight_info), then resume.
func TestReloadVLLMCallOrder(t *testing.T) {
	for _, tc := range []struct {
		name          string
		flush         bool
		modelsVersion bool
		want          []string
	}{
		{"no flush, upstream model card", false, false, []string{
			"POST /pause?mode=keep&clear_cache=false",
			"POST /collective_rpc",
			"POST /update_weight_version",
			"GET /v1/models",
			"GET /weight_info",
			"POST /resume",
		}},
		{"flush, serve.py model card", true, true, []string{
			"POST /pause?mode=keep&clear_cache=false",
			"POST /reset_prefix_cache",
			"POST /collective_rpc",
			"POST /update_weight_version",
			"GET /v1/models",
			"POST /resume",
		}},
	} {
		t.Run(tc.name, func(t *testing.T) {
			e := enginectltest.NewVLLM(t, enginectltest.Faults{ModelsVersion: tc.modelsVersion})
			o := fast(enginectl.VLLM)
			o.Flush = tc.flush
			if err := enginectl.Reload(context.Background(), urls(e), "/ckpt/000007-abc", 7, o); err != nil {
				t.Fatalf("Reload: %v", err)
			}
			if got := e.Routes(); !reflect.DeepEqual(got, tc.want) {
				t.Errorf("calls:\n got  %q\n want %q", got, tc.want)
			}
			for _, c := range e.Calls() {
				switch c.Path {
				case "/collective_rpc":
					jsonEqual(t, c.Path, c.Body, `{"method":"reload_weights","kwargs":{"weights_path":"/ckpt/000007-abc","is_checkpoint_format":true}}`)
				case "/update_weight_version":
					jsonEqual(t, c.Path, c.Body, `{"new_version":"7"}`)
				}
			}
			if e.Paused() || e.Version() != "7" || e.Path() != "/ckpt/000007-abc" {
				t.Errorf("engine after reload: paused %v version %q path %q, want resumed at 7 from /ckpt/000007-abc", e.Paused(), e.Version(), e.Path())
			}
		})
	}
}

// The SGLang sequence of docs/sync.md §3 (spec §5.1 item 13).
func TestReloadSGLangCallOrder(t *testing.T) {
	e := enginectltest.NewSGLang(t, enginectltest.Faults{})
	if err := enginectl.Reload(context.Background(), urls(e), "/ckpt/v3", 3, fast(enginectl.SGLang)); err != nil {
		t.Fatalf("Reload: %v", err)
	}
	want := []string{
		"POST /pause_generation",
		"GET /flush_cache",
		"POST /update_weights_from_disk",
		"GET /get_weight_version",
		"POST /continue_generation",
	}
	if got := e.Routes(); !reflect.DeepEqual(got, want) {
		t.Errorf("calls:\n got  %q\n want %q", got, want)
	}
	c := e.Calls()
	jsonEqual(t, "pause_generation", c[0].Body, `{"mode":"in_place"}`)
	jsonEqual(t, "update_weights_from_disk", c[2].Body, `{"model_path":"/ckpt/v3","weight_version":"3"}`)
	jsonEqual(t, "continue_generation", c[4].Body, `{}`)
	if e.Paused() || e.Version() != "3" || e.Path() != "/ckpt/v3" {
		t.Errorf("engine after reload: paused %v version %q path %q", e.Paused(), e.Version(), e.Path())
	}
}

// A refused flush is retried RetryEvery apart up to Retries times; past
// that the reload fails before any engine loads, and stays paused.
func TestFlushRetries(t *testing.T) {
	for _, p := range []enginectl.Protocol{enginectl.VLLM, enginectl.SGLang} {
		flushRoute, reloadRoute := "/reset_prefix_cache", "/collective_rpc"
		if p == enginectl.SGLang {
			flushRoute, reloadRoute = "/flush_cache", "/update_weights_from_disk"
		}
		t.Run(string(p)+"/recovers", func(t *testing.T) {
			e := newFake(t, p, enginectltest.Faults{FlushFailures: 3})
			o := fast(p)
			o.Flush, o.Retries = true, 5
			if err := enginectl.Reload(context.Background(), urls(e), "/w", 1, o); err != nil {
				t.Fatalf("Reload: %v", err)
			}
			if n := e.Count(flushRoute); n != 4 {
				t.Errorf("%s called %d times, want 4 (3 refusals, then success)", flushRoute, n)
			}
			if e.Paused() {
				t.Error("engine left paused after a successful reload")
			}
		})
		t.Run(string(p)+"/gives up", func(t *testing.T) {
			e := newFake(t, p, enginectltest.Faults{FlushFailures: 100})
			o := fast(p)
			o.Flush, o.Retries = true, 4
			err := enginectl.Reload(context.Background(), urls(e), "/w", 1, o)
			var fe *enginectl.FleetError
			if !errors.As(err, &fe) {
				t.Fatalf("Reload = %v, want a *FleetError", err)
			}
			if n := e.Count(flushRoute); n != 4 {
				t.Errorf("%s called %d times, want Retries = 4", flushRoute, n)
			}
			if !strings.Contains(err.Error(), "4 times") || !strings.Contains(err.Error(), e.URL) {
				t.Errorf("error %q should name the engine and the 4 attempts", err)
			}
			if e.Count(reloadRoute) != 0 || !e.Paused() {
				t.Errorf("after a failed flush: %d reloads, paused %v; want none and paused", e.Count(reloadRoute), e.Paused())
			}
		})
	}
}

// resumes counts the resume calls a fleet received.
func resumes(es ...*enginectltest.Engine) int {
	n := 0
	for _, e := range es {
		n += e.Count("/resume") + e.Count("/continue_generation")
	}
	return n
}

// One engine of three fails to load: the error says which and why, names
// the two that did reload, and no engine is resumed (the stay-paused policy
// of docs/sync.md §3; spec §5.1 items 12, 13).
func TestFailedReloadStaysPaused(t *testing.T) {
	for _, tc := range []struct {
		name string
		p    enginectl.Protocol
		f    enginectltest.Faults
		want string // in the failing engine's error
	}{
		{"vllm 400", enginectl.VLLM, enginectltest.Faults{ReloadStatus: 400}, "HTTP 400: reload_weights from /w/5 failed: injected"},
		{"vllm 500", enginectl.VLLM, enginectltest.Faults{ReloadStatus: 500}, "HTTP 500: reload_weights from /w/5 failed: injected"},
		{"sglang 400", enginectl.SGLang, enginectltest.Faults{ReloadStatus: 400}, "HTTP 400: Failed to get weights iterator: /w/5: injected"},
		{"sglang success false", enginectl.SGLang, enginectltest.Faults{ReloadSuccessFalse: true}, "success: false): Failed to update weights: injected"},
		{"sglang 500", enginectl.SGLang, enginectltest.Faults{ReloadStatus: 500}, "HTTP 500: Internal Server Error"},
		{"vllm wrong version", enginectl.VLLM, enginectltest.Faults{WrongVersion: "4"}, `reports weights version "4" after the reload, want "5"`},
		{"sglang wrong version", enginectl.SGLang, enginectltest.Faults{WrongVersion: "4"}, `reports weights version "4" after the reload, want "5"`},
	} {
		t.Run(tc.name, func(t *testing.T) {
			a := newFake(t, tc.p, enginectltest.Faults{})
			bad := newFake(t, tc.p, tc.f)
			c := newFake(t, tc.p, enginectltest.Faults{})
			err := enginectl.Reload(context.Background(), urls(a, bad, c), "/w/5", 5, fast(tc.p))
			var fe *enginectl.FleetError
			if !errors.As(err, &fe) {
				t.Fatalf("Reload = %v, want a *FleetError", err)
			}
			if n := resumes(a, bad, c); n != 0 {
				t.Errorf("%d resume calls after a failed reload, want none on any engine", n)
			}
			for _, e := range []*enginectltest.Engine{a, bad, c} {
				if !e.Paused() {
					t.Errorf("engine %s resumed, want every engine paused", e.URL)
				}
			}
			failed := fe.Failed()
			if len(failed) != 1 || failed[0].URL != bad.URL {
				t.Fatalf("failed engines %+v, want only %s", failed, bad.URL)
			}
			if !strings.Contains(failed[0].Err.Error(), tc.want) {
				t.Errorf("engine error %q, want it to contain %q", failed[0].Err, tc.want)
			}
			msg := err.Error()
			if !strings.Contains(msg, bad.URL+": ") || !strings.Contains(msg, tc.want) {
				t.Errorf("error %q should name %s and say why", msg, bad.URL)
			}
			if !strings.Contains(msg, "reloaded and verified, left paused: "+a.URL+", "+c.URL) {
				t.Errorf("error %q should name the engines that reloaded (%s, %s)", msg, a.URL, c.URL)
			}
			if !strings.Contains(msg, "no engine was resumed") {
				t.Errorf("error %q should say no engine was resumed", msg)
			}
		})
	}
}

// Two of three engines fail, differently: each is reported with its
// phase, and the engine that reloaded is named.
func TestFleetErrorReportsEachEngine(t *testing.T) {
	ok := enginectltest.NewVLLM(t, enginectltest.Faults{})
	broken := enginectltest.NewVLLM(t, enginectltest.Faults{ReloadStatus: 500})
	stale := enginectltest.NewVLLM(t, enginectltest.Faults{WrongVersion: "8"})
	err := enginectl.Reload(context.Background(), urls(ok, broken, stale), "/w/9", 9, fast(enginectl.VLLM))
	var fe *enginectl.FleetError
	if !errors.As(err, &fe) {
		t.Fatalf("Reload = %v, want a *FleetError", err)
	}
	want := []struct {
		url   string
		phase enginectl.Phase
		ok    bool
	}{{ok.URL, enginectl.PhaseVerify, true}, {broken.URL, enginectl.PhaseReload, false}, {stale.URL, enginectl.PhaseVerify, false}}
	for i, w := range want {
		got := fe.Engines[i]
		if got.URL != w.url || got.Phase != w.phase || (got.Err == nil) != w.ok || got.Reloaded() != w.ok {
			t.Errorf("engine %d: %+v, want URL %s phase %s ok %v", i, got, w.url, w.phase, w.ok)
		}
	}
	msg := err.Error()
	for _, s := range []string{
		"failed on 2 of 3 engines",
		broken.URL + ": reload: POST " + broken.URL + "/collective_rpc: HTTP 500",
		stale.URL + `: verify: engine ` + stale.URL + ` reports weights version "8"`,
		"left paused: " + ok.URL,
	} {
		if !strings.Contains(msg, s) {
			t.Errorf("error lacks %q:\n%s", s, msg)
		}
	}
	if resumes(ok, broken, stale) != 0 {
		t.Error("an engine was resumed")
	}
}

// holdListener accepts connections and never writes a byte: an engine
// that is up at the TCP level and wedged above it.
func holdListener(t *testing.T) string {
	t.Helper()
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	var mu sync.Mutex
	var conns []net.Conn
	go func() {
		for {
			c, err := ln.Accept()
			if err != nil {
				return
			}
			mu.Lock()
			conns = append(conns, c)
			mu.Unlock()
		}
	}()
	t.Cleanup(func() {
		ln.Close()
		mu.Lock()
		defer mu.Unlock()
		for _, c := range conns {
			c.Close()
		}
	})
	return "http://" + ln.Addr().String()
}

// within runs f and fails the test if it has not returned after d, so a
// missing deadline fails rather than hangs the test binary.
func within(t *testing.T, d time.Duration, f func() error) error {
	t.Helper()
	done := make(chan error, 1)
	go func() { done <- f() }()
	select {
	case err := <-done:
		return err
	case <-time.After(d):
		t.Fatalf("still waiting after %s: a call has no deadline", d)
		return nil
	}
}

// An engine that accepts the connection and never answers fails at its
// deadline, named by URL, and the healthy engine stays paused.
func TestNeverAnsweringEngine(t *testing.T) {
	const callTimeout = 300 * time.Millisecond
	const margin = 1500 * time.Millisecond

	t.Run("raw listener, per-call deadline", func(t *testing.T) {
		ok := enginectltest.NewVLLM(t, enginectltest.Faults{})
		dead := holdListener(t)
		o := fast(enginectl.VLLM)
		o.CallTimeout = callTimeout
		start := time.Now()
		err := within(t, callTimeout+margin, func() error {
			return enginectl.Reload(context.Background(), []string{ok.URL, dead}, "/w", 2, o)
		})
		elapsed := time.Since(start)
		if elapsed > callTimeout+margin {
			t.Errorf("Reload took %s, want under the call timeout %s + %s", elapsed, callTimeout, margin)
		}
		var fe *enginectl.FleetError
		if !errors.As(err, &fe) || len(fe.Failed()) != 1 || fe.Failed()[0].URL != dead {
			t.Fatalf("Reload = %v, want a FleetError naming %s alone", err, dead)
		}
		if !errors.Is(err, context.DeadlineExceeded) || !strings.Contains(err.Error(), "POST "+dead+"/pause") || !strings.Contains(err.Error(), "no answer within 300ms") {
			t.Errorf("error %q should name %s/pause and its deadline", err, dead)
		}
		if resumes(ok) != 0 || ok.Count("/collective_rpc") != 0 || !ok.Paused() {
			t.Errorf("healthy engine: calls %q; want paused, not reloaded, not resumed", ok.Routes())
		}
	})

	t.Run("raw listener, ServedVersion", func(t *testing.T) {
		dead := holdListener(t)
		o := fast(enginectl.SGLang)
		o.CallTimeout = callTimeout
		start := time.Now()
		err := within(t, callTimeout+margin, func() error {
			_, err := enginectl.ServedVersion(context.Background(), dead, o)
			return err
		})
		if elapsed := time.Since(start); elapsed > callTimeout+margin {
			t.Errorf("ServedVersion took %s, want under %s + %s", elapsed, callTimeout, margin)
		}
		if err == nil || !strings.Contains(err.Error(), dead+"/get_weight_version") {
			t.Errorf("ServedVersion = %v, want an error naming %s", err, dead)
		}
	})

	// The load itself has no per-call deadline (a large model takes
	// minutes): the reload's context bounds it.
	t.Run("reload route bounded by ctx", func(t *testing.T) {
		ok := enginectltest.NewSGLang(t, enginectltest.Faults{})
		hung := enginectltest.NewSGLang(t, enginectltest.Faults{Hang: "/update_weights_from_disk"})
		o := fast(enginectl.SGLang)
		o.CallTimeout = time.Minute
		ctx, cancel := context.WithTimeout(context.Background(), callTimeout)
		defer cancel()
		start := time.Now()
		err := enginectl.Reload(ctx, urls(ok, hung), "/w", 2, o)
		if elapsed := time.Since(start); elapsed > callTimeout+margin {
			t.Errorf("Reload took %s, want under the reload deadline %s + %s", elapsed, callTimeout, margin)
		}
		if err == nil || !strings.Contains(err.Error(), "POST "+hung.URL+"/update_weights_from_disk: no answer before the reload's deadline") {
			t.Errorf("Reload = %v, want the hung engine named with the reload's deadline", err)
		}
		if resumes(ok, hung) != 0 {
			t.Error("an engine was resumed")
		}
	})

	// A reload slower than CallTimeout is not cut short by it.
	t.Run("slow reload outlives CallTimeout", func(t *testing.T) {
		for _, p := range []enginectl.Protocol{enginectl.VLLM, enginectl.SGLang} {
			route := "/collective_rpc"
			if p == enginectl.SGLang {
				route = "/update_weights_from_disk"
			}
			e := newFake(t, p, enginectltest.Faults{Slow: map[string]time.Duration{route: 3 * callTimeout}})
			o := fast(p)
			o.CallTimeout = callTimeout
			if err := enginectl.Reload(context.Background(), urls(e), "/w", 2, o); err != nil {
				t.Errorf("%s: a reload taking 3x CallTimeout failed: %v", p, err)
			}
		}
	})

	// Every other control call has CallTimeout even when ctx has none.
	t.Run("verify bounded by CallTimeout", func(t *testing.T) {
		hung := enginectltest.NewVLLM(t, enginectltest.Faults{Hang: "/v1/models"})
		o := fast(enginectl.VLLM)
		o.CallTimeout = callTimeout
		start := time.Now()
		err := within(t, callTimeout+margin, func() error {
			return enginectl.Reload(context.Background(), urls(hung), "/w", 2, o)
		})
		if elapsed := time.Since(start); elapsed > callTimeout+margin {
			t.Errorf("Reload took %s, want under %s + %s", elapsed, callTimeout, margin)
		}
		if err == nil || !strings.Contains(err.Error(), "GET "+hung.URL+"/v1/models: no answer within 300ms") {
			t.Errorf("Reload = %v, want the hung route named", err)
		}
	})
}

// A vLLM without dev mode answers 404 on the control routes: the error
// says what to set.
func TestNoDevMode(t *testing.T) {
	e := enginectltest.NewVLLM(t, enginectltest.Faults{NoDevMode: true})
	err := enginectl.Reload(context.Background(), urls(e), "/w", 1, fast(enginectl.VLLM))
	if err == nil || !strings.Contains(err.Error(), "POST "+e.URL+"/pause?mode=keep&clear_cache=false: HTTP 404") || !strings.Contains(err.Error(), "VLLM_SERVER_DEV_MODE=1") {
		t.Errorf("Reload = %v, want a 404 on /pause saying VLLM_SERVER_DEV_MODE=1", err)
	}
	_, err = enginectl.ServedVersion(context.Background(), e.URL, fast(enginectl.VLLM))
	if err == nil || !strings.Contains(err.Error(), "reports no weights version") || !strings.Contains(err.Error(), "VLLM_SERVER_DEV_MODE=1") {
		t.Errorf("ServedVersion = %v, want 'reports no weights version' naming VLLM_SERVER_DEV_MODE=1", err)
	}
}

// The API key goes on every call, reload and version query alike.
func TestAPIKey(t *testing.T) {
	for _, p := range []enginectl.Protocol{enginectl.VLLM, enginectl.SGLang} {
		t.Run(string(p), func(t *testing.T) {
			e := newFake(t, p, enginectltest.Faults{APIKey: "sekret"})
			o := fast(p)
			o.APIKey, o.Flush = "sekret", true
			if err := enginectl.Reload(context.Background(), urls(e), "/w", 1, o); err != nil {
				t.Fatalf("Reload: %v", err)
			}
			if _, err := enginectl.ServedVersion(context.Background(), e.URL, o); err != nil {
				t.Fatalf("ServedVersion: %v", err)
			}
			for _, c := range e.Calls() {
				if c.Auth != "Bearer sekret" {
					t.Errorf("%s sent Authorization %q", c.Route(), c.Auth)
				}
			}
			o.APIKey = "wrong"
			err := enginectl.Reload(context.Background(), urls(e), "/w", 2, o)
			if err == nil || !strings.Contains(err.Error(), "HTTP 401") || !strings.Contains(err.Error(), "--api-key") {
				t.Errorf("Reload with a wrong key = %v, want a 401 pointing at --api-key", err)
			}
		})
	}
}

// A rerun of a reload the fleet already completed reloads again and
// resumes; a rerun after a failure (the engine healed) completes it and
// resumes the whole fleet.
func TestRerunIdempotent(t *testing.T) {
	for _, p := range []enginectl.Protocol{enginectl.VLLM, enginectl.SGLang} {
		t.Run(string(p), func(t *testing.T) {
			a := newFake(t, p, enginectltest.Faults{})
			b := newFake(t, p, enginectltest.Faults{ReloadStatus: 500})
			o := fast(p)
			if err := enginectl.Reload(context.Background(), urls(a, b), "/w/6", 6, o); err == nil {
				t.Fatal("Reload with a broken engine succeeded")
			}
			b.SetFaults(enginectltest.Faults{})
			for run := 1; run <= 2; run++ {
				if err := enginectl.Reload(context.Background(), urls(a, b), "/w/6", 6, o); err != nil {
					t.Fatalf("run %d: %v", run, err)
				}
				for _, e := range []*enginectltest.Engine{a, b} {
					if e.Paused() || e.Version() != "6" {
						t.Errorf("run %d: %s paused %v version %q, want resumed at 6", run, e.URL, e.Paused(), e.Version())
					}
				}
			}
			if a.Reloads() != 3 || b.Reloads() != 2 {
				t.Errorf("reloads: %d and %d, want 3 and 2 (every run reloads)", a.Reloads(), b.Reloads())
			}
			if resumes(a) != 2 || resumes(b) != 2 {
				t.Errorf("resumes: %d and %d, want 2 each (the completed runs)", resumes(a), resumes(b))
			}
		})
	}
}

// An engine whose resume fails after every engine verified: the others
// are resumed (they all serve the new version) and the error says so.
func TestResumeFailure(t *testing.T) {
	a := enginectltest.NewVLLM(t, enginectltest.Faults{})
	b := enginectltest.NewVLLM(t, enginectltest.Faults{Hang: "/resume"})
	o := fast(enginectl.VLLM)
	o.CallTimeout = 200 * time.Millisecond
	err := within(t, 2*time.Second, func() error { return enginectl.Reload(context.Background(), urls(a, b), "/w", 3, o) })
	var fe *enginectl.FleetError
	if !errors.As(err, &fe) || len(fe.Failed()) != 1 || fe.Failed()[0].Phase != enginectl.PhaseResume {
		t.Fatalf("Reload = %v, want %s failing at resume", err, b.URL)
	}
	if fe.Engines[0].Phase != enginectl.PhaseResumed || a.Paused() {
		t.Errorf("healthy engine: %+v paused %v, want resumed", fe.Engines[0], a.Paused())
	}
	if !strings.Contains(err.Error(), "resumed on weights 3: "+a.URL) {
		t.Errorf("error %q should name the resumed engine", err)
	}
}

// ServedVersion reads each protocol's report (docs/sync.md §5), integers
// and strings alike, and says so when there is none.
func TestServedVersion(t *testing.T) {
	raw := func(routes map[string]string) string {
		srv := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
			b, ok := routes[r.URL.Path]
			if !ok {
				w.WriteHeader(http.StatusNotFound)
				fmt.Fprint(w, `{"detail":"Not Found"}`)
				return
			}
			fmt.Fprint(w, b)
		}))
		t.Cleanup(srv.Close)
		return srv.URL
	}
	for _, tc := range []struct {
		name    string
		p       enginectl.Protocol
		routes  map[string]string
		want    string
		wantErr string
	}{
		{"vllm card int (serve.py)", enginectl.VLLM, map[string]string{"/v1/models": `{"data":[{"id":"m","weight_version":12}]}`}, "12", ""},
		{"vllm card string", enginectl.VLLM, map[string]string{"/v1/models": `{"data":[{"id":"m","weight_version":"12"}]}`}, "12", ""},
		{"vllm weight_info", enginectl.VLLM, map[string]string{"/v1/models": `{"data":[{"id":"m"}]}`, "/weight_info": `{"weight_version":"4"}`}, "4", ""},
		{"vllm weight_info int", enginectl.VLLM, map[string]string{"/v1/models": `{"data":[{"id":"m","weight_version":null}]}`, "/weight_info": `{"weight_version":4}`}, "4", ""},
		{"vllm none", enginectl.VLLM, map[string]string{"/v1/models": `{"data":[{"id":"m"}]}`, "/weight_info": `{"weight_version":null}`}, "", "reports no weights version"},
		{"vllm no weight_info", enginectl.VLLM, map[string]string{"/v1/models": `{"data":[{"id":"m"}]}`}, "", "reports no weights version"},
		{"sglang", enginectl.SGLang, map[string]string{"/get_weight_version": `{"weight_version":"9"}`}, "9", ""},
		{"sglang none", enginectl.SGLang, map[string]string{"/get_weight_version": `{"weight_version":null}`}, "", "reports no weights version"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			u := raw(tc.routes)
			got, err := enginectl.ServedVersion(context.Background(), u, fast(tc.p))
			if tc.wantErr != "" {
				if err == nil || !strings.Contains(err.Error(), tc.wantErr) || !strings.Contains(err.Error(), u) {
					t.Errorf("ServedVersion = %q, %v; want an error naming %s containing %q", got, err, u, tc.wantErr)
				}
				return
			}
			if err != nil || got != tc.want {
				t.Errorf("ServedVersion = %q, %v; want %q", got, err, tc.want)
			}
		})
	}
	// And on the fakes after a reload.
	for _, p := range []enginectl.Protocol{enginectl.VLLM, enginectl.SGLang} {
		e := newFake(t, p, enginectltest.Faults{})
		if _, err := enginectl.ServedVersion(context.Background(), e.URL, fast(p)); err == nil || !strings.Contains(err.Error(), "reports no weights version") {
			t.Errorf("%s before any reload: %v, want 'reports no weights version'", p, err)
		}
		if err := enginectl.Reload(context.Background(), urls(e), "/w", 11, fast(p)); err != nil {
			t.Fatal(err)
		}
		if v, err := enginectl.ServedVersion(context.Background(), e.URL, fast(p)); err != nil || v != "11" {
			t.Errorf("%s after reload: %q, %v; want 11", p, v, err)
		}
	}
}

// Logs name each engine and phase with its duration.
func TestLogs(t *testing.T) {
	e := enginectltest.NewSGLang(t, enginectltest.Faults{})
	var buf bytes.Buffer
	o := fast(enginectl.SGLang)
	o.Log = slog.New(slog.NewTextHandler(&buf, nil))
	if err := enginectl.Reload(context.Background(), urls(e), "/w", 1, o); err != nil {
		t.Fatal(err)
	}
	for _, p := range []string{"pause", "flush", "reload", "verify", "resume"} {
		if !strings.Contains(buf.String(), "engine="+e.URL+" phase="+p+" took=") {
			t.Errorf("log lacks engine %s phase %s with a duration:\n%s", e.URL, p, buf.String())
		}
	}
}

func TestParseProtocol(t *testing.T) {
	for in, want := range map[string]enginectl.Protocol{"vllm": enginectl.VLLM, "VLLM": enginectl.VLLM, " sglang ": enginectl.SGLang} {
		if got, err := enginectl.ParseProtocol(in); err != nil || got != want {
			t.Errorf("ParseProtocol(%q) = %q, %v; want %q", in, got, err, want)
		}
	}
	if _, err := enginectl.ParseProtocol("tgi"); err == nil || !strings.Contains(err.Error(), `"tgi"`) {
		t.Errorf("ParseProtocol(tgi) = %v, want an error naming it", err)
	}
}

// Bad input fails before any engine is called.
func TestReloadRejectsBadInput(t *testing.T) {
	e := enginectltest.NewVLLM(t, enginectltest.Faults{})
	for _, tc := range []struct {
		name    string
		engines []string
		path    string
		version int64
		o       enginectl.Options
		want    string
	}{
		{"no engines", nil, "/w", 1, fast(enginectl.VLLM), "at least one engine"},
		{"no path", urls(e), "", 1, fast(enginectl.VLLM), "--path"},
		{"negative version", urls(e), "/w", -1, fast(enginectl.VLLM), "negative"},
		{"bad url", []string{"localhost:8000"}, "/w", 1, fast(enginectl.VLLM), `"localhost:8000"`},
		{"duplicate", []string{e.URL, e.URL + "/"}, "/w", 1, fast(enginectl.VLLM), "given twice"},
		{"protocol", urls(e), "/w", 1, enginectl.Options{Protocol: "tgi"}, `"tgi"`},
	} {
		t.Run(tc.name, func(t *testing.T) {
			err := enginectl.Reload(context.Background(), tc.engines, tc.path, tc.version, tc.o)
			if err == nil || !strings.Contains(err.Error(), tc.want) {
				t.Errorf("Reload = %v, want an error containing %q", err, tc.want)
			}
			var fe *enginectl.FleetError
			if errors.As(err, &fe) {
				t.Errorf("bad input gave a FleetError: %v", err)
			}
		})
	}
	if n := len(e.Calls()); n != 0 {
		t.Errorf("%d calls reached the engine", n)
	}
}
