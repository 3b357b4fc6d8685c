package shellagent

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"net/http"
	"net/url"
	"os"
	"strings"
	"time"
)

// Exit statuses of a run (and of kiln-agent).
const (
	ExitFinal    = 0 // the model answered without tool calls
	ExitError    = 1 // the model could not be asked (HTTP or reply error, after retries)
	ExitUsage    = 2 // bad flags or inputs
	ExitMaxTurns = 3 // MaxTurns model calls made, still no final answer
	ExitTimeout  = 4 // the whole-run Timeout ran out
)

// Defaults of the flags.
const (
	DefaultMaxTurns       = 50
	DefaultTimeout        = 20 * time.Minute
	DefaultCommandTimeout = 2 * time.Minute
	DefaultMaxOutputBytes = 16384
	// DefaultRetries is how many times a model call is retried after a 5xx
	// reply or a connection error; 4xx replies are not retried.
	DefaultRetries = 2
	// DefaultRetryBackoff is the wait before the first retry; it doubles.
	DefaultRetryBackoff = time.Second
)

// Config is one run. BaseURL, Model, Task and Workdir are required; zero
// values of the rest take the defaults above.
type Config struct {
	BaseURL string // ends in /v1; requests go to BaseURL + "/chat/completions"
	Model   string
	Task    string // the problem statement: the user message
	Workdir string // absolute; commands run and relative edit paths resolve here

	MaxTurns       int           // model calls at most
	Timeout        time.Duration // the whole run
	CommandTimeout time.Duration // each bash call
	MaxOutputBytes int           // each tool result's output

	APIKey  string // sent as Authorization: Bearer (the adapter's session id)
	Session string // sent as x-session-id and body metadata.session_id

	Temperature *float64 // sent when set
	MaxTokens   int      // sent as max_tokens when > 0

	// Proxy, when set, is the HTTP proxy of every model call (kiln-agent:
	// KILN_AGENT_PROXY). The environment's HTTP_PROXY, HTTPS_PROXY and
	// NO_PROXY are never read: they are the image's or the task's.
	Proxy *url.URL

	// Log, when set, receives the JSONL transcript: one object per event.
	Log io.Writer
	// Now is the clock of the transcript (time.Now when nil).
	Now func() time.Time

	Retries      int           // DefaultRetries when 0; < 0 for none
	RetryBackoff time.Duration // DefaultRetryBackoff when 0
}

// Result is how a run ended.
type Result struct {
	ExitCode int
	Reason   string // "final", "max_turns", "timeout", "error", "interrupted"
	Turns    int    // model calls answered
	Final    string // the final answer's text (ExitFinal)
	Err      error  // ExitError and ExitTimeout: what happened
}

// SystemPrompt is the system message of a run in workdir.
func SystemPrompt(workdir string) string {
	return fmt.Sprintf(`You are a coding agent working in the repository at %s. Solve the task the user gives you by changing files there.

Use the bash tool to run shell commands (each call runs "/bin/sh -c COMMAND" in %s, in a fresh shell; output and exit code come back; long-running commands are killed). Edit files with the edit tool: it replaces one exact, unique occurrence of old_str with new_str, or creates a new file when old_str is empty. Inspect the code, make the change, and check it (run the relevant tests when there are any).

When you are done, reply with a final message that makes no tool calls: it ends the session.`, workdir, workdir)
}

