package engine

import (
	"encoding/json"
	"errors"
	"fmt"
	"io/fs"
	"os"
	"path/filepath"
	"slices"
	"strconv"
)

// SpecialTokens are the ids kiln's adapter needs from the served checkpoint
// (docs/engine-wire.md §7: there is no endpoint that lists them; the checkpoint's
// tokenizer files are the authoritative source).
type SpecialTokens struct {
	// EOS, BOS, PAD, UNK are the tokenizer's named specials (ID -1 and
	// Content "" when the checkpoint names none).
	EOS, BOS, PAD, UNK Token
	// StopIDs are the ids that end a turn: the tokenizer's EOS plus every
	// generation_config.json eos_token_id — vLLM stops on all of them
	// (docs/engine-wire.md §5.3). Sorted, unique.
	StopIDs []int32
	// AllSpecialIDs follows HF all_special_ids: the named specials plus
	// additional_special_tokens. The reference adapter's prefix reuse uses
	// this set (docs/adapter.md §1.6, §3). Sorted, unique.
	AllSpecialIDs []int32
	// AddedSpecialIDs are every added token flagged special:true, a superset
	// of what AllSpecialIDs may miss (docs/engine-wire.md §7 note). Sorted, unique.
	AddedSpecialIDs []int32
	// ChatML-style and reasoning markers, -1 when absent.
	IMStart, IMEnd, ThinkStart, ThinkEnd int32
	// ByContent maps every added token's text (and resolved named special)
	// to its id.
	ByContent map[string]int32
}

// Token is a named special token.
type Token struct {
	ID      int32
	Content string
}

// IsSpecial reports whether id is in AllSpecialIDs.
func (s *SpecialTokens) IsSpecial(id int32) bool {
	_, ok := slices.BinarySearch(s.AllSpecialIDs, id)
	return ok
}

// IsStop reports whether id is in StopIDs.
func (s *SpecialTokens) IsStop(id int32) bool {
	_, ok := slices.BinarySearch(s.StopIDs, id)
	return ok
}

