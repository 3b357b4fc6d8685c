package enginectl

import (
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"log/slog"
	"net/http"
	"net/url"
	"strconv"
	"strings"
	"sync"
	"time"
)

// Defaults of Options (docs/sync.md §3).
const (
	DefaultCallTimeout = 60 * time.Second
	DefaultRetries     = 60
	DefaultRetryEvery  = time.Second
)

// ParseProtocol parses a --protocol value: "vllm" (also kiln's serve.py)
// or "sglang", in any case.
func ParseProtocol(s string) (Protocol, error) {
	switch Protocol(strings.ToLower(strings.TrimSpace(s))) {
	case VLLM:
		return VLLM, nil
	case SGLang:
		return SGLang, nil
	}
	return "", fmt.Errorf("enginectl: unknown engine protocol %q: use %q (vLLM, kiln's serve.py) or %q", s, VLLM, SGLang)
}

// Phase is a step of one engine's reload (docs/sync.md §3), in order.
type Phase string

const (
	PhasePause   Phase = "pause"   // vLLM /pause, SGLang /pause_generation
	PhaseFlush   Phase = "flush"   // vLLM /reset_prefix_cache, SGLang /flush_cache
	PhaseReload  Phase = "reload"  // vLLM /collective_rpc + /update_weight_version, SGLang /update_weights_from_disk
	PhaseVerify  Phase = "verify"  // the engine reports the new version
	PhaseResume  Phase = "resume"  // vLLM /resume, SGLang /continue_generation
	PhaseResumed Phase = "resumed" // done: serving the new version
)

// EngineOutcome is one engine's outcome in a fleet reload. Phase is the
// step the engine failed at when Err is set; otherwise the last step it
// completed (PhaseVerify: reloaded and verified, still paused;
// PhaseResumed: done).
type EngineOutcome struct {
	URL   string
	Phase Phase
	Err   error
}

// Reloaded reports whether the engine reloaded and showed the new version.
func (o EngineOutcome) Reloaded() bool {
	return o.Err == nil && (o.Phase == PhaseVerify || o.Phase == PhaseResumed)
}

// FleetError is a failed fleet reload: every engine's outcome, in the
// order of the engines given to Reload. Unless an engine failed at its
// resume (after every engine had verified), no engine was resumed: the
// stay-paused policy of docs/sync.md §3.
type FleetError struct {
	Path    string
	Version int64
	Engines []EngineOutcome
}

// Failed returns the outcomes of the engines that failed.
func (e *FleetError) Failed() []EngineOutcome {
	var out []EngineOutcome
	for _, o := range e.Engines {
		if o.Err != nil {
			out = append(out, o)
		}
	}
	return out
}

// Error lists each failing engine by URL and why, then names the engines
// that did reload, and says what to do next.
func (e *FleetError) Error() string {
	var b strings.Builder
	failed := e.Failed()
	var reloaded, resumed []string
	for _, o := range e.Engines {
		switch {
		case o.Err != nil:
		case o.Phase == PhaseResumed:
			resumed = append(resumed, o.URL)
		case o.Phase == PhaseVerify:
			reloaded = append(reloaded, o.URL)
		}
	}
	fmt.Fprintf(&b, "enginectl: reload of %q as weights %d failed on %d of %d engines", e.Path, e.Version, len(failed), len(e.Engines))
	for _, o := range failed {
		fmt.Fprintf(&b, "\n  %s: %s: %v", o.URL, o.Phase, o.Err)
	}
	if len(reloaded) > 0 {
		fmt.Fprintf(&b, "\n  reloaded and verified, left paused: %s", strings.Join(reloaded, ", "))
	} else {
		b.WriteString("\n  no engine reloaded")
	}
	if len(resumed) > 0 {
		fmt.Fprintf(&b, "\n  resumed on weights %d: %s; resume the failing engines by hand or rerun the same reload", e.Version, strings.Join(resumed, ", "))
	} else {
		b.WriteString("\n  no engine was resumed (the fleet stays paused, docs/sync.md §3): fix the failing engines and rerun the same reload, which completes it and resumes the fleet")
	}
	return b.String()
}

