// Package enginetest is a scripted, deterministic stand-in for a vLLM
// server, for tests only: the engine client, the adapter, the Claude Code /
// Codex CLI tests and later stages run against it; production never does.
// Use it like an in-memory registry:
//
//	eng := enginetest.New(enginetest.Options{Script: enginetest.Sequence("hi", "bye")})
//	srv := httptest.NewServer(eng)
//	defer srv.Close()
//
// It mirrors the HTTP surface described in docs/engine-wire.md:
//
//   - §1: the error envelope {"error": {message, type, param, code}} with
//     400/404/500/501, {"detail": ...} for unregistered routes, unknown
//     fields ignored, the optional model field (unknown → 404), and the
//     --api-key guard of /v1, /v2, /inference (Options.APIKey);
//   - §2: POST /tokenize, completion form and chat form (messages, tools,
//     add_generation_prompt, continue_final_message, chat_template_kwargs,
//     return_token_strs; a request chat_template is refused as on a server
//     without --trust-request-chat-template); response {count,
//     max_model_len, tokens, token_strs};
//   - §3: POST /detokenize → {prompt}, special tokens kept;
//   - §4: GET /tokenizer_info when Options.EnableTokenizerInfo;
//   - §5: POST /inference/v1/generate with token_ids + sampling_params, the
//     three non-streaming response shapes (A) disagg, (B) scale_out, (C)
//     integer token_id logprobs (Options.Shape, default C), per-token
//     logprobs with rank and top_logprobs, finish_reason stop|length and
//     stop_reason (null for the tokenizer eos <|im_end|>, the id for
//     stop_token_ids and generation_config's <|endoftext|>, the string for
//     stop strings), max_tokens defaults (16 when absent in shape A; else
//     max_model_len − prompt) and the context limit (a prompt longer than
//     max_model_len is a 400; generation stops with "length" when the
//     context is full), and §5.1's enablement: Options.Generate
//     GenerateDisabled makes the route a plain 404, GenerateUnsupported a
//     501 — the probe of §10 (a 1-token generate) sees exactly that;
//   - §6: POST /v1/completions with token-id prompts, legacy logprobs,
//     return_tokens_as_token_ids, return_token_ids; prompt + max_tokens over
//     max_model_len is a 400;
//   - §7: WriteTokenizerFiles writes tokenizer_config.json,
//     special_tokens_map.json, generation_config.json and tokenizer.json;
//   - §9: GET /v1/models (max_model_len, root), GET /health (200/503),
//     GET /version, GET /load; plus GET /openapi.json listing the routes.
//
// Not implemented: streaming (stream:true is a 501), output_mode "text",
// n > 1, prompt_logprobs (always null), sampling_mask / top-p replay and
// routed_experts (docs/engine-wire.md documents sampling_mask only as a
// server-wide capture with unconfirmed enablement, so the fields are
// always null), multimodal inputs, the dev-mode endpoints of §8 (pause,
// sleep, collective_rpc, weight transfer) and /abort_requests. Sampling
// values (temperature, top_p, top_k, seed, ...) are validated but the
// output is whatever the Script says.
//
// The model side is a byte-level tokenizer (ids 0..255) with Qwen3-named
// added tokens at fixed ids (see the constants), a Go rendering of Qwen3's
// chat template (ChatTemplate documents exactly what is mirrored), and a
// Script that decides each output from the request (session id from the
// x-session-id header, prompt ids and text, sampling params, turn number
// within the session). Every request is logged (Requests) with counters of
// calls and bytes per path (Stats); faults can be injected (Fault,
// InjectFault) and latency added (Options.Latency).
//
// It is a test fake, written plainly: encoding/json in, ojson out, no
// pools or caches. BenchmarkEngineTurn is one agent turn's handler CPU,
// for reading the load benchmarks, which run it on kiln's cores.
package enginetest
