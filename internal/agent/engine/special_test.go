package engine

import (
	"os"
	"path/filepath"
	"testing"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
)

func TestLoadSpecialTokensQwen3(t *testing.T) {
	st, err := LoadSpecialTokens(filepath.Join("testdata", "qwen3"))
	require.NoError(t, err)
	assert.Equal(t, Token{ID: 151645, Content: "<|im_end|>"}, st.EOS)
	assert.Equal(t, Token{ID: 151643, Content: "<|endoftext|>"}, st.PAD)
	assert.Equal(t, int32(-1), st.BOS.ID)
	assert.Equal(t, int32(-1), st.UNK.ID)
	assert.Equal(t, []int32{151643, 151645}, st.StopIDs)
	assert.Equal(t, []int32{151643, 151644, 151645}, st.AllSpecialIDs)
	assert.Equal(t, []int32{151643, 151644, 151645}, st.AddedSpecialIDs)
	assert.Equal(t, int32(151644), st.IMStart)
	assert.Equal(t, int32(151645), st.IMEnd)
	assert.Equal(t, int32(151667), st.ThinkStart)
	assert.Equal(t, int32(151668), st.ThinkEnd)
	assert.Equal(t, int32(151666), st.ByContent["</tool_response>"], "tokenizer_config-only added token")
	assert.True(t, st.IsSpecial(151645))
	assert.False(t, st.IsSpecial(151668), "</think> is an added token but not special")
	assert.True(t, st.IsStop(151643))
	assert.False(t, st.IsStop(151644))
}

func writeFiles(t *testing.T, files map[string]string) string {
	t.Helper()
	dir := t.TempDir()
	for name, body := range files {
		require.NoError(t, os.WriteFile(filepath.Join(dir, name), []byte(body), 0o644))
	}
	return dir
}

func TestLoadSpecialTokensVariants(t *testing.T) {
	// Llama-style: eos in base vocab, generation_config eos as an int.
	dir := writeFiles(t, map[string]string{
		"tokenizer.json":         `{"added_tokens":[{"id":3,"content":"<|eot_id|>","special":true}],"model":{"vocab":{"</s>":2,"a":5}}}`,
		"tokenizer_config.json":  `{"eos_token":"</s>","additional_special_tokens":[{"content":"<|eot_id|>","special":true}]}`,
		"generation_config.json": `{"eos_token_id":3}`,
	})
	st, err := LoadSpecialTokens(dir)
	require.NoError(t, err)
	assert.Equal(t, Token{ID: 2, Content: "</s>"}, st.EOS)
	assert.Equal(t, []int32{2, 3}, st.StopIDs)
	assert.Equal(t, []int32{2, 3}, st.AllSpecialIDs)
	assert.Equal(t, int32(-1), st.IMEnd)
}

func TestLoadSpecialTokensErrors(t *testing.T) {
	for _, tc := range []struct {
		name  string
		files map[string]string
		want  []string
	}{
		{"empty dir", map[string]string{}, []string{"has none of tokenizer.json"}},
		{"bad json", map[string]string{"tokenizer_config.json": `{`}, []string{"tokenizer_config.json", "unexpected end"}},
		{"no added tokens", map[string]string{"generation_config.json": `{"eos_token_id":[1]}`}, []string{"no added tokens"}},
		{"eos unresolvable", map[string]string{"tokenizer.json": `{"added_tokens":[{"id":1,"content":"<a>","special":true}]}`, "tokenizer_config.json": `{"eos_token":"<eos>"}`},
			[]string{`eos_token "<eos>" has no id`}},
		{"no eos anywhere", map[string]string{"tokenizer.json": `{"added_tokens":[{"id":1,"content":"<a>","special":true}]}`}, []string{"no EOS"}},
		{"conflict", map[string]string{"tokenizer.json": `{"added_tokens":[{"id":1,"content":"<a>","special":true}]}`,
			"tokenizer_config.json": `{"added_tokens_decoder":{"2":{"content":"<a>","special":true}},"eos_token":"<a>"}`}, []string{"tokenizer_config.json gives \"<a>\" id 2", "tokenizer.json gives 1"}},
		{"bad gen eos", map[string]string{"tokenizer.json": `{"added_tokens":[{"id":1,"content":"<a>","special":true}]}`, "generation_config.json": `{"eos_token_id":"x"}`},
			[]string{"generation_config.json", "eos_token_id"}},
		{"bad added entry", map[string]string{"tokenizer.json": `{"added_tokens":[{"content":"<a>"}]}`}, []string{"tokenizer.json", "added_tokens[0] lacks id"}},
	} {
		t.Run(tc.name, func(t *testing.T) {
			_, err := LoadSpecialTokens(writeFiles(t, tc.files))
			require.Error(t, err)
			for _, w := range tc.want {
				assert.Contains(t, err.Error(), w)
			}
		})
	}
	_, err := LoadSpecialTokens(filepath.Join(t.TempDir(), "missing"))
	assert.ErrorContains(t, err, "missing")
}
