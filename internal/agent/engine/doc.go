// Package engine is kiln's client for a vLLM-compatible engine, token in and
// token out (docs/design.md §4.1). It follows
// docs/engine-wire.md (cited as §N below) and the reply rules
// of docs/adapter.md §2.4.
//
// Contract:
//
//   - Probe (§10.1, §9): GET /version, GET /v1/models (served names,
//     max_model_len, root), then a greedy 1-token generation on the route the
//     Mode needs. ModeAuto prefers POST /inference/v1/generate (§5) and falls
//     back to POST /v1/completions with a token-id prompt (§6). A missing
//     token-in route under ModeGenerate is an *UnavailableError naming the
//     server switch (§5.1: --enable-scale-out on v0.30+, or --tokens-only;
//     VLLM_ENABLE_SCALE_OUT_ENDPOINTS=1 on the ~v0.29 window; no flag on
//     v0.11.2–~v0.28) and the completions fallback. A 404 with an error
//     envelope (unknown model) is not read as a missing route.
//   - TokenizeChat / Detokenize (§2.2, §2.3, §3): POST /tokenize chat form and
//     POST /detokenize. Messages, tools and chat_template_kwargs are written
//     byte for byte as given (key order kept, no HTML escaping);
//     add_generation_prompt and add_special_tokens are always sent.
//   - Generate (§5.2, §5.3, §6): max_tokens is always sent, clamped by
//     ClampMaxTokens to the context length when known (Options.ContextLength,
//     else max_model_len learned from /v1/models or /tokenize); a prompt that
//     leaves no room is a *ContextOverflowError and reaches no engine.
//     "logprobs" is always at least 1 (sampled-token logprobs). The session id
//     goes in header x-session-id. No retries: neither the client nor its
//     net/http Transport sends a generate twice (Client.do). Cancelling ctx
//     closes the connection, which is how vLLM aborts a request (§5.5).
//   - Replies (§5.4 shapes A, B, C; §6 legacy completions logprobs) are
//     validated whole before anything is returned: choices present and
//     single; token ids non-negative int32; logprobs present, finite and one
//     per output id; each entry's id (integer token_id, else "token_id:N")
//     equal to its output id (entries with neither are zipped with token_ids,
//     §10.3); usage.completion_tokens, when usage is present, equal to the
//     output length; finish_reason stop/length/abort (absent or "" reads as
//     stop; "error" and unknown values fail); requested top logprobs, sampling
//     mask and routed experts present and consistent. Failures are
//     *ReplyError with a Reason; HTTP failures are *HTTPError (message from
//     error.message, detail, or the raw body, §1). A generate reply is read
//     with encoding/json one level at a time, which words every error.
//   - Weight versions (§10.4): choices[0].weight_versions, when it is a list
//     of integers and strings (kiln's serve.py: one per output token), is
//     Generation.WeightVersions; any other form is ignored, never an error
//     (upstream vLLM's field is unconfirmed). Options.Observe sees every
//     generation Generate returns, so a caller can check them.
//   - Memo: one conversation's memory across calls. /tokenize ids it has
//     read before (the same bytes at the start of a later reply) are taken
//     from it, not parsed again; a generate prompt that is one of its
//     renders is written from the reply's bytes. Ids read through a memo are
//     read-only.
//   - LoadSpecialTokens (§7): the checkpoint's JSON tokenizer files give the
//     stop ids (tokenizer EOS + generation_config eos_token_id), HF-style
//     all_special_ids, every special added token, and ChatML / think markers.
//
// Not implemented, because docs/engine-wire.md marks them unconfirmed or not for a
// text-only token client: the packed logprob variant (return_token_logprobs /
// return_top_k_logprobs, §5.4), weight_versions on the completions
// fallback, sampling_mask_logprobs (score centering; not in the note), streaming (§5.6),
// output_mode "text", multimodal fields, and /abort_requests (only with
// --tokens-only or the dev router; closing the connection is the abort).
package engine
