package enginetest

import (
	"fmt"
	"os"
	"path/filepath"

	"github.com/kilnrl/kiln/internal/ojson"
)

// WriteTokenizerFiles writes the checkpoint-side tokenizer files in the
// shapes docs/engine-wire.md §7 says clients read, so a client learns the special
// ids from them as it would from a Qwen3 checkpoint:
//
//   - tokenizer_config.json: added_tokens_decoder {"<id>": {content,
//     lstrip, normalized, rstrip, single_word, special}}, eos_token
//     "<|im_end|>", pad_token "<|endoftext|>", bos_token null,
//     additional_special_tokens, model_max_length, tokenizer_class;
//   - special_tokens_map.json: the named specials and
//     additional_special_tokens;
//   - generation_config.json: eos_token_id [258, 256] (a list, as Qwen3),
//     pad_token_id, bos_token_id;
//   - tokenizer.json: added_tokens [{id, content, single_word, lstrip,
//     rstrip, normalized, special}] plus a byte-level BPE model whose vocab
//     is the 256 GPT-2 byte pieces and no merges (the same ids Encode gives
//     for text without added tokens).
//
// No chat_template is written: the template lives in Go (ChatTemplate).
func WriteTokenizerFiles(dir string) error {
	if err := os.MkdirAll(dir, 0o755); err != nil {
		return err
	}
	decoder := &ojson.Object{}
	var added []any
	for _, t := range addedTokens {
		decoder.Set(fmt.Sprint(t.ID), ojson.Obj("content", t.Content, "lstrip", false, "normalized", false,
			"rstrip", false, "single_word", false, "special", t.Special))
		added = append(added, ojson.Obj("id", t.ID, "content", t.Content, "single_word", false, "lstrip", false,
			"rstrip", false, "normalized", false, "special", t.Special))
	}
	additional := []string{"<|im_start|>", "<|im_end|>"}
	vocab := &ojson.Object{}
	for b := 0; b < 256; b++ {
		vocab.Set(byteToUnicode[b], b)
	}
	files := map[string]any{
		"tokenizer_config.json": ojson.Obj(
			"add_bos_token", false, "add_prefix_space", false,
			"added_tokens_decoder", decoder,
			"additional_special_tokens", additional,
			"bos_token", nil, "clean_up_tokenization_spaces", false,
			"eos_token", "<|im_end|>", "errors", "replace",
			"model_max_length", 131072, "pad_token", "<|endoftext|>",
			"split_special_tokens", false, "tokenizer_class", "Qwen2Tokenizer", "unk_token", nil),
		"special_tokens_map.json": ojson.Obj(
			"additional_special_tokens", additional,
			"eos_token", ojson.Obj("content", "<|im_end|>", "lstrip", false, "normalized", false, "rstrip", false, "single_word", false),
			"pad_token", ojson.Obj("content", "<|endoftext|>", "lstrip", false, "normalized", false, "rstrip", false, "single_word", false)),
		"generation_config.json": ojson.Obj(
			"bos_token_id", EndOfText, "do_sample", true, "eos_token_id", EOSTokenIDs(),
			"pad_token_id", EndOfText, "temperature", 0.6, "top_k", 20, "top_p", 0.95,
			"transformers_version", "4.51.0"),
		"tokenizer.json": ojson.Obj(
			"version", "1.0", "truncation", nil, "padding", nil,
			"added_tokens", added,
			"normalizer", nil,
			"pre_tokenizer", ojson.Obj("type", "ByteLevel", "add_prefix_space", false, "trim_offsets", false, "use_regex", false),
			"post_processor", nil,
			"decoder", ojson.Obj("type", "ByteLevel", "add_prefix_space", false, "trim_offsets", false, "use_regex", false),
			"model", ojson.Obj("type", "BPE", "dropout", nil, "unk_token", nil, "continuing_subword_prefix", nil,
				"end_of_word_suffix", nil, "fuse_unk", false, "byte_fallback", false, "ignore_merges", false,
				"vocab", vocab, "merges", []any{})),
	}
	for name, v := range files {
		if err := os.WriteFile(filepath.Join(dir, name), append(ojson.Marshal(v), '\n'), 0o644); err != nil {
			return err
		}
	}
	return nil
}