// Unwrap gives errors.Is and errors.As every engine's error.
func (e *FleetError) Unwrap() []error {
	var errs []error
	for _, o := range e.Engines {
		if o.Err != nil {
			errs = append(errs, o.Err)
		}
	}
	return errs
}

// withDefaults fills Options' zero values. An empty Protocol is vLLM.
func (o Options) withDefaults() (Options, error) {
	if o.Protocol == "" {
		o.Protocol = VLLM
	}
	if o.Protocol != VLLM && o.Protocol != SGLang {
		return o, fmt.Errorf("enginectl: unknown engine protocol %q: use %q or %q (ParseProtocol reads a flag)", o.Protocol, VLLM, SGLang)
	}
	if o.Client == nil {
		// Deadlines come from contexts (doc.go), so no Client.Timeout.
		o.Client = &http.Client{}
	}
	if o.CallTimeout <= 0 {
		o.CallTimeout = DefaultCallTimeout
	}
	if o.Retries <= 0 {
		o.Retries = DefaultRetries
	}
	if o.RetryEvery <= 0 {
		o.RetryEvery = DefaultRetryEvery
	}
	if o.Log == nil {
		o.Log = slog.New(slog.DiscardHandler)
	}
	return o, nil
}

// baseURL checks an engine URL (http or https, a host, no query) and
// returns it without a trailing slash.
func baseURL(engine string) (string, error) {
	u, err := url.Parse(engine)
	if err != nil || (u.Scheme != "http" && u.Scheme != "https") || u.Host == "" || u.RawQuery != "" || u.Fragment != "" {
		return "", fmt.Errorf("enginectl: engine URL %q: want http://HOST:PORT (the engine's base URL, as in --engine)", engine)
	}
	return strings.TrimRight(engine, "/"), nil
}

