// Package parse turns one decoded model output (special tokens kept) into
// reasoning, visible text and tool calls, as the coding-agent adapter does
// (docs/adapter.md §6; the reference is vime's agent/parsing.py over
// vLLM's qwen3 reasoning parser and qwen3_coder / hermes tool parsers).
//
// # Contract
//
// Parse never fails and never panics: output it cannot make sense of is
// returned as visible text, and recovered or malformed calls set IllFormed
// (the adapter records it on the turn). The pieces:
//
//   - Reasoning: the qwen3 split (Reasoning's doc has the rules) plus the
//     adapter's fallback split at a leftover "</think>". Reasoning is not
//     trimmed. Without a reasoning parser the whole output is the body.
//   - ToolCalls: only when the request has tools. The configured parser
//     (Qwen3CoderXML or HermesJSON) runs first; when it finds no calls
//     but a `<tool_call>{...}</tool_call>` block is present, those blocks
//     are re-parsed leniently (raw control characters allowed, then
//     invalid escapes repaired) and the ones naming an offered tool become
//     the calls (IllFormed). With still no calls, and always when no parser
//     is configured (FallbackOnly), the XML fallback accepts
//     `<tool_call><function=NAME>...</function></tool_call>` blocks whose
//     NAME is offered, with string arguments. Content is trimmed.
//   - Call.Arguments is always a compact JSON object, keys in the order the
//     model wrote them (a repeated key keeps its first place and its last
//     value, like a Python dict), no HTML escaping, invalid UTF-8 as
//     U+FFFD (ojson.Marshal).
//
// What holds for every input (the fuzz targets check it): arguments are
// JSON objects; Content is the input with spans deleted, trimmed; with no
// calls Content is exactly the trimmed input and IllFormed is false.
// Text is NOT always preserved when calls are found, by design of the
// reference parsers: qwen3_coder and hermes keep only the text before the
// first call (text between and after calls is dropped); the lenient path
// and the XML fallback drop only the call blocks. Reasoning drops the text
// before the first "<think>".
//
// # qwen3_coder typing
//
// A parameter's value (one leading and one trailing newline removed) is
// typed by the tool's JSON schema property: unknown parameter or
// string-like type -> string; nullable and "null"/"none" (any case) -> null;
// other types: "null"/"none" -> null; int*/uint*/long*/short*/unsigned* ->
// Python int() else string; num*/float* -> Python float(), integral values
// as integers, else Python's float repr, else string; boolean/bool/binary ->
// value == "true" (any case); object/array/arr/dict*/list* -> JSON (a JSON
// string is further read as a Python literal), else Python literal, else
// string; any other type -> Python literal, else string. The Python
// literal reader covers str, int, float, bool, None, list, tuple and dict.
//
// # Deliberate differences from the reference (docs/departures.md §3)
//
//   - Non-object arguments (docs/adapter.md §6.2): the reference passes a JSON
//     array / scalar / string "arguments" through as the tool input; here
//     it becomes {"_raw_arguments": value} and IllFormed is set, on every
//     path. A string "arguments" is first decoded as JSON (the reference's
//     pre-repair does this for closed blocks; it is done for unterminated
//     hermes blocks too, for consistency).
//   - Escape repair: a "\u" not followed by four hex digits counts as an
//     invalid escape and is repaired like any other (the reference's
//     regex leaves every "\u" alone). Otherwise the repair is the
//     reference's: each backslash not followed by one of " \ / b f n r t
//     (or u plus four hex digits) is doubled, judged per backslash, so an
//     escaped backslash before a letter ("\\d") is still doubled when a
//     repair is needed.
//   - The pre-repair does not rewrite the text. The reference rewrites
//     repairable JSON blocks as canonical JSON before running the parser,
//     so a failed parse shows the rewritten block in the visible text (and
//     under qwen3_coder even inside parameter values); here the lenient
//     decode is used for those blocks directly and text is always the
//     model's own.
//   - Trailing special tokens (docs/adapter.md §6.3): the reference keeps e.g.
//     "<|im_end|>" at the end of the visible text. Parse strips the texts
//     listed in Options.TrailingSpecials (QwenEndTokens for Qwen); the
//     adapter must apply StripTrailingSpecials to the manager message
//     identically. With no TrailingSpecials the reference behaviour holds.
//   - JSON edge cases Python accepts but JSON cannot carry are refused:
//     NaN / Infinity in JSON, float("inf"/"nan") for number parameters (kept
//     as strings; the reference raises on inf and so loses every call),
//     number overflow, and Python literals json.dumps cannot encode (sets,
//     bytes, complex, tuple keys). Lone UTF-16 surrogates become U+FFFD.
//   - Numbers decoded from JSON keep their source spelling ("1.50" stays
//     1.50; Python would print 1.5). Numbers produced by the qwen3_coder
//     converter and by Python literals are printed as Python would.
//   - A JSON Schema type list ({"type":["integer","null"]}) is read like
//     anyOf (first non-null type, nullable); the reference stringifies the
//     list and so treats the value as an untyped literal.
//   - Python int()/float() accept non-ASCII decimal digits; these do not.
//   - Call IDs are not generated here (the adapter assigns them).
//
// Ambiguities settled by the reference code: the implicit reasoning end
// checks only the FIRST "<tool_call>"; hermes names are not filtered by the
// schema (only the lenient path filters, and accepts any name when no tool
// has one); qwen3_coder names are not filtered either but must be plain
// (no braces, angle brackets, quotes or whitespace); an empty hermes name
// becomes "tool"; "whitespace" means Python's str.isspace set.
package parse