// LoadSpecialTokens reads dir's tokenizer.json (added_tokens, and model.vocab
// for named tokens that are not added tokens), tokenizer_config.json
// (added_tokens_decoder, named specials, additional_special_tokens),
// special_tokens_map.json (named specials; read after tokenizer_config.json
// and preferred where both name one) and generation_config.json
// (eos_token_id, int or list). Each file may be absent, but some file must
// give added tokens and some must name an EOS.
func LoadSpecialTokens(dir string) (SpecialTokens, error) {
	st := SpecialTokens{
		EOS: Token{ID: -1}, BOS: Token{ID: -1}, PAD: Token{ID: -1}, UNK: Token{ID: -1},
		IMStart: -1, IMEnd: -1, ThinkStart: -1, ThinkEnd: -1,
		ByContent: map[string]int32{},
	}
	if fi, err := os.Stat(dir); err != nil {
		return st, fmt.Errorf("engine: tokenizer dir: %w", err)
	} else if !fi.IsDir() {
		return st, fmt.Errorf("engine: tokenizer dir %s is not a directory", dir)
	}
	source := map[string]string{} // content -> file that gave its id
	special := map[int32]bool{}
	add := func(file, content string, id int64, isSpecial bool) error {
		if id < 0 || id > 1<<31-1 {
			return fmt.Errorf("engine: %s: token %q has id %d", filepath.Join(dir, file), content, id)
		}
		if prev, ok := st.ByContent[content]; ok && prev != int32(id) {
			return fmt.Errorf("engine: %s gives %q id %d but %s gives %d", filepath.Join(dir, file), content, id, filepath.Join(dir, source[content]), prev)
		}
		st.ByContent[content] = int32(id)
		source[content] = file
		if isSpecial {
			special[int32(id)] = true
		}
		return nil
	}

	// tokenizer.json
	var tj struct {
		AddedTokens []struct {
			ID      *int64 `json:"id"`
			Content string `json:"content"`
			Special bool   `json:"special"`
		} `json:"added_tokens"`
		Model struct {
			Vocab json.RawMessage `json:"vocab"`
		} `json:"model"`
	}
	haveTJ, err := readJSON(dir, "tokenizer.json", &tj)
	if err != nil {
		return st, err
	}
	for i, t := range tj.AddedTokens {
		if t.ID == nil || t.Content == "" {
			return st, fmt.Errorf("engine: %s: added_tokens[%d] lacks id or content", filepath.Join(dir, "tokenizer.json"), i)
		}
		if err := add("tokenizer.json", t.Content, *t.ID, t.Special); err != nil {
			return st, err
		}
	}

	// tokenizer_config.json
	var tc map[string]json.RawMessage
	haveTC, err := readJSON(dir, "tokenizer_config.json", &tc)
	if err != nil {
		return st, err
	}
	if raw, ok := tc["added_tokens_decoder"]; ok && !isNull(raw) {
		var dec map[string]struct {
			Content string `json:"content"`
			Special bool   `json:"special"`
		}
		if err := json.Unmarshal(raw, &dec); err != nil {
			return st, fmt.Errorf("engine: %s: added_tokens_decoder: %w", filepath.Join(dir, "tokenizer_config.json"), err)
		}
		keys := make([]string, 0, len(dec))
		for k := range dec {
			keys = append(keys, k)
		}
		slices.Sort(keys)
		for _, k := range keys {
			id, err := strconv.ParseInt(k, 10, 64)
			if err != nil || dec[k].Content == "" {
				return st, fmt.Errorf("engine: %s: added_tokens_decoder entry %q lacks a numeric id or content", filepath.Join(dir, "tokenizer_config.json"), k)
			}
			if err := add("tokenizer_config.json", dec[k].Content, id, dec[k].Special); err != nil {
				return st, err
			}
		}
	}
	named := map[string]string{} // eos_token etc. -> content
	var additional []string
	readNamed := func(file string, m map[string]json.RawMessage) error {
		for _, key := range []string{"eos_token", "bos_token", "pad_token", "unk_token", "sep_token", "cls_token", "mask_token"} {
			raw, ok := m[key]
			if !ok || isNull(raw) {
				continue
			}
			s, err := tokenContent(raw)
			if err != nil {
				return fmt.Errorf("engine: %s: %s: %w", filepath.Join(dir, file), key, err)
			}
			named[key] = s
		}
		for _, key := range []string{"additional_special_tokens", "extra_special_tokens"} {
			raw, ok := m[key]
			if !ok || isNull(raw) {
				continue
			}
			var list []json.RawMessage
			if err := json.Unmarshal(raw, &list); err != nil {
				continue // extra_special_tokens may be a name->token map; not a list of specials
			}
			additional = additional[:0]
			for i, r := range list {
				s, err := tokenContent(r)
				if err != nil {
					return fmt.Errorf("engine: %s: %s[%d]: %w", filepath.Join(dir, file), key, i, err)
				}
				additional = append(additional, s)
			}
		}
		return nil
	}
	if err := readNamed("tokenizer_config.json", tc); err != nil {
		return st, err
	}
	var stm map[string]json.RawMessage
	haveSTM, err := readJSON(dir, "special_tokens_map.json", &stm)
	if err != nil {
		return st, err
	}
	if err := readNamed("special_tokens_map.json", stm); err != nil {
		return st, err
	}

	// generation_config.json
	var gc struct {
		EOS json.RawMessage `json:"eos_token_id"`
	}
	haveGC, err := readJSON(dir, "generation_config.json", &gc)
	if err != nil {
		return st, err
	}
	var genEOS []int64
	if !isNull(gc.EOS) {
		var one int64
		if json.Unmarshal(gc.EOS, &one) == nil {
			genEOS = []int64{one}
		} else if err := json.Unmarshal(gc.EOS, &genEOS); err != nil {
			return st, fmt.Errorf("engine: %s: eos_token_id %s is neither an int nor a list of ints", filepath.Join(dir, "generation_config.json"), clip(gc.EOS, 40))
		}
	}

	if !haveTJ && !haveTC && !haveSTM && !haveGC {
		return st, fmt.Errorf("engine: %s has none of tokenizer.json, tokenizer_config.json, special_tokens_map.json, generation_config.json", dir)
	}
	if len(st.ByContent) == 0 {
		return st, fmt.Errorf("engine: %s: no added tokens (tokenizer.json added_tokens and tokenizer_config.json added_tokens_decoder are both missing or empty)", dir)
	}

	// Resolve named tokens: added tokens first, else the base vocab.
	var vocab map[string]int64
	resolve := func(what, content string) (int32, error) {
		if id, ok := st.ByContent[content]; ok {
			return id, nil
		}
		if vocab == nil && len(tj.Model.Vocab) > 0 {
			vocab = map[string]int64{}
			if json.Unmarshal(tj.Model.Vocab, &vocab) != nil {
				var uni [][]json.RawMessage // Unigram: [[piece, score], ...], index = id
				if json.Unmarshal(tj.Model.Vocab, &uni) == nil {
					for i, p := range uni {
						var s string
						if len(p) > 0 && json.Unmarshal(p[0], &s) == nil {
							vocab[s] = int64(i)
						}
					}
				}
			}
		}
		if id, ok := vocab[content]; ok && id >= 0 && id <= 1<<31-1 {
			st.ByContent[content] = int32(id)
			return int32(id), nil
		}
		return -1, fmt.Errorf("engine: %s: %s %q has no id in tokenizer.json added_tokens or model.vocab, nor in tokenizer_config.json added_tokens_decoder", dir, what, content)
	}
	all := map[int32]bool{}
	for key, content := range named {
		id, err := resolve(key, content)
		if err != nil {
			return st, err
		}
		all[id] = true
		t := Token{ID: id, Content: content}
		switch key {
		case "eos_token":
			st.EOS = t
		case "bos_token":
			st.BOS = t
		case "pad_token":
			st.PAD = t
		case "unk_token":
			st.UNK = t
		}
	}
	for _, content := range additional {
		id, err := resolve("additional_special_tokens entry", content)
		if err != nil {
			return st, err
		}
		all[id] = true
	}
	stops := map[int32]bool{}
	if st.EOS.ID >= 0 {
		stops[st.EOS.ID] = true
	}
	for _, id := range genEOS {
		if id < 0 || id > 1<<31-1 {
			return st, fmt.Errorf("engine: %s: eos_token_id %d", filepath.Join(dir, "generation_config.json"), id)
		}
		stops[int32(id)] = true
	}
	if len(stops) == 0 {
		return st, fmt.Errorf("engine: %s: no EOS: neither tokenizer_config.json / special_tokens_map.json eos_token nor generation_config.json eos_token_id", dir)
	}
	st.StopIDs = sortedIDs(stops)
	st.AllSpecialIDs = sortedIDs(all)
	st.AddedSpecialIDs = sortedIDs(special)
	lookup := func(s string) int32 {
		if id, ok := st.ByContent[s]; ok {
			return id
		}
		return -1
	}
	st.IMStart, st.IMEnd = lookup("<|im_start|>"), lookup("<|im_end|>")
	st.ThinkStart, st.ThinkEnd = lookup("<think>"), lookup("</think>")
	return st, nil
}