// Reload: see doc.go. The steps per protocol are docs/sync.md §3's. The
// fleet moves phase by phase: all engines are paused (and flushed), then
// all reload in parallel, then all are checked; they are resumed only when
// every engine reports version. Any failure leaves every engine paused and
// returns a *FleetError; a rerun (the steps are idempotent) completes it.
func Reload(ctx context.Context, engines []string, path string, version int64, o Options) error {
	o, err := o.withDefaults()
	if err != nil {
		return err
	}
	if len(engines) == 0 {
		return errors.New("enginectl: reload needs at least one engine URL (--engine)")
	}
	if path == "" {
		return errors.New("enginectl: reload needs the model directory the engines load (--path)")
	}
	if version < 0 {
		return fmt.Errorf("enginectl: weights version %d is negative: give the weights number N of the pulled version (--version)", version)
	}
	bases := make([]string, len(engines))
	seen := map[string]bool{}
	for i, e := range engines {
		b, err := baseURL(e)
		if err != nil {
			return err
		}
		if seen[b] {
			return fmt.Errorf("enginectl: engine %q given twice: give each engine once", e)
		}
		seen[b] = true
		bases[i] = b
	}

	want := strconv.FormatInt(version, 10)
	out := make([]EngineOutcome, len(bases))
	for i, b := range bases {
		out[i] = EngineOutcome{URL: b}
	}
	c := &ctl{o: o}
	start := time.Now()
	o.Log.Info("reload starting", "engines", len(bases), "protocol", string(o.Protocol), "path", path, "version", version, "flush", o.Flush)

	// step runs f on every engine still without error, in parallel,
	// recording the phase and its outcome; it reports whether all succeeded.
	step := func(p Phase, f func(ctx context.Context, base string) error) bool {
		var wg sync.WaitGroup
		for i := range out {
			if out[i].Err != nil {
				continue
			}
			wg.Add(1)
			go func(oc *EngineOutcome) {
				defer wg.Done()
				t0 := time.Now()
				err := f(ctx, oc.URL)
				d := time.Since(t0).Round(time.Millisecond)
				if err != nil {
					oc.Phase, oc.Err = p, err
					o.Log.Error("engine step failed", "engine", oc.URL, "phase", string(p), "took", d, "err", err)
					return
				}
				oc.Phase = p
				o.Log.Info("engine step done", "engine", oc.URL, "phase", string(p), "took", d)
			}(&out[i])
		}
		wg.Wait()
		for _, oc := range out {
			if oc.Err != nil {
				return false
			}
		}
		return true
	}
	fail := func() error {
		o.Log.Error("reload failed; no engine resumed (stay-paused policy)", "version", version, "took", time.Since(start).Round(time.Millisecond))
		return &FleetError{Path: path, Version: version, Engines: out}
	}

	// Pause (and flush) every engine before any reloads: nothing may
	// generate while another engine serves other weights.
	if !step(PhasePause, c.pause) {
		return fail()
	}
	// SGLang is always flushed; vLLM when asked (docs/sync.md §3).
	if (o.Flush || o.Protocol == SGLang) && !step(PhaseFlush, c.flush) {
		return fail()
	}
	// Reload and verify the engines that got this far even when one
	// failed, so the error names the ones that did reload.
	step(PhaseReload, func(ctx context.Context, base string) error { return c.reload(ctx, base, path, want) })
	step(PhaseVerify, func(ctx context.Context, base string) error { return c.verify(ctx, base, want) })
	for _, oc := range out {
		if oc.Err != nil {
			return fail()
		}
	}
	// Every engine serves version: resume them all.
	if !step(PhaseResume, c.resume) {
		for i := range out {
			if out[i].Err == nil {
				out[i].Phase = PhaseResumed
			}
		}
		return fail()
	}
	for i := range out {
		out[i].Phase = PhaseResumed
	}
	o.Log.Info("reload done", "engines", len(bases), "version", version, "took", time.Since(start).Round(time.Millisecond))
	return nil
}

// ServedVersion: see doc.go (docs/sync.md §5).
func ServedVersion(ctx context.Context, engine string, o Options) (string, error) {
	o, err := o.withDefaults()
	if err != nil {
		return "", err
	}
	b, err := baseURL(engine)
	if err != nil {
		return "", err
	}
	return (&ctl{o: o}).served(ctx, b)
}

// ctl makes the control calls of one protocol.
type ctl struct{ o Options }

func (c *ctl) pause(ctx context.Context, base string) error {
	if c.o.Protocol == SGLang {
		_, err := c.call(ctx, base, http.MethodPost, "/pause_generation", map[string]any{"mode": "in_place"}, false)
		return err
	}
	_, err := c.call(ctx, base, http.MethodPost, "/pause?mode=keep&clear_cache=false", struct{}{}, true)
	return err
}

func (c *ctl) resume(ctx context.Context, base string) error {
	if c.o.Protocol == SGLang {
		_, err := c.call(ctx, base, http.MethodPost, "/continue_generation", struct{}{}, false)
		return err
	}
	_, err := c.call(ctx, base, http.MethodPost, "/resume", struct{}{}, true)
	return err
}

