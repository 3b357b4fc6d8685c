// Package adapter is kiln's model adapter (docs/design.md §4.2): an HTTP
// server that coding CLIs call as if it were the vendor API, which turns
// every request into one token-in/token-out engine call and records the
// exact tokens of the turn. Section numbers cite
// docs/adapter.md.
//
// Routes (§4.1, §5.1, §5.6): POST /v1/messages (Anthropic Messages, with or
// without ?beta=true), POST /v1/messages/count_tokens ({"input_tokens":0}),
// GET /v1/models and GET /healthz ({"ok":true}), HEAD /api/hello (200);
// POST /v1/responses (OpenAI Responses, stateless) and POST
// /v1/chat/completions. Decoding and reply encoding are package protocol's.
//
// Sessions (§2.1, §2.2): the bearer token (protocol.Request.SessionID) names
// the session. Open registers one with its ids, sampling defaults, context
// limit and chat_template_kwargs (all copied); a request for an id never
// opened auto-opens an empty session, as the reference does (Options.AutoOpen,
// default true). Finish and Drop close the id for good (later requests: 503
// "session closed"), wait Options.ShutdownWait for in-flight turns and cancel
// the rest; Finish returns the recorded turns (records.Turn rows, in order),
// a second call returns nil. Options.MaxTurnsPerSession gives the 429
// rate_limit_error of §2.2. The turns of one session run one at a time.
//
// One turn (§2.3): decode → render R = TokenizeChat(messages, tools,
// add_generation_prompt=true, kwargs) → prompt ids by prefix reuse (§3) →
// sampling params (§1.4: 4096, session defaults, client cap, Options.
// MaxTurnTokens, temperature/top_p/top_k overrides, stop) → context clamp
// (§1.5: min of the session limit and the engine's context length) →
// engine.Generate with x-session-id (the engine client validates the reply,
// §2.4) → Detokenize of the output ids, specials kept → parse.Parse →
// protocol reply, written whole (JSON or SSE) → record. Any failure before
// the reply is written is an HTTP error and records nothing; a reply whose
// write fails, or whose request was cancelled, is not recorded either (the
// §2.3 QUIRK fixed as recommended). Cancelling the client's request cancels
// the engine call (§1.7).
//
// Long turns (§4.7's design note): a streamed turn still unanswered after
// Options.KeepAlive (15 s) is answered with the stream's head at once and
// the protocol's keep-alive frame as often (protocol.Prelude: Anthropic's
// ping event, a Chat Completions comment, Responses' response.created then
// response.in_progress events), until the reply follows in the same stream
// — so that a client that bounds a silent model call (Claude Code's
// API_TIMEOUT_MS until the response head, Codex's stream idle timeout
// between events) does not give up on a long generation and ask again.
// Past that point a failure is the protocol's error event ending the
// stream (Prelude.Error), not a status.
//
// Prefix reuse (§3), with engine-side rendering. kiln has no local
// tokenizer or template: every render is a POST /tokenize of the chat form.
// Per session the adapter stores, for every recorded turn, the sha256 of the
// canonical JSON (object keys sorted) of each request message plus the
// turn's assistant message (protocol.AssistantMessage) and of the tool list;
// no history is copied. For a request with messages M and tools S:
//
//  1. R = render(M, S, generation prompt) — /tokenize call 1, always made.
//  2. Stored prefixes are tried deepest first (stable), skipping those whose
//     tools differ, that are not strictly shorter than M, whose message
//     hashes differ from M[:d]'s, whose turn did not finish "stop", had no
//     output or did not end in one of Options.Special.AllSpecialIDs, or that
//     are ambiguous (another prefix with the same hashes but other ids).
//     All of this is hash and id comparison: no engine call.
//  3. For the first surviving prefix, anchor = render(M[:d], S, no
//     generation prompt) — /tokenize call 2. R must start with anchor; end is
//     the last index of the previous turn's last output id in anchor, and
//     anchor[end+1:] must decode (POST /detokenize) to whitespace only; the
//     answer for each distinct short tail is remembered for the server's
//     life (the same separator ids follow every turn's end token).
//  4. Prompt = previous prompt ids + previous output ids + R[end+1:]: the
//     suffix is R's own rendering of the new messages in their full context,
//     so it needs no extra render, and everything before it is the exact
//     sampled tokens (including reasoning the client dropped).
//  5. Otherwise the prompt is R (the canonical render).
//
// The one difference from the reference: it renders an anchor for every
// surviving prefix until one works; kiln renders at most
// Options.ReuseAttempts anchors (default 1), so a turn costs at most two
// /tokenize calls. When the deepest eligible prefix fails step 3 the turn
// falls back to R instead of trying shorter prefixes (with Qwen-style
// templates a shorter prefix fails for the same reason). A large
// ReuseAttempts restores the reference's search.
//
// Memory per session: the recorded turns, kept without a copy of the
// history per turn. A client resends its whole history every turn, so a
// session's lists — its prompts' ids, its prefixes' message hashes, its
// turns' message lists — each begin with the one before, and each kind is
// kept in one array (chain): a turn's prompt ids that are a render of the
// growing conversation are the engine client's memo array (engine.Memo;
// the recorded ids are read-only), a reused prompt built from the last
// one's ids (step 4) is appended in place to that one's array, and
// whenever a new array takes over, the lists that are views of the old one
// move to it. Each distinct prompt message is stored once, and Finish joins
// a turn's list into its prompt_messages array (messageStore). Besides,
// the session holds one render's reply bytes (engine.Memo) and its last
// request's message slices (for the same-slice checks). The load
// benchmark's 100-turn sessions (prompts up to ~40k tokens) hold ~0.85 MB
// each, where a copy of the ids and messages per turn took ~12 MB.
//
// With Qwen3-family templates, whose last assistant message renders a
// <think> block that is dropped once more messages follow, reuse needs the
// echoed assistant message to carry its reasoning: Anthropic (thinking blocks
// echoed) does; Responses and Chat drop reasoning from the echoed message, so
// they reuse only when the reasoning stays in the visible content (no
// reasoning parser) and otherwise fall back to R — as in the reference.
//
// Differences from the reference (vime), on purpose (docs/departures.md §2):
//   - Rendering and decoding go through the engine's /tokenize and
//     /detokenize (docs/design.md §4.1), never a local tokenizer or template.
//   - A prompt that leaves no room in the context is the protocol's own
//     context-overflow error (400; Anthropic "prompt is too long", OpenAI
//     context_length_exceeded), not an empty "length" turn; nothing is
//     recorded.
//   - Invalid request JSON is a 400 in the protocol's error shape (the
//     reference answers 500). All errors use the protocol's envelope with the
//     reference's status codes (§4.9 design note): engine failures 500 with
//     "vllm upstream <status>: ..." or the failed validation rule, 503
//     session closed, 429 turn cap, 499 client disconnected.
//   - Trailing end-of-turn special texts are stripped from the visible text
//     and the recorded assistant message alike (§6.3 recommendation).
//   - records.Turn.MaxContextTokens is the effective limit of §1.5 (session
//     limit and engine context length), 0 when neither is known.
//
// Serving: Server is an http.Handler. kiln-rollout adapter serves it with
// net/http's server as NewHTTPServer builds it (HTTP/1.1 without TLS):
// request heads bounded in time (HTTPLimits.ReadHeaderTimeout, 30 s) and
// size (1 MiB, then 431), bodies to MaxBodyBytes, kept-alive connections
// closed after 5 idle minutes, and a write timeout that bounds each write
// of a reply rather than the request, so that a turn may generate for as
// long as it takes. A request's context ends when the client hangs up
// (net/http notices once the body has been read, which every turn does
// first) or when its handler returns. TestRawRequestsLikeNetHTTP holds
// that malformed requests are answered as a plain net/http server answers
// them.
//
// Not implemented: score centering (§1.4 step 6, §2.4 rule 6), routing
// replay (R3), the debug callback (§2.3 step 11).
package adapter