// tokenContent reads a named special: a string, or an AddedToken object
// {"content": ...}.
func tokenContent(raw json.RawMessage) (string, error) {
	var s string
	if json.Unmarshal(raw, &s) == nil {
		if s == "" {
			return "", errors.New("empty token")
		}
		return s, nil
	}
	var obj struct {
		Content string `json:"content"`
	}
	if err := json.Unmarshal(raw, &obj); err != nil || obj.Content == "" {
		return "", fmt.Errorf("%s is neither a string nor an object with content", clip(raw, 60))
	}
	return obj.Content, nil
}

// readJSON decodes dir/name into v; a missing file is (false, nil).
func readJSON(dir, name string, v any) (bool, error) {
	p := filepath.Join(dir, name)
	b, err := os.ReadFile(p)
	if errors.Is(err, fs.ErrNotExist) {
		return false, nil
	}
	if err != nil {
		return false, fmt.Errorf("engine: %w", err)
	}
	if err := json.Unmarshal(b, v); err != nil {
		return false, fmt.Errorf("engine: %s: %w", p, err)
	}
	return true, nil
}

func sortedIDs(m map[int32]bool) []int32 {
	out := make([]int32, 0, len(m))
	for id := range m {
		out = append(out, id)
	}
	slices.Sort(out)
	return out
}
