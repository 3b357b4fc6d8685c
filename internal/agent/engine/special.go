package engine

import (
	"encoding/json"
	"errors"
	"fmt"
	"io/fs"
	"maps"
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
	l := &specialLoader{dir: dir, source: map[string]string{}, special: map[int32]bool{}, named: map[string]string{}}
	l.st = SpecialTokens{
		EOS: Token{ID: -1}, BOS: Token{ID: -1}, PAD: Token{ID: -1}, UNK: Token{ID: -1},
		IMStart: -1, IMEnd: -1, ThinkStart: -1, ThinkEnd: -1,
		ByContent: map[string]int32{},
	}
	if fi, err := os.Stat(dir); err != nil {
		return l.st, fmt.Errorf("engine: tokenizer dir: %w", err)
	} else if !fi.IsDir() {
		return l.st, fmt.Errorf("engine: tokenizer dir %s is not a directory", dir)
	}
	haveTJ, err := l.tokenizerJSON()
	if err != nil {
		return l.st, err
	}
	haveTC, err := l.tokenizerConfig()
	if err != nil {
		return l.st, err
	}
	var stm map[string]json.RawMessage
	haveSTM, err := readJSON(dir, "special_tokens_map.json", &stm)
	if err != nil {
		return l.st, err
	}
	if err := l.readNamed("special_tokens_map.json", stm); err != nil {
		return l.st, err
	}
	genEOS, haveGC, err := l.generationEOS()
	if err != nil {
		return l.st, err
	}
	if !haveTJ && !haveTC && !haveSTM && !haveGC {
		return l.st, fmt.Errorf("engine: %s has none of tokenizer.json, tokenizer_config.json, special_tokens_map.json, generation_config.json", dir)
	}
	if len(l.st.ByContent) == 0 {
		return l.st, fmt.Errorf("engine: %s: no added tokens (tokenizer.json added_tokens and tokenizer_config.json added_tokens_decoder are both missing or empty)", dir)
	}
	return l.finish(genEOS)
}

// specialLoader is LoadSpecialTokens' state across the files it reads.
type specialLoader struct {
	dir     string
	st      SpecialTokens
	source  map[string]string // content -> file that gave its id
	special map[int32]bool    // the added tokens marked special
	// named are eos_token etc. -> content; additional the
	// additional_special_tokens (the last file's list wins)
	named      map[string]string
	additional []string
	// vocabRaw is tokenizer.json's model.vocab, decoded into vocab on
	// the first named token that is not an added token
	vocabRaw json.RawMessage
	vocab    map[string]int64
}

// add records an added token read from file.
func (l *specialLoader) add(file, content string, id int64, isSpecial bool) error {
	if id < 0 || id > 1<<31-1 {
		return fmt.Errorf("engine: %s: token %q has id %d", filepath.Join(l.dir, file), content, id)
	}
	if prev, ok := l.st.ByContent[content]; ok && prev != int32(id) {
		return fmt.Errorf("engine: %s gives %q id %d but %s gives %d", filepath.Join(l.dir, file), content, id, filepath.Join(l.dir, l.source[content]), prev)
	}
	l.st.ByContent[content] = int32(id)
	l.source[content] = file
	if isSpecial {
		l.special[int32(id)] = true
	}
	return nil
}

// tokenizerJSON reads tokenizer.json's added_tokens and keeps its
// model.vocab; false when the file is absent.
func (l *specialLoader) tokenizerJSON() (bool, error) {
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
	have, err := readJSON(l.dir, "tokenizer.json", &tj)
	if err != nil {
		return false, err
	}
	for i, t := range tj.AddedTokens {
		if t.ID == nil || t.Content == "" {
			return false, fmt.Errorf("engine: %s: added_tokens[%d] lacks id or content", filepath.Join(l.dir, "tokenizer.json"), i)
		}
		if err := l.add("tokenizer.json", t.Content, *t.ID, t.Special); err != nil {
			return false, err
		}
	}
	l.vocabRaw = tj.Model.Vocab
	return have, nil
}

// tokenizerConfig reads tokenizer_config.json's added_tokens_decoder (in
// id order) and its named specials; false when the file is absent.
func (l *specialLoader) tokenizerConfig() (bool, error) {
	const file = "tokenizer_config.json"
	var tc map[string]json.RawMessage
	have, err := readJSON(l.dir, file, &tc)
	if err != nil {
		return false, err
	}
	if raw, ok := tc["added_tokens_decoder"]; ok && !isNull(raw) {
		var dec map[string]struct {
			Content string `json:"content"`
			Special bool   `json:"special"`
		}
		if err := json.Unmarshal(raw, &dec); err != nil {
			return false, fmt.Errorf("engine: %s: added_tokens_decoder: %w", filepath.Join(l.dir, file), err)
		}
		for _, k := range slices.Sorted(maps.Keys(dec)) {
			id, err := strconv.ParseInt(k, 10, 64)
			if err != nil || dec[k].Content == "" {
				return false, fmt.Errorf("engine: %s: added_tokens_decoder entry %q lacks a numeric id or content", filepath.Join(l.dir, file), k)
			}
			if err := l.add(file, dec[k].Content, id, dec[k].Special); err != nil {
				return false, err
			}
		}
	}
	return have, l.readNamed(file, tc)
}