// flush resets the engine's cache, retrying a refusal (a non-2xx status:
// requests still hold it) up to Retries times, RetryEvery apart. A
// transport error, a deadline or a 404 fails at once: retrying would not
// change them.
func (c *ctl) flush(ctx context.Context, base string) error {
	method, route, dev := http.MethodPost, "/reset_prefix_cache", true
	if c.o.Protocol == SGLang {
		method, route, dev = http.MethodGet, "/flush_cache", false
	}
	var last error
	for attempt := 1; attempt <= c.o.Retries; attempt++ {
		body, err := c.call(ctx, base, method, route, nil, dev)
		if err == nil {
			// vLLM answers 200 with an empty body; a JSON success:false
			// (some builds) is a refusal too.
			var r struct {
				Success *bool `json:"success"`
			}
			if json.Unmarshal(body, &r) != nil || r.Success == nil || *r.Success {
				return nil
			}
			err = &statusError{method: method, url: base + route, status: http.StatusOK, msg: "success: false"}
		}
		var se *statusError
		if !errors.As(err, &se) || se.status == http.StatusNotFound {
			return err
		}
		last = err
		if attempt < c.o.Retries {
			c.o.Log.Debug("cache flush refused; retrying", "engine", base, "attempt", attempt, "err", err)
			select {
			case <-ctx.Done():
				return fmt.Errorf("%s %s: gave up retrying the cache flush after %d attempts: %w (last: %v)", method, base+route, attempt, ctx.Err(), last)
			case <-time.After(c.o.RetryEvery):
			}
		}
	}
	return fmt.Errorf("%s %s: the engine refused to flush its cache %d times, %s apart: %w; let its requests finish (or raise --retries) and rerun", method, base+route, c.o.Retries, c.o.RetryEvery, last)
}

// reload loads path and records want as the weights version. The load
// itself is bounded by ctx only (the caller's --timeout): a large model
// takes longer than any one control call should.
func (c *ctl) reload(ctx context.Context, base, path, want string) error {
	if c.o.Protocol == SGLang {
		body, err := c.callWith(ctx, base, http.MethodPost, "/update_weights_from_disk",
			map[string]any{"model_path": path, "weight_version": want}, false, 0)
		if err != nil {
			return err
		}
		var r struct {
			Success *bool  `json:"success"`
			Message string `json:"message"`
		}
		if err := json.Unmarshal(body, &r); err != nil {
			return fmt.Errorf("POST %s/update_weights_from_disk: reply is not the JSON {success, message}: %v (%s)", base, err, snippet(body))
		}
		if r.Success == nil || !*r.Success {
			return fmt.Errorf("POST %s/update_weights_from_disk: the engine did not load %q (success: false): %s", base, path, r.Message)
		}
		return nil
	}
	if _, err := c.callWith(ctx, base, http.MethodPost, "/collective_rpc", map[string]any{
		"method": "reload_weights",
		"kwargs": map[string]any{"weights_path": path, "is_checkpoint_format": true},
	}, true, 0); err != nil {
		return err
	}
	_, err := c.call(ctx, base, http.MethodPost, "/update_weight_version", map[string]any{"new_version": want}, true)
	return err
}

func (c *ctl) verify(ctx context.Context, base, want string) error {
	got, err := c.served(ctx, base)
	if err != nil {
		return err
	}
	if got != want {
		return fmt.Errorf("engine %s reports weights version %q after the reload, want %q: check the engine's log and rerun the reload", base, got, want)
	}
	return nil
}

