// Package shellagent is kiln-agent (cmd/kiln-agent): kiln's own coding
// agent, a minimal loop in the spirit of mini-swe-agent, that runs inside a
// task's sandbox and speaks OpenAI Chat Completions to kiln's adapter like
// any other client, so its turns are recorded on the same path.
//
// The loop (Run): messages = [system (SystemPrompt), user (the task)]; each
// turn POSTs {model, messages, tools: [bash, edit], tool_choice: "auto",
// stream: false, temperature?, max_tokens?, metadata.session_id?} to
// BaseURL/chat/completions with Authorization: Bearer APIKey and
// x-session-id Session when set; the assistant message is appended as
// received (reasoning_content included, so the adapter can reuse the turn's
// exact tokens), and its tool calls run in order, each result appended as a
// tool message with the call's id. The whole history is re-sent every turn.
// kiln's adapter names the session by the Bearer token, else by
// metadata.session_id (docs/adapter.md §2.1); x-session-id is the header
// the engine's router reads, sent for a router between agent and adapter.
// It ends on:
//
//   - a reply without tool calls: the final answer (ExitFinal, 0), also
//     when the reply was cut at the token limit;
//   - a failed model call (ExitError, 1): 5xx replies and connection errors
//     are retried twice with a doubling backoff (1 s, 2 s), 3xx and 4xx
//     replies and unreadable bodies are not;
//   - MaxTurns model calls without a final answer (ExitMaxTurns, 3; the
//     last turn's tool calls still run);
//   - the whole-run Timeout (ExitTimeout, 4), which also kills a running
//     command;
//   - the end of Run's context (ExitError, 1, reason "interrupted"; in
//     kiln-agent, SIGTERM or SIGINT), which kills a running command too.
//
// Bad usage is ExitUsage (2, Main only).
//
// Tools (tools.go): bash runs /bin/sh -c (an image may have no bash) in
// the workdir in its own process group, stdin /dev/null, stdout and stderr
// combined, in kiln-agent's environment less KILN_AGENT_* (the agent's key
// and session are not the task's), and reports the exit code; past
// CommandTimeout the group is SIGKILLed, the result says so, and the loop
// goes on. edit replaces the single occurrence of old_str, or creates the
// file when old_str is empty and the file does not exist. Every output
// keeps at most MaxOutputBytes (head and tail, with a note of the bytes
// cut). An unknown tool, arguments that are not a JSON object, or missing
// fields give an error result, never a failed run.
//
// HTTP (http.go): net/http's client, one per run, keeping its connection
// between turns; http:// and https:// (the system's CA certificates, or
// SSL_CERT_FILE / SSL_CERT_DIR), any host name. No proxy is taken from the
// environment (HTTP_PROXY and the like are the image's or the task's, and
// the bash tool passes them on); Config.Proxy (KILN_AGENT_PROXY) sets one
// on purpose. Redirects are not followed (a 3xx is a failed call, not
// retried). A call has no timeout of its own, since generating may take
// long: the run's Timeout bounds it through the request's context, and
// connecting and the TLS handshake are bounded at 30 s each, so that a dead
// address is a connection error, retried.
//
// Static binary: kiln-agent is bind-mounted into images that may have any
// libc or none, so it is built with CGO_ENABLED=0 (pure-Go resolver and
// os/user, statically linked): make build builds ./cmd/... so. Built with
// cgo (the default where a C compiler is installed), "net" would link it
// against the host's libc. CheckStatic tells a static ELF from a dynamic
// one, for the harness to check the binary before it binds it;
// TestStaticBinary builds it as make build does and checks it so. It
// ships as kiln-sandbox-helper does: make build (CGO_ENABLED=0 go build -o
// bin/ ./cmd/...) puts it in bin/ beside the kiln binaries, where
// harness.FindShellAgent looks for it (then on PATH), as the bwrap
// provider looks for the helper; the shell harness binds it read-only at
// harness.ShellAgentPath (docs/rollout.md §3.2).
//
// The transcript (Config.Log, --log): one JSON object per line, each with
// "event" and "time": start (the config and task), assistant (turn,
// attempt, the parsed message and the raw reply), tool (turn, call id,
// name, arguments, result: output, exit_code, timed_out, truncated, error;
// duration_s), model_error (turn, attempt, status, error, retry) and end
// (reason, exit_code, turns, final or error).
package shellagent
