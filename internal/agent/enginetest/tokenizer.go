package enginetest

import (
	"sort"
	"strings"
)

// Token ids of the test tokenizer. Ids 0..255 are the bytes of UTF-8 text
// (one token per byte); the added tokens follow with fixed ids. Names and
// the special flags follow Qwen3's tokenizer_config.json: <|endoftext|>,
// <|im_start|> and <|im_end|> are special; the think, tool_call and
// tool_response markers are added tokens with special=false (they are
// matched atomically when encoding and never skipped when decoding).
const (
	EndOfText         = 256 // <|endoftext|>: pad token, generation_config eos
	IMStart           = 257 // <|im_start|>
	IMEnd             = 258 // <|im_end|>: the tokenizer's eos_token
	ThinkStart        = 259 // <think>
	ThinkEnd          = 260 // </think>
	ToolCallStart     = 261 // <tool_call>
	ToolCallEnd       = 262 // </tool_call>
	ToolResponseStart = 263 // <tool_response>
	ToolResponseEnd   = 264 // </tool_response>

	// VocabSize is the number of ids; ids >= VocabSize are out of vocabulary.
	VocabSize = 265
)

// AddedToken is one entry of the tokenizer's added tokens (ids above 255).
type AddedToken struct {
	ID      int
	Content string
	Special bool
}

var addedTokens = []AddedToken{
	{EndOfText, "<|endoftext|>", true},
	{IMStart, "<|im_start|>", true},
	{IMEnd, "<|im_end|>", true},
	{ThinkStart, "<think>", false},
	{ThinkEnd, "</think>", false},
	{ToolCallStart, "<tool_call>", false},
	{ToolCallEnd, "</tool_call>", false},
	{ToolResponseStart, "<tool_response>", false},
	{ToolResponseEnd, "</tool_response>", false},
}

// matchOrder holds the added tokens longest first, for greedy matching.
var matchOrder = func() []AddedToken {
	m := append([]AddedToken(nil), addedTokens...)
	sort.SliceStable(m, func(i, j int) bool { return len(m[i].Content) > len(m[j].Content) })
	return m
}()

// AddedTokens returns the added tokens (ids 256..VocabSize-1) in id order.
func AddedTokens() []AddedToken { return append([]AddedToken(nil), addedTokens...) }

// EOSTokenIDs are the ids that end a generation unless ignore_eos is set:
// the tokenizer's eos (<|im_end|>) first, then generation_config.json's
// extra eos id (<|endoftext|>), as in Qwen3 checkpoints.
func EOSTokenIDs() []int { return []int{IMEnd, EndOfText} }

// SpecialIDs returns HF's all_special_ids for this tokenizer: eos, pad and
// the additional_special_tokens (<|im_start|>, <|im_end|>), ascending.
func SpecialIDs() []int { return []int{EndOfText, IMStart, IMEnd} }

// IsSpecial reports whether id is an added token flagged special (the ones
// skip_special_tokens drops).
func IsSpecial(id int) bool { return id >= 256 && id < VocabSize && addedTokens[id-256].Special }

// Encode tokenizes text: at each position the longest added-token string
// that matches is emitted as its id, otherwise the byte itself. There is no
// BOS or any other token added (Qwen3 adds none either).
func Encode(text string) []int {
	ids := make([]int, 0, len(text)) // at most a token a byte
	for i := 0; i < len(text); {
		id, size := int(text[i]), 1
		for _, t := range matchOrder {
			if strings.HasPrefix(text[i:], t.Content) {
				id, size = t.ID, len(t.Content)
				break
			}
		}
		ids = append(ids, id)
		i += size
	}
	return ids
}

// Decode is the inverse of Encode with special tokens kept
// (skip_special_tokens=false, what /detokenize does). Ids outside the
// vocabulary are skipped; use ValidIDs to check first.
func Decode(ids []int) string { return decode(ids, false) }

// DecodeSkipSpecial decodes dropping the tokens flagged special
// (skip_special_tokens=true); <think> and <tool_call> markers stay.
func DecodeSkipSpecial(ids []int) string { return decode(ids, true) }

func decode(ids []int, skipSpecial bool) string {
	var b strings.Builder
	b.Grow(len(ids)) // one byte a token, most of them: a prompt's text without regrowing
	for _, id := range ids {
		switch {
		case id >= 0 && id < 256:
			b.WriteByte(byte(id))
		case id >= 256 && id < VocabSize:
			if skipSpecial && IsSpecial(id) {
				continue
			}
			b.WriteString(addedTokens[id-256].Content)
		}
	}
	return b.String()
}

// ValidIDs returns the first id outside [0, VocabSize) and false, or -1, true.
func ValidIDs(ids []int) (int, bool) {
	for _, id := range ids {
		if id < 0 || id >= VocabSize {
			return id, false
		}
	}
	return -1, true
}

// byteToUnicode is GPT-2's bytes_to_unicode table: the printable pieces a
// byte-level BPE vocabulary uses (space is "Ġ", newline "Ċ").
var byteToUnicode = func() [256]string {
	var m [256]string
	n := 0
	for b := 0; b < 256; b++ {
		if (b >= '!' && b <= '~') || (b >= 0xA1 && b <= 0xAC) || (b >= 0xAE && b <= 0xFF) {
			m[b] = string(rune(b))
		} else {
			m[b] = string(rune(256 + n))
			n++
		}
	}
	return m
}()

// TokenPiece returns the vocabulary piece of id, as HF convert_ids_to_tokens
// does (what /tokenize returns in token_strs): the GPT-2 byte-level piece for
// ids below 256 ("Ġ" for a space), the content for added tokens.
func TokenPiece(id int) string {
	switch {
	case id >= 0 && id < 256:
		return byteToUnicode[id]
	case id >= 256 && id < VocabSize:
		return addedTokens[id-256].Content
	}
	return ""
}