// served asks the engine its weights version (docs/sync.md §5).
func (c *ctl) served(ctx context.Context, base string) (string, error) {
	if c.o.Protocol == SGLang {
		body, err := c.call(ctx, base, http.MethodGet, "/get_weight_version", nil, false)
		if err != nil {
			return "", err
		}
		return parseVersion(base, "/get_weight_version", body, func(v string, ok bool) (string, error) {
			if !ok {
				return "", fmt.Errorf("engine %s reports no weights version (GET /get_weight_version has none): it has not loaded weights with a version; run kiln-sync reload", base)
			}
			return v, nil
		})
	}
	body, err := c.call(ctx, base, http.MethodGet, "/v1/models", nil, false)
	if err != nil {
		return "", err
	}
	var models struct {
		Data []struct {
			WeightVersion json.RawMessage `json:"weight_version"`
		} `json:"data"`
	}
	if err := json.Unmarshal(body, &models); err != nil {
		return "", fmt.Errorf("GET %s/v1/models: reply is not vLLM's model list: %v (%s)", base, err, snippet(body))
	}
	if len(models.Data) > 0 {
		if v, ok, err := versionValue(models.Data[0].WeightVersion); err != nil {
			return "", fmt.Errorf("GET %s/v1/models: data[0].weight_version: %v", base, err)
		} else if ok {
			return v, nil
		}
	}
	// Upstream vLLM's model card has no weight_version: its RL router's
	// /weight_info has it.
	body, err = c.call(ctx, base, http.MethodGet, "/weight_info", nil, false)
	var se *statusError
	if errors.As(err, &se) && se.status == http.StatusNotFound {
		return "", fmt.Errorf("engine %s reports no weights version: /v1/models has no data[0].weight_version and GET /weight_info is 404; vLLM serves it with VLLM_SERVER_DEV_MODE=1 in a release with the RL router (docs/sync.md §5)", base)
	}
	if err != nil {
		return "", err
	}
	return parseVersion(base, "/weight_info", body, func(v string, ok bool) (string, error) {
		if !ok {
			return "", fmt.Errorf("engine %s reports no weights version (neither /v1/models nor /weight_info has one): it has not been given a version; run kiln-sync reload", base)
		}
		return v, nil
	})
}

// parseVersion reads {"weight_version": ...} and hands the result to then.
func parseVersion(base, route string, body []byte, then func(string, bool) (string, error)) (string, error) {
	var r struct {
		WeightVersion json.RawMessage `json:"weight_version"`
	}
	if err := json.Unmarshal(body, &r); err != nil {
		return "", fmt.Errorf("GET %s%s: reply is not {\"weight_version\": ...}: %v (%s)", base, route, err, snippet(body))
	}
	v, ok, err := versionValue(r.WeightVersion)
	if err != nil {
		return "", fmt.Errorf("GET %s%s: weight_version: %v", base, route, err)
	}
	return then(v, ok)
}

// versionValue renders a weight_version, a JSON string or integer, as a
// string; null, "" or absent is no version.
func versionValue(raw json.RawMessage) (string, bool, error) {
	raw = bytes.TrimSpace(raw)
	if len(raw) == 0 || string(raw) == "null" {
		return "", false, nil
	}
	if raw[0] == '"' {
		var s string
		if err := json.Unmarshal(raw, &s); err != nil {
			return "", false, err
		}
		return s, s != "", nil
	}
	var n json.Number
	if err := json.Unmarshal(raw, &n); err != nil {
		return "", false, fmt.Errorf("%s is neither a string nor a number", snippet(raw))
	}
	if i, err := n.Int64(); err == nil {
		return strconv.FormatInt(i, 10), true, nil
	}
	if f, err := n.Float64(); err == nil && f == float64(int64(f)) {
		return strconv.FormatInt(int64(f), 10), true, nil
	}
	return n.String(), true, nil
}

// statusError is an HTTP reply outside 2xx.
type statusError struct {
	method, url string
	status      int
	msg         string
	devMode     bool // a vLLM control route: a 404 means no dev mode
}

func (e *statusError) Error() string {
	s := fmt.Sprintf("%s %s: HTTP %d", e.method, e.url, e.status)
	if e.msg != "" {
		s += ": " + e.msg
	}
	if e.status == http.StatusNotFound && e.devMode {
		s += "; the engine does not serve this control route: vLLM registers it only when the server runs with VLLM_SERVER_DEV_MODE=1 (the RL routes /update_weight_version and /weight_info also need a recent release); restart the engine with it set (docs/sync.md §3)"
	}
	if e.status == http.StatusUnauthorized || e.status == http.StatusForbidden {
		s += "; check --api-key (KILN_ENGINE_API_KEY)"
	}
	return s
}

// call makes one control call bounded by CallTimeout.
func (c *ctl) call(ctx context.Context, base, method, route string, body any, devRoute bool) ([]byte, error) {
	return c.callWith(ctx, base, method, route, body, devRoute, c.o.CallTimeout)
}

