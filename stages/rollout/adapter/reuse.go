package adapter

import (
	"bytes"
	"context"
	"crypto/sha256"
	"encoding/json"
	"errors"
	"slices"
	"sort"
	"strings"

	"github.com/kilnrl/kiln/stages/rollout/engine"
)

type digest = [sha256.Size]byte

// prefix is one stored prompt prefix (spec §3 "State"): the hashes of the
// turn's translated request messages plus its assistant message, the hash of
// its tool list, and the recorded turn it came from.
type prefix struct {
	msgs  []digest
	tools digest
	key   digest // hash of msgs and tools together (ambiguity check)
	turn  int    // index into session.turns
}

// canonicalHash hashes one JSON value so that deep-equal values (object
// keys in any order, spec §3 step 3) hash alike.
func canonicalHash(raw []byte) digest {
	dec := json.NewDecoder(bytes.NewReader(raw))
	dec.UseNumber()
	var v any
	if err := dec.Decode(&v); err != nil {
		// Not JSON: hash the bytes, prefixed so it never equals a value.
		return sha256.Sum256(append([]byte{0}, raw...))
	}
	var buf bytes.Buffer
	enc := json.NewEncoder(&buf)
	enc.SetEscapeHTML(false)
	_ = enc.Encode(v) // maps encode with sorted keys
	return sha256.Sum256(buf.Bytes())
}

func hashMessages(msgs []json.RawMessage) []digest {
	out := make([]digest, len(msgs))
	for i, m := range msgs {
		out[i] = canonicalHash(m)
	}
	return out
}

// hashTools hashes a tool list; nil and empty hash alike (null).
func hashTools(tools []json.RawMessage) digest {
	if len(tools) == 0 {
		return sha256.Sum256([]byte("null"))
	}
	h := sha256.New()
	h.Write([]byte("tools"))
	for _, t := range tools {
		d := canonicalHash(t)
		h.Write(d[:])
	}
	var d digest
	h.Sum(d[:0])
	return d
}

func prefixKey(msgs []digest, tools digest) digest {
	h := sha256.New()
	h.Write(tools[:])
	for _, m := range msgs {
		h.Write(m[:])
	}
	var d digest
	h.Sum(d[:0])
	return d
}

// renderFunc renders messages with the session's tools and kwargs.
type renderFunc func(ctx context.Context, msgs []json.RawMessage, addGenerationPrompt bool) ([]int32, error)

// reusePrompt is spec §3's algorithm. full is R, the canonical render with
// the generation prompt (step 1, already computed by the caller). It
// returns the prompt ids and whether a stored prefix was reused.
func (s *Server) reusePrompt(ctx context.Context, sess *session, msgs []json.RawMessage, msgHashes []digest,
	toolsHash digest, full []int32, render renderFunc) ([]int32, bool, error) {
	if len(sess.prefixes) == 0 {
		return full, false, nil
	}
	order := make([]int, len(sess.prefixes))
	for i := range order {
		order[i] = i
	}
	// Step 3: depth descending, stable.
	sort.SliceStable(order, func(a, b int) bool {
		return len(sess.prefixes[order[a]].msgs) > len(sess.prefixes[order[b]].msgs)
	})
	attempts := 0
	for _, i := range order {
		p := &sess.prefixes[i]
		d := len(p.msgs)
		t := &sess.turns[p.turn]
		if p.tools != toolsHash || d >= len(msgs) || !slices.Equal(p.msgs, msgHashes[:d]) ||
			t.FinishReason != "stop" || len(t.OutputIDs) == 0 || !s.specials[t.OutputIDs[len(t.OutputIDs)-1]] {
			continue
		}
		if s.ambiguous(sess, i) { // step 4
			continue
		}
		if attempts >= s.opts.ReuseAttempts {
			break // /tokenize budget spent: canonical render
		}
		attempts++
		// Step 5.
		anchor, err := render(ctx, msgs[:d], false)
		if err != nil {
			if ctx.Err() != nil {
				return nil, false, ctx.Err()
			}
			var he *engine.HTTPError
			if errors.As(err, &he) && he.Status < 500 {
				continue // the template refuses this prefix: not reusable
			}
			return nil, false, err
		}
		if len(anchor) > len(full) || !slices.Equal(full[:len(anchor)], anchor) {
			continue
		}
		// Step 6.
		last := t.OutputIDs[len(t.OutputIDs)-1]
		end := -1
		for j := len(anchor) - 1; j >= 0; j-- {
			if anchor[j] == last {
				end = j
				break
			}
		}
		if end < 0 {
			continue
		}
		if end+1 < len(anchor) {
			tail, err := s.opts.Engine.Detokenize(ctx, anchor[end+1:])
			if err != nil {
				return nil, false, err
			}
			if strings.TrimSpace(tail) != "" {
				continue
			}
		}
		// Step 7.
		out := make([]int32, 0, len(t.PromptIDs)+len(t.OutputIDs)+len(full)-end-1)
		out = append(out, t.PromptIDs...)
		out = append(out, t.OutputIDs...)
		out = append(out, full[end+1:]...)
		return out, true, nil
	}
	return full, false, nil // step 8
}

// ambiguous is spec §3 step 4: another stored prefix with identical messages
// and tools whose turn has different prompt or output ids.
func (s *Server) ambiguous(sess *session, i int) bool {
	p := &sess.prefixes[i]
	t := &sess.turns[p.turn]
	for j := range sess.prefixes {
		q := &sess.prefixes[j]
		if j == i || q.key != p.key {
			continue
		}
		u := &sess.turns[q.turn]
		if !slices.Equal(t.PromptIDs, u.PromptIDs) || !slices.Equal(t.OutputIDs, u.OutputIDs) {
			return true
		}
	}
	return false
}