// Run runs the agent loop until a final answer, MaxTurns, the Timeout, a
// model error or the end of ctx (ExitError, reason "interrupted"; a running
// command is killed). It never fails on a tool's failure: those are results
// the model reads.
func Run(ctx context.Context, cfg Config) Result {
	cfg.defaults()
	tr := &transcript{w: cfg.Log, now: cfg.Now}
	ctx, cancel := context.WithTimeout(ctx, cfg.Timeout)
	defer cancel()

	end := func(r Result) Result {
		ev := map[string]any{"reason": r.Reason, "exit_code": r.ExitCode, "turns": r.Turns}
		if r.Err != nil {
			ev["error"] = r.Err.Error()
		}
		if r.Reason == "final" {
			ev["final"] = r.Final
		}
		tr.event("end", ev)
		return r
	}
	u, err := url.Parse(strings.TrimRight(cfg.BaseURL, "/") + "/chat/completions")
	if err != nil {
		return end(Result{ExitCode: ExitUsage, Reason: "error", Err: fmt.Errorf("base url %q: %w", cfg.BaseURL, err)})
	}
	tr.event("start", map[string]any{"base_url": cfg.BaseURL, "model": cfg.Model, "workdir": cfg.Workdir,
		"max_turns": cfg.MaxTurns, "timeout_s": cfg.Timeout.Seconds(), "command_timeout_s": cfg.CommandTimeout.Seconds(),
		"max_output_bytes": cfg.MaxOutputBytes, "task": cfg.Task})

	if u.Scheme != "http" && u.Scheme != "https" {
		return end(Result{ExitCode: ExitUsage, Reason: "error", Err: fmt.Errorf("base url %q: only http:// and https:// are supported", cfg.BaseURL)})
	}
	hc := newHTTPClient(cfg.Proxy)
	defer hc.CloseIdleConnections()
	c := &client{url: u, hc: hc, cfg: &cfg, tr: tr}
	tl := &tools{workdir: cfg.Workdir, commandTimeout: cfg.CommandTimeout, maxOutput: cfg.MaxOutputBytes,
		env: commandEnv(os.Environ())}
	sys, task := SystemPrompt(cfg.Workdir), cfg.Task
	msgs := []message{{Role: "system", Content: &sys}, {Role: "user", Content: &task}}
	// stopped is the end once ctx is done: the run's Timeout (or a deadline
	// of the caller's), else the caller cancelled it (kiln-agent: a signal).
	stopped := func(turns int) Result {
		if errors.Is(ctx.Err(), context.DeadlineExceeded) {
			return end(Result{ExitCode: ExitTimeout, Reason: "timeout", Turns: turns,
				Err: fmt.Errorf("the run's %s time budget ran out", cfg.Timeout)})
		}
		return end(Result{ExitCode: ExitError, Reason: "interrupted", Turns: turns,
			Err: fmt.Errorf("interrupted: %w", context.Cause(ctx))})
	}
	for turn := 0; ; turn++ {
		if turn >= cfg.MaxTurns {
			return end(Result{ExitCode: ExitMaxTurns, Reason: "max_turns", Turns: turn})
		}
		if ctx.Err() != nil {
			return stopped(turn)
		}
		reply, err := c.complete(ctx, turn, msgs)
		if err != nil {
			if ctx.Err() != nil {
				return stopped(turn)
			}
			return end(Result{ExitCode: ExitError, Reason: "error", Turns: turn, Err: err})
		}
		msgs = append(msgs, reply.echo())
		if len(reply.ToolCalls) == 0 {
			final := ""
			if reply.Content != nil {
				final = *reply.Content
			}
			return end(Result{ExitCode: ExitFinal, Reason: "final", Turns: turn + 1, Final: final})
		}
		for _, call := range reply.ToolCalls {
			start := time.Now()
			res := tl.call(ctx, call.Function.Name, call.Function.Arguments)
			tr.event("tool", map[string]any{"turn": turn, "id": call.ID, "name": call.Function.Name,
				"arguments": call.Function.Arguments, "result": res, "duration_s": time.Since(start).Seconds()})
			out := res.Output
			msgs = append(msgs, message{Role: "tool", ToolCallID: call.ID, Content: &out})
			if ctx.Err() != nil {
				return stopped(turn + 1)
			}
		}
	}
}

func (c *Config) defaults() {
	if c.MaxTurns == 0 {
		c.MaxTurns = DefaultMaxTurns
	}
	if c.Timeout == 0 {
		c.Timeout = DefaultTimeout
	}
	if c.CommandTimeout == 0 {
		c.CommandTimeout = DefaultCommandTimeout
	}
	if c.MaxOutputBytes == 0 {
		c.MaxOutputBytes = DefaultMaxOutputBytes
	}
	if c.Retries == 0 {
		c.Retries = DefaultRetries
	}
	if c.RetryBackoff == 0 {
		c.RetryBackoff = DefaultRetryBackoff
	}
	if c.Now == nil {
		c.Now = time.Now
	}
}

// message is one Chat Completions message as kiln-agent sends it. Content
// is a pointer because an assistant message with tool calls may carry null.
type message struct {
	Role             string     `json:"role"`
	Content          *string    `json:"content"`
	ReasoningContent string     `json:"reasoning_content,omitempty"`
	ToolCalls        []toolCall `json:"tool_calls,omitempty"`
	ToolCallID       string     `json:"tool_call_id,omitempty"`
}

type toolCall struct {
	ID       string `json:"id"`
	Type     string `json:"type"`
	Function struct {
		Name string `json:"name"`
		// Arguments is the wire value as received (a JSON string holding
		// an object), echoed back unchanged.
		Arguments json.RawMessage `json:"arguments"`
	} `json:"function"`
}

