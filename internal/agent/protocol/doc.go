// Package protocol is the HTTP-free half of kiln's adapter: it decodes the
// three client protocols into one neutral Request and encodes a model turn
// (Reply) back into each protocol's JSON or SSE reply. The adapter server
// wires HTTP, sessions and the engine around it. Section numbers cite
// docs/adapter.md; client shapes follow
// docs/clients-wire.md.
//
// Decoding (DecodeAnthropic, DecodeResponses, DecodeChat) gives
// chat-template messages {role, content, reasoning_content?, tool_calls?:
// [{type:function, function:{name, arguments:{...}}}]} and OpenAI function
// tool schemas, both as compact JSON with object keys in the client's order
// and no HTML escaping (§1.6 design note), plus the session id (§2.1:
// Bearer token; Anthropic then X-Api-Key; OpenAI then
// body.metadata.session_id, then body.user; else "default"), sampling
// overrides (§1.4 steps 3–5), the model name and whether to stream (§2.3
// step 9: stream === true or Accept: text/event-stream).
//
//   - Anthropic Messages (§4.2–4.4): mid-list system messages folded into
//     <system-reminder> blocks (§4.3); each user text block its own user
//     message; tool results reordered to call order by tool_use_id when every
//     id is known; thinking blocks become reasoning_content (signatures
//     dropped); images "[image omitted]". ?beta=true, anthropic-beta and
//     anthropic-version change nothing here.
//   - OpenAI Responses (§5.1–5.3): stateless, full history, store=false;
//     function, custom and namespaced tools (schema name ns.name); reasoning
//     items skipped; tool outputs emitted in call order. 400 for
//     previous_response_id, store=true, background, conversation, hosted and
//     other unknown tool types, unknown item types and roles.
//   - Chat Completions (§5.6): developer -> system, no reordering, §5.7
//     argument coercion.
//
// DecodeAnthropicHistory, DecodeResponsesHistory and DecodeChatHistory
// decode exactly as these functions do, in time that does not grow with
// the session: a session's History skips the part of its history the
// previous request already translated (history.go states when that is
// sound). Fuzz tests hold each equal to the plain decode.
//
// Every decoding failure is an *Error with status 400 and a message naming
// the problem; Error.Body renders it in the protocol's envelope
// (AnthropicError, OpenAIError). ContextOverflow gives each protocol's own
// context-length error.
//
// Encoding (WriteReply, or Write*/Stream* per protocol) follows §4.5–4.8,
// §5.4–5.5 and §5.6. Ids come from an IDSource (SeededIDs for golden
// tests), timestamps from ReplyOptions.Created. AssistantMessage is the
// reference's manager_message: the history entry decoding the client's
// echo of the reply produces.
//
// Deliberate differences from the reference (vime; all listed in
// docs/departures.md §2):
//   - Responses replies start with a reasoning item whose encrypted_content
//     is kiln's handle to the model's reasoning (reasoningHandle); Codex
//     echoes it verbatim and the decoder restores reasoning_content, so a
//     Qwen3-style template renders the history as sampled and prefix reuse
//     continues from the original tokens (the reference drops reasoning on
//     this path and re-renders every tool turn).
//   - Invalid request JSON is a 400 with a message (the reference answers
//     500); so are wrongly typed top-level fields (messages/tools not lists,
//     non-integer max tokens, non-numeric temperature/top_p/top_k, non-string
//     stops) where Python would raise.
//   - Errors use the protocol's envelope; a prompt that does not fit is
//     Anthropic 400 invalid_request_error "prompt is too long: N tokens > M
//     maximum" and OpenAI 400 code context_length_exceeded, not an empty
//     length-finished turn.
//   - Tools marked defer_loading (Claude Code's DeferredToolPlaceholder) are
//     not shown to the model, in all three protocols.
//   - Flattening a single non-image block gives its JSON, not a Python repr
//     (§4.4 QUIRK); other scalars are stringified as JSON text.
//   - A non-object tool_use input is coerced like §5.7 arguments.
//   - Chat reply arguments keep the model's key order (the reference sorts
//     keys); streamed Chat replies, like the JSON form, carry no text next to
//     a tool call and only the first call.
//   - message_start names the request's model like the JSON reply (the
//     reference always says vime-actor); the default model is DefaultModel.
package protocol