// readNamed reads the named specials (eos_token, ...) and the additional
// special tokens of a tokenizer_config.json or special_tokens_map.json.
func (l *specialLoader) readNamed(file string, m map[string]json.RawMessage) error {
	for _, key := range []string{"eos_token", "bos_token", "pad_token", "unk_token", "sep_token", "cls_token", "mask_token"} {
		raw, ok := m[key]
		if !ok || isNull(raw) {
			continue
		}
		s, err := tokenContent(raw)
		if err != nil {
			return fmt.Errorf("engine: %s: %s: %w", filepath.Join(l.dir, file), key, err)
		}
		l.named[key] = s
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
		l.additional = l.additional[:0]
		for i, r := range list {
			s, err := tokenContent(r)
			if err != nil {
				return fmt.Errorf("engine: %s: %s[%d]: %w", filepath.Join(l.dir, file), key, i, err)
			}
			l.additional = append(l.additional, s)
		}
	}
	return nil
}

// generationEOS reads generation_config.json's eos_token_id (an int or a
// list); false when the file is absent.
func (l *specialLoader) generationEOS() ([]int64, bool, error) {
	var gc struct {
		EOS json.RawMessage `json:"eos_token_id"`
	}
	have, err := readJSON(l.dir, "generation_config.json", &gc)
	if err != nil || isNull(gc.EOS) {
		return nil, have, err
	}
	var one int64
	if json.Unmarshal(gc.EOS, &one) == nil {
		return []int64{one}, have, nil
	}
	var ids []int64
	if err := json.Unmarshal(gc.EOS, &ids); err != nil {
		return nil, have, fmt.Errorf("engine: %s: eos_token_id %s is neither an int nor a list of ints", filepath.Join(l.dir, "generation_config.json"), clip(gc.EOS, 40))
	}
	return ids, have, nil
}

// resolve is a named token's id: an added token's, else the base vocab's
// (a BPE map, or a Unigram list whose index is the id).
func (l *specialLoader) resolve(what, content string) (int32, error) {
	if id, ok := l.st.ByContent[content]; ok {
		return id, nil
	}
	if l.vocab == nil && len(l.vocabRaw) > 0 {
		l.vocab = map[string]int64{}
		if json.Unmarshal(l.vocabRaw, &l.vocab) != nil {
			var uni [][]json.RawMessage // Unigram: [[piece, score], ...], index = id
			if json.Unmarshal(l.vocabRaw, &uni) == nil {
				for i, p := range uni {
					var s string
					if len(p) > 0 && json.Unmarshal(p[0], &s) == nil {
						l.vocab[s] = int64(i)
					}
				}
			}
		}
	}
	if id, ok := l.vocab[content]; ok && id >= 0 && id <= 1<<31-1 {
		l.st.ByContent[content] = int32(id)
		return int32(id), nil
	}
	return -1, fmt.Errorf("engine: %s: %s %q has no id in tokenizer.json added_tokens or model.vocab, nor in tokenizer_config.json added_tokens_decoder", l.dir, what, content)
}

// finish resolves the named and additional specials and the stop ids
// (the EOS and generation_config.json's eos_token_id).
func (l *specialLoader) finish(genEOS []int64) (SpecialTokens, error) {
	st := &l.st
	all := map[int32]bool{}
	for key, content := range l.named {
		id, err := l.resolve(key, content)
		if err != nil {
			return *st, err
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
	for _, content := range l.additional {
		id, err := l.resolve("additional_special_tokens entry", content)
		if err != nil {
			return *st, err
		}
		all[id] = true
	}
	stops := map[int32]bool{}
	if st.EOS.ID >= 0 {
		stops[st.EOS.ID] = true
	}
	for _, id := range genEOS {
		if id < 0 || id > 1<<31-1 {
			return *st, fmt.Errorf("engine: %s: eos_token_id %d", filepath.Join(l.dir, "generation_config.json"), id)
		}
		stops[int32(id)] = true
	}
	if len(stops) == 0 {
		return *st, fmt.Errorf("engine: %s: no EOS: neither tokenizer_config.json / special_tokens_map.json eos_token nor generation_config.json eos_token_id", l.dir)
	}
	st.StopIDs = sortedIDs(stops)
	st.AllSpecialIDs = sortedIDs(all)
	st.AddedSpecialIDs = sortedIDs(l.special)
	lookup := func(s string) int32 {
		if id, ok := st.ByContent[s]; ok {
			return id
		}
		return -1
	}
	st.IMStart, st.IMEnd = lookup("<|im_start|>"), lookup("<|im_end|>")
	st.ThinkStart, st.ThinkEnd = lookup("<think>"), lookup("</think>")
	return *st, nil
}

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