// maxReply bounds what is read of a reply: control replies are small.
const maxReply = 4 << 20

// callWith makes one call, bounded by timeout when positive and by ctx
// always. A reply outside 2xx is a *statusError with the engine's message.
// Errors name the method and URL.
func (c *ctl) callWith(ctx context.Context, base, method, route string, body any, devRoute bool, timeout time.Duration) ([]byte, error) {
	u := base + route
	parent := ctx
	if timeout > 0 {
		var cancel context.CancelFunc
		ctx, cancel = context.WithTimeout(ctx, timeout)
		defer cancel()
	}
	var rd io.Reader
	if body != nil {
		b, err := json.Marshal(body)
		if err != nil {
			return nil, fmt.Errorf("%s %s: encoding the request: %w", method, u, err)
		}
		rd = bytes.NewReader(b)
	}
	req, err := http.NewRequestWithContext(ctx, method, u, rd)
	if err != nil {
		return nil, fmt.Errorf("%s %s: %w", method, u, err)
	}
	if body != nil {
		req.Header.Set("Content-Type", "application/json")
	}
	req.Header.Set("Accept", "application/json")
	if c.o.APIKey != "" {
		req.Header.Set("Authorization", "Bearer "+c.o.APIKey)
	}
	resp, err := c.o.Client.Do(req)
	var reply []byte
	if err == nil {
		reply, err = io.ReadAll(io.LimitReader(resp.Body, maxReply))
		resp.Body.Close()
	}
	if err != nil {
		return nil, transportError(parent, ctx, method, u, timeout, err)
	}
	if resp.StatusCode < 200 || resp.StatusCode > 299 {
		return reply, &statusError{method: method, url: u, status: resp.StatusCode, msg: replyMessage(reply), devMode: devRoute && c.o.Protocol == VLLM}
	}
	return reply, nil
}

// transportError says why a call got no reply: the whole reload's
// deadline (parent), the call's own, or the connection.
func transportError(parent, call context.Context, method, u string, timeout time.Duration, err error) error {
	var ue *url.Error
	if errors.As(err, &ue) {
		err = ue.Err
	}
	switch {
	case parent.Err() != nil:
		return fmt.Errorf("%s %s: no answer before the reload's deadline or cancellation: %w; raise --timeout if the engine is only slow", method, u, parent.Err())
	case call.Err() != nil:
		return fmt.Errorf("%s %s: no answer within %s (the per-call timeout): %w; check the engine is up and not wedged", method, u, timeout, call.Err())
	}
	return fmt.Errorf("%s %s: %w; check the engine is up at this URL", method, u, err)
}

// replyMessage extracts the engine's error message: vLLM's {"error":
// {"message"}} or {"error": "..."}, FastAPI's {"detail"}, SGLang's
// {"message"}, or the start of the body.
func replyMessage(b []byte) string {
	var r struct {
		Error   json.RawMessage `json:"error"`
		Detail  json.RawMessage `json:"detail"`
		Message string          `json:"message"`
	}
	if json.Unmarshal(b, &r) == nil {
		var s string
		var obj struct {
			Message string `json:"message"`
		}
		switch {
		case json.Unmarshal(r.Error, &obj) == nil && obj.Message != "":
			return obj.Message
		case json.Unmarshal(r.Error, &s) == nil && s != "":
			return s
		case r.Message != "":
			return r.Message
		case json.Unmarshal(r.Detail, &s) == nil && s != "":
			return s
		case len(r.Detail) > 0 && string(r.Detail) != "null":
			return snippet(r.Detail)
		}
	}
	return snippet(b)
}

// snippet is the start of b, on one line.
func snippet(b []byte) string {
	s := strings.Join(strings.Fields(string(b)), " ")
	if len(s) > 300 {
		s = s[:300] + "…"
	}
	return s
}