// echo is the assistant message as the next request carries it: as
// received, reasoning_content included, so that the engine renders the
// history the model actually produced and the adapter can reuse the turn's
// exact tokens (docs/adapter.md §3).
func (m *message) echo() message {
	e := *m
	e.Role = "assistant"
	for i := range e.ToolCalls {
		if e.ToolCalls[i].Type == "" {
			e.ToolCalls[i].Type = "function"
		}
		if len(e.ToolCalls[i].Function.Arguments) == 0 {
			e.ToolCalls[i].Function.Arguments = json.RawMessage(`"{}"`)
		}
	}
	return e
}

// client asks the model through the adapter.
type client struct {
	url *url.URL
	hc  *http.Client
	cfg *Config
	tr  *transcript
}

// statusError is a non-2xx reply.
type statusError struct {
	status int
	body   string
}

func (e *statusError) Error() string {
	b := e.body
	if len(b) > 500 {
		b = b[:500] + "…"
	}
	return fmt.Sprintf("model call: HTTP %d: %s", e.status, strings.TrimSpace(b))
}

// complete makes one model call, retrying 5xx replies and connection errors
// with a doubling backoff, and returns the assistant message.
func (c *client) complete(ctx context.Context, turn int, msgs []message) (*message, error) {
	body := map[string]any{"model": c.cfg.Model, "messages": msgs, "tools": toolSchemas(),
		"tool_choice": "auto", "stream": false}
	if c.cfg.Temperature != nil {
		body["temperature"] = *c.cfg.Temperature
	}
	if c.cfg.MaxTokens > 0 {
		body["max_tokens"] = c.cfg.MaxTokens
	}
	if c.cfg.Session != "" {
		body["metadata"] = map[string]any{"session_id": c.cfg.Session}
	}
	b, err := json.Marshal(body)
	if err != nil {
		return nil, fmt.Errorf("encode request: %w", err)
	}
	hdr := [][2]string{{"Content-Type", "application/json"}, {"Accept", "application/json"}, {"User-Agent", "kiln-agent"}}
	if c.cfg.APIKey != "" {
		hdr = append(hdr, [2]string{"Authorization", "Bearer " + c.cfg.APIKey})
	}
	if c.cfg.Session != "" {
		hdr = append(hdr, [2]string{"x-session-id", c.cfg.Session})
	}
	retries := max(c.cfg.Retries, 0)
	wait := c.cfg.RetryBackoff
	for attempt := 0; ; attempt++ {
		start := time.Now()
		status, data, err := httpPost(ctx, c.hc, c.url, hdr, b)
		if err == nil && (status < 200 || status > 299) {
			err = &statusError{status: status, body: string(data)}
		}
		if err == nil {
			m, perr := parseReply(data)
			if perr == nil {
				c.tr.event("assistant", map[string]any{"turn": turn, "attempt": attempt, "message": m,
					"reply": json.RawMessage(data), "duration_s": time.Since(start).Seconds()})
				return m, nil
			}
			err = perr
		}
		var se *statusError
		var te *transportError
		retry := attempt < retries && ctx.Err() == nil &&
			((errors.As(err, &se) && se.status >= 500) || errors.As(err, &te))
		ev := map[string]any{"turn": turn, "attempt": attempt, "error": err.Error(), "retry": retry}
		if se != nil {
			ev["status"] = se.status
		}
		c.tr.event("model_error", ev)
		if !retry {
			return nil, err
		}
		select {
		case <-ctx.Done():
			return nil, err
		case <-time.After(wait):
		}
		wait *= 2
	}
}

// parseReply reads the one choice's message of a chat.completion.
func parseReply(data []byte) (*message, error) {
	var r struct {
		Choices []struct {
			Message message `json:"message"`
		} `json:"choices"`
	}
	if err := json.Unmarshal(data, &r); err != nil {
		return nil, fmt.Errorf("model reply: %w", err)
	}
	if len(r.Choices) == 0 {
		return nil, errors.New("model reply: no choices")
	}
	m := r.Choices[0].Message
	for i, tc := range m.ToolCalls {
		if tc.ID == "" { // a tool message must name its call
			m.ToolCalls[i].ID = fmt.Sprintf("call_%d", i)
		}
	}
	return &m, nil
}

// transcript writes the JSONL log; a nil writer writes nothing. A failed
// write stops the log, never the run.
type transcript struct {
	w   io.Writer
	now func() time.Time
}

func (t *transcript) event(kind string, fields map[string]any) {
	if t.w == nil {
		return
	}
	fields["event"] = kind
	fields["time"] = t.now().UTC().Format(time.RFC3339Nano)
	b, err := json.Marshal(fields)
	if err != nil {
		b, _ = json.Marshal(map[string]any{"event": kind, "error": "transcript: " + err.Error()})
	}
	if _, err := t.w.Write(append(b, '\n')); err != nil {
		t.w = nil
	}
}
