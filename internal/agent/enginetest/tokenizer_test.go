package enginetest

import (
	"encoding/json"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"testing"
)

func TestTokenizerRoundTrip(t *testing.T) {
	for _, s := range []string{"", "hello", "<|im_start|>user\nhé ✓<|im_end|>\n", "<think>x</think><tool_call>{}</tool_call>", "<|im_end", "<<think>>", "<tool_response>r</tool_response><|endoftext|>"} {
		if got := Decode(Encode(s)); got != s {
			t.Errorf("round trip %q → %q", s, got)
		}
	}
	got := Encode("a<|im_end|><think>\n")
	if want := []int{'a', IMEnd, ThinkStart, '\n'}; !slices.Equal(got, want) {
		t.Errorf("Encode = %v, want %v", got, want)
	}
	if got := Encode("<tool_call"); len(got) != len("<tool_call") {
		t.Errorf("partial marker should be bytes: %v", got)
	}
	if got := DecodeSkipSpecial([]int{IMStart, 'a', ThinkEnd, IMEnd, EndOfText}); got != "a</think>" {
		t.Errorf("DecodeSkipSpecial = %q", got)
	}
	if TokenPiece(' ') != "Ġ" || TokenPiece('\n') != "Ċ" || TokenPiece('a') != "a" || TokenPiece(IMEnd) != "<|im_end|>" {
		t.Errorf("pieces: %q %q %q", TokenPiece(' '), TokenPiece('\n'), TokenPiece(IMEnd))
	}
	if !slices.Equal(SpecialIDs(), []int{256, 257, 258}) || IsSpecial(ThinkStart) || !IsSpecial(IMEnd) {
		t.Error("special flags")
	}
}

func TestWriteTokenizerFiles(t *testing.T) {
	dir := t.TempDir()
	if err := WriteTokenizerFiles(dir); err != nil {
		t.Fatal(err)
	}
	read := func(name string, v any) {
		data, err := os.ReadFile(filepath.Join(dir, name))
		if err != nil {
			t.Fatal(err)
		}
		if err := json.Unmarshal(data, v); err != nil {
			t.Fatalf("%s: %v", name, err)
		}
	}
	var cfg struct {
		AddedTokensDecoder map[string]struct {
			Content string `json:"content"`
			Special bool   `json:"special"`
		} `json:"added_tokens_decoder"`
		EOS        string   `json:"eos_token"`
		Pad        string   `json:"pad_token"`
		Additional []string `json:"additional_special_tokens"`
	}
	read("tokenizer_config.json", &cfg)
	if cfg.EOS != "<|im_end|>" || cfg.Pad != "<|endoftext|>" || len(cfg.Additional) != 2 {
		t.Errorf("tokenizer_config: %+v", cfg)
	}
	for _, at := range AddedTokens() {
		d := cfg.AddedTokensDecoder[jsonInt(at.ID)]
		if d.Content != at.Content || d.Special != at.Special {
			t.Errorf("added_tokens_decoder[%d] = %+v", at.ID, d)
		}
	}
	var gen struct {
		EOS []int `json:"eos_token_id"`
	}
	read("generation_config.json", &gen)
	if !slices.Equal(gen.EOS, []int{IMEnd, EndOfText}) {
		t.Errorf("eos_token_id = %v", gen.EOS)
	}
	var tok struct {
		AddedTokens []struct {
			ID      int    `json:"id"`
			Content string `json:"content"`
			Special bool   `json:"special"`
		} `json:"added_tokens"`
		Model struct {
			Vocab map[string]int `json:"vocab"`
		} `json:"model"`
	}
	read("tokenizer.json", &tok)
	if len(tok.AddedTokens) != VocabSize-256 || tok.AddedTokens[2].ID != IMEnd || !tok.AddedTokens[2].Special || len(tok.Model.Vocab) != 256 || tok.Model.Vocab["Ġ"] != ' ' {
		t.Errorf("tokenizer.json: %+v", tok.AddedTokens)
	}
	var stm struct {
		EOS struct {
			Content string `json:"content"`
		} `json:"eos_token"`
	}
	read("special_tokens_map.json", &stm)
	if stm.EOS.Content != "<|im_end|>" {
		t.Errorf("special_tokens_map: %+v", stm)
	}
}

func jsonInt(i int) string { b, _ := json.Marshal(i); return string(b) }

// referenceEncode is Encode as first written, a position at a time: the
// oracle the faster Encode is held to.
func referenceEncode(text string) []int {
	ids := make([]int, 0, len(text))
	for i := 0; i < len(text); {
		matched := false
		for _, t := range matchOrder {
			if strings.HasPrefix(text[i:], t.Content) {
				ids, i, matched = append(ids, t.ID), i+len(t.Content), true
				break
			}
		}
		if !matched {
			ids, i = append(ids, int(text[i])), i+1
		}
	}
	return ids
}

var encodeCases = []string{"", "<", "<<", "a<", "<|im_end|>", "<|im_end", "x<|im_start|>user\nhi<|im_end|>\n", "<think></think><tool_call>",
	"</tool_response><tool_response>", "<<|endoftext|>>", "é<think>\xff", "<tool_call", "a < b <= c"}

func TestEncodeReference(t *testing.T) {
	for _, in := range encodeCases {
		checkEncode(t, in)
	}
}

func checkEncode(t *testing.T, in string) {
	if got, want := Encode(in), referenceEncode(in); !slices.Equal(got, want) {
		t.Fatalf("Encode(%q) = %v, want %v", in, got, want)
	}
}

func FuzzEncode(f *testing.F) {
	for _, in := range encodeCases {
		f.Add(in)
	}
	f.Fuzz(checkEncode)
}
