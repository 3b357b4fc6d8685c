package parse

import "strings"

const (
	thinkOpen     = "<think>"
	thinkClose    = "</think>"
	toolCallOpen  = "<tool_call>"
	toolCallClose = "</tool_call>"
	functionOpen  = "<function="
	functionClose = "</function>"
	paramOpen     = "<parameter="
	paramClose    = "</parameter>"
)

type reasoningConfig struct {
	thinkingDisabled bool
}

// ReasoningOption adjusts Reasoning.
type ReasoningOption func(*reasoningConfig)

// ThinkingDisabled reproduces the qwen3 parser built with
// chat_template_kwargs enable_thinking=false: without a "</think>" the
// whole output is content instead of (truncated) reasoning. The reference
// adapter never passes it (docs/adapter.md §6.1); it exists for completeness.
func ThinkingDisabled() ReasoningOption {
	return func(c *reasoningConfig) { c.thinkingDisabled = true }
}

// Reasoning splits a decoded qwen3 output into reasoning and content
// (docs/adapter.md §6.1: vLLM's qwen3 reasoning parser, then the adapter's fallback).
//
//   - Everything up to and including the first "<think>" is dropped (the
//     generation prompt usually opened <think> already, so it is normally
//     absent).
//   - With a "</think>": reasoning is the text before the first one,
//     content the text after it.
//   - Without: if the first "<tool_call>" is followed, after whitespace, by
//     "<function=" or "<function" plus whitespace, reasoning is the text
//     before it and content starts at it; otherwise the output counts as
//     truncated thinking: all reasoning, no content.
//   - Adapter fallback: if the reasoning came out empty and the content
//     still holds a "</think>", split the content at its first one.
//
// Neither part is trimmed.
func Reasoning(text string, opts ...ReasoningOption) (reasoning, content string) {
	var cfg reasoningConfig
	for _, o := range opts {
		o(&cfg)
	}
	reasoning, content = qwen3Reasoning(text, cfg)
	if reasoning == "" {
		if r, c, ok := strings.Cut(content, thinkClose); ok {
			reasoning, content = r, c
		}
	}
	return reasoning, content
}

func qwen3Reasoning(text string, cfg reasoningConfig) (string, string) {
	if _, after, ok := strings.Cut(text, thinkOpen); ok {
		text = after
	}
	if r, c, ok := strings.Cut(text, thinkClose); ok {
		return r, c
	}
	if cfg.thinkingDisabled {
		return "", text
	}
	if i := strings.Index(text, toolCallOpen); i >= 0 {
		rest := pyLStrip(text[i+len(toolCallOpen):])
		if isFunctionOpen(rest) {
			return text[:i], text[i:]
		}
	}
	return text, ""
}

// isFunctionOpen matches the regex `<function[\s=]` at the start of s.
func isFunctionOpen(s string) bool {
	const p = "<function"
	if !strings.HasPrefix(s, p) || len(s) == len(p) {
		return false
	}
	rest := s[len(p):]
	if rest[0] == '=' {
		return true
	}
	return pyLStrip(rest) != rest
}
