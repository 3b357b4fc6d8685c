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
//     are retried twice with a doubling backoff (1 s, 2 s), 4xx replies and
//     unreadable bodies are not;
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
// Static binary: kiln-agent is bind-mounted into images that may have any
// libc or none, so this package must not import "net" (or "os/user",
// "crypto/tls", "net/http"): with cgo enabled — the default where a C
// compiler is installed, and what make build uses — "net" links the
// binary against the host's libc. rawhttp.go is therefore a minimal
// HTTP/1.1 client over raw sockets (http:// only, IP literals, localhost or
// /etc/hosts names; inside a sandbox the adapter is 127.0.0.1:PORT).
// TestStaticBinary holds both: no "net" among the command's dependencies,
// and an ELF with no interpreter and no needed libraries, built with the
// environment's CGO_ENABLED. It ships as kiln-sandbox-helper does: make
// build (go build -o bin/ ./cmd/...) puts it in bin/ beside the kiln
// binaries, where harness.FindShellAgent looks for it (then on PATH), as
// the bwrap provider looks for the helper; the shell harness binds it
// read-only at harness.ShellAgentPath (docs/rollout.md §3.2).
//
// The transcript (Config.Log, --log): one JSON object per line, each with
// "event" and "time": start (the config and task), assistant (turn,
// attempt, the parsed message and the raw reply), tool (turn, call id,
// name, arguments, result: output, exit_code, timed_out, truncated, error;
// duration_s), model_error (turn, attempt, status, error, retry) and end
// (reason, exit_code, turns, final or error).
package shellagent
