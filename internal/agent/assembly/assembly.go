package assembly

import (
	"bytes"
	"encoding/json"
	"errors"
	"fmt"

	"github.com/kilnrl/kiln/formats/records"
	"github.com/kilnrl/kiln/internal/ojson"
)

// Turn is one model call of a session (the turns record kind).
//
// Record keeps the slices of a Turn without copying them: the caller must not
// modify them afterwards.
type Turn struct {
	PromptIDs       []int32
	OutputIDs       []int32
	OutputLogProbs  []float32 // empty or len(OutputIDs)
	FinishReason    string    // "stop", "length", "tool_calls", ...
	IllFormed       bool
	PromptMessages  []json.RawMessage // chat messages after protocol translation; each a JSON object with "role"
	ResponseMessage json.RawMessage   // parsed assistant message; nil or "null" = none

	// Replay is the optional replay data (nil columns when absent): top-p
	// CSR over the outputs (offsets len(OutputIDs)+1), top-k heads
	// [len(OutputIDs), TopK], routes [len(prompt)+len(output)-1, layers, topk].
	records.Replay
}

// Options of one assembly run.
type Options struct {
	// ForkMergeMaxResponseTokens is the threshold T of docs/assembly.md §2.4: a rewritten
	// assistant message absorbs the generated leaf it replaces, and a token
	// drift inside the most recent response is realigned in place, only when
	// that response is shorter than T tokens. kiln's default is 0: every drift
	// forks a new segment and no sampled token is discarded.
	ForkMergeMaxResponseTokens int
}

// Base identifies the agent run the session belongs to.
type Base struct {
	RolloutID, Index, GroupIndex int64
	Reward                       *float64 // nil: reward stays null (grades are the source of truth)
	MaxSampleTokens              int      // truncation (0 = off); callers pass the session's max_context_tokens
}

// MergedRewrite records a generated turn that rewrite-merge demoted to a
// routing-only node (docs/assembly.md §2.1 step 4).
type MergedRewrite struct {
	AbandonedTurnIndex      int
	AbandonedResponseTokens int
}

// node is a vertex of the routing tree: a generated assistant message when
// turn is set, routing-only otherwise.
type node struct {
	msg  message // the message as recorded
	alt  []byte  // other bytes found equal to msg (the client's echo)
	none bool    // no message (nil response)

	children []*node

	turn      *turn
	turnIndex int
	trained   bool // response_trained
	useTool   bool
	merged    *MergedRewrite
}

// Session is one agent session's routing tree (docs/assembly.md §2.1). It is not safe
// for concurrent use.
type Session struct {
	opts  Options
	root  *node
	turns int

	replay replayKind
	seen   bool // replay kind fixed by a turn with outputs

	// The previous turn's prompt messages and the nodes they mounted on:
	// a message that is the very same bytes (same memory) as the previous
	// turn's at the same depth mounts on the same node without comparing,
	// so a session that resends its growing history costs time linear in
	// the history, not quadratic. lastPath's storage is scratch.path.
	lastMsgs []json.RawMessage
	lastPath []*node

	*scratch // nil until the first turn is recorded
}

// scratch is a session's working memory: the chunk lists of its slabs and
// the buffers of routing and linearization.
type scratch struct {
	// Nodes and recorded turns come from session-owned slabs: a session
	// makes a few nodes per turn, and one allocation each would be most of
	// what routing costs.
	// The chunks of each slab kind, the last one being filled.
	nodeSlab [][]node
	kidSlab  [][]*node
	turnSlab [][]turn
	path     []*node // the storage of Session.lastPath
	cand     message // a prompt message being routed (see record)

	// Linearization's buffers (see linearizer).
	gens     []*node
	builders []builder
	spans    []span
	segs     []records.Trajectory
}

// grow returns the slab's current chunk with room for one more element,
// taking a new chunk of capacity n when the last is full.
func grow[T any](chunks *[][]T, n int) *[]T {
	if k := len(*chunks); k == 0 || len((*chunks)[k-1]) == cap((*chunks)[k-1]) {
		*chunks = append(*chunks, make([]T, 0, n))
	}
	return &(*chunks)[len(*chunks)-1]
}

// newNode returns a zeroed node from the session's slab.
func (s *Session) newNode() *node {
	c := grow(&s.nodeSlab, 64)
	*c = (*c)[:len(*c)+1]
	return &(*c)[len(*c)-1]
}

// turn is what linearization reads of a recorded Turn. It holds few
// pointers, and the replay columns only behind one: the slabs that keep a
// session's turns are written and cleared while the garbage collector may
// be marking, when every pointer written or cleared costs a write barrier.
type turn struct {
	PromptIDs      []int32
	OutputIDs      []int32
	OutputLogProbs []float32
	truncated      bool // finish_reason "length"
	illFormed      bool
	// replay is the turn's replay columns, nil when it has none. Segments
	// reads them only where the session's replay kind has them, and every
	// turn with outputs has that kind (validateTurn).
	replay *records.Replay
}

// keepTurn stores what linearization reads of t for the session's life
// and returns its address.
func (s *Session) keepTurn(t *Turn) *turn {
	c := grow(&s.turnSlab, 16)
	*c = append(*c, turn{PromptIDs: t.PromptIDs, OutputIDs: t.OutputIDs, OutputLogProbs: t.OutputLogProbs,
		truncated: t.FinishReason == "length", illFormed: t.IllFormed})
	k := &(*c)[len(*c)-1]
	if r := &t.Replay; r.TopPTokenIDs != nil || r.TopPTokenOffsets != nil || r.TopPLogProbs != nil ||
		r.TopKTokenIDs != nil || r.TopKLogProbs != nil || r.TopK != 0 || r.RoutedExperts != nil || r.RoutedExpertsShape != nil {
		k.replay = new(records.Replay)
		*k.replay = *r // a turn with replay columns brings far larger arrays
	}
	return k
}

// replayKind is which replay columns the session's turns carry.
type replayKind struct {
	topP, topPLP, topK, routes bool
	k                          int32
}

// NewSession starts an empty session.
func NewSession(opts Options) *Session { return &Session{opts: opts} }

// Turns is the number of recorded (non-ignored) turns.
func (s *Session) Turns() int { return s.turns }

// message is a chat message: its bytes, its role (read once, which also
// validates it) and its decoded value (only when bytes differ from a
// candidate's, for deep equality).
type message struct {
	raw     json.RawMessage
	hasRole bool
	role    string
	hasVal  bool
	val     any
}

// head is the part of a message read for routing.
type head struct {
	Role      *string         `json:"role"`
	ToolCalls json.RawMessage `json:"tool_calls"`
}

// readRole validates the message as a JSON object and reads its role.
func (m *message) readRole() error {
	if m.hasRole {
		return nil
	}
	_, err := m.readHead()
	return err
}

// readHead reads the message's role and tool_calls with encoding/json,
// which also validates it as a JSON object.
func (m *message) readHead() (head, error) {
	var h head
	raw := bytes.TrimSpace(m.raw)
	if len(raw) == 0 || raw[0] != '{' {
		if json.Valid(raw) {
			return h, errors.New("message is not a JSON object")
		}
		return h, errors.New("message is not JSON")
	}
	if err := json.Unmarshal(raw, &h); err != nil {
		return h, fmt.Errorf("message is not JSON: %w", err)
	}
	if h.Role != nil {
		m.role = *h.Role
	}
	m.hasRole = true
	return h, nil
}

// value decodes the message for deep equality.
func (m *message) value() (any, error) {
	if !m.hasVal {
		if err := json.Unmarshal(m.raw, &m.val); err != nil {
			return nil, fmt.Errorf("message is not JSON: %w", err)
		}
		obj, ok := m.val.(map[string]any)
		if !ok {
			return nil, errors.New("message is not a JSON object")
		}
		m.hasVal = true
		if !m.hasRole {
			m.role, _ = obj["role"].(string)
			m.hasRole = true
		}
	}
	return m.val, nil
}

// jsonEqual is deep equality of decoded JSON values.
func jsonEqual(a, b any) bool {
	switch x := a.(type) {
	case map[string]any:
		y, ok := b.(map[string]any)
		if !ok || len(x) != len(y) {
			return false
		}
		for k, v := range x {
			w, ok := y[k]
			if !ok || !jsonEqual(v, w) {
				return false
			}
		}
		return true
	case []any:
		y, ok := b.([]any)
		if !ok || len(x) != len(y) {
			return false
		}
		for i := range x {
			if !jsonEqual(x[i], y[i]) {
				return false
			}
		}
		return true
	case string:
		y, ok := b.(string)
		return ok && x == y
	case float64:
		y, ok := b.(float64)
		return ok && x == y
	case bool:
		y, ok := b.(bool)
		return ok && x == y
	case nil:
		return b == nil
	}
	return false
}

// isNull reports a missing message (nil, empty or JSON null).
func isNull(raw json.RawMessage) bool {
	raw = bytes.TrimSpace(raw)
	return len(raw) == 0 || string(raw) == "null"
}

// truthy is Python truthiness of a JSON value.
func truthy(raw json.RawMessage) bool {
	raw = bytes.TrimSpace(raw)
	if len(raw) == 0 {
		return false
	}
	switch raw[0] {
	case 'n', 'f':
		return false
	case 't':
		return true
	case '"':
		return len(raw) > 2
	case '[', '{': // non-empty unless the next token closes it
		i := ojson.Space(raw, 1)
		return i < len(raw) && raw[i] != ']' && raw[i] != '}'
	}
	var f float64
	return json.Unmarshal(raw, &f) == nil && f != 0
}

// matches reports whether child n holds message m: the same role and a
// deep-equal decoded value. Byte-identical messages match without decoding.
func (n *node) matches(m *message) (bool, error) {
	if n.none {
		return false, nil
	}
	if bytes.Equal(n.msg.raw, m.raw) || (n.alt != nil && bytes.Equal(n.alt, m.raw)) {
		return true, nil
	}
	mv, err := m.value()
	if err != nil {
		return false, err
	}
	nv, err := n.msg.value()
	if err != nil {
		return false, err
	}
	if n.msg.role != m.role || !jsonEqual(nv, mv) {
		return false, nil
	}
	n.alt = m.raw // the next echo of these bytes matches without decoding
	n.msg.val, n.msg.hasVal = nil, false
	return true, nil
}

// Record adds one turn to the routing tree (docs/assembly.md §2.1). A turn without
// prompt messages is ignored. Replay data is validated here and fails closed.
func (s *Session) Record(t Turn) error {
	if len(t.PromptMessages) == 0 {
		return nil
	}
	err := s.record(&t)
	if err != nil {
		s.lastMsgs, s.lastPath = nil, s.lastPath[:0]
	}
	return err
}

func (s *Session) record(t *Turn) error {
	if s.scratch == nil {
		s.scratch = &scratch{}
	}
	if s.root == nil {
		s.root = s.newNode()
	}
	kind, err := s.validateTurn(t)
	if err != nil {
		return fmt.Errorf("turn %d: %w", s.turns+1, err)
	}
	// The leaf is taken now so the response message is read in place (a
	// new node is zero).
	leaf := s.newNode()
	resp := &leaf.msg
	resp.raw = t.ResponseMessage
	rnone, useTool := isNull(t.ResponseMessage), false
	if !rnone {
		h, err := resp.readHead()
		if err != nil {
			return fmt.Errorf("turn %d: response_message: %w", s.turns+1, err)
		}
		useTool = truthy(h.ToolCalls)
	}

	// Mount point: descend while the first matching child exists. The
	// leading messages that are the previous turn's own bytes follow its
	// path without comparing (see Session.lastPath).
	raws := t.PromptMessages
	cur, d := s.root, 0
	if n := min(len(s.lastMsgs), len(s.lastPath)); n > 0 && len(raws) >= n &&
		&raws[0] == &s.lastMsgs[0] && sameMemory(raws[n-1], s.lastMsgs[n-1]) {
		// The same list, extended (a splitter appends each turn's new
		// messages to the previous turn's list in place): its first n
		// entries are the previous turn's, entry for entry.
		cur, d = s.lastPath[n-1], n
	}
	for d < len(raws) && d < len(s.lastPath) && sameMemory(raws[d], s.lastMsgs[d]) {
		cur = s.lastPath[d]
		d++
	}
	// The new path reuses the old one's storage: entries past d are not
	// read again (record clears both on failure).
	path := s.lastPath[:d]
	if len(s.lastPath) == 0 {
		path = s.path[:0]
	}
	// A message is read where it is needed: into the session's candidate
	// (s.cand, which holds the message at depth held) while it is compared
	// with children or considered for rewrite-merge, else straight into the
	// node it becomes.
	held := -1
	candidate := func(d int) *message {
		if held != d {
			s.cand = message{raw: raws[d]}
			held = d
		}
		return &s.cand
	}
descend:
	for ; d < len(raws) && len(cur.children) > 0; d++ {
		m := candidate(d)
		for _, c := range cur.children {
			ok, err := c.matches(m)
			if err != nil {
				return fmt.Errorf("turn %d: prompt_messages[%d]: %w", s.turns+1, d, err)
			}
			if ok {
				cur = c
				path = append(path, cur)
				continue descend
			}
		}
		break
	}
	// Rewrite-merge (T > 0 only).
	if T := s.opts.ForkMergeMaxResponseTokens; T > 0 && d < len(raws) {
		m := candidate(d)
		if err := m.readRole(); err != nil {
			return fmt.Errorf("turn %d: prompt_messages[%d]: %w", s.turns+1, d, err)
		}
		if m.role == "assistant" {
			var only *node
			count := 0
			for _, c := range cur.children {
				if err := c.msg.readRole(); err != nil {
					return fmt.Errorf("turn %d: %w", s.turns+1, err)
				}
				if c.msg.role == "assistant" {
					only = c
					count++
				}
			}
			if count == 1 && len(only.children) == 0 && only.turn != nil && len(only.turn.OutputIDs) < T {
				only.merged = &MergedRewrite{AbandonedTurnIndex: only.turnIndex, AbandonedResponseTokens: len(only.turn.OutputIDs)}
				only.turn, only.turnIndex, only.useTool = nil, 0, false
				only.msg, only.alt, only.none = *m, nil, false
				cur = only
				path = append(path, cur)
				d++
			}
		}
	}
	for ; d < len(raws); d++ {
		n := s.newNode()
		if m := &n.msg; d == held {
			*m = s.cand
		} else {
			m.raw = raws[d]
		}
		// A node that fails here stays out of the tree.
		if err := n.msg.readRole(); err != nil {
			return fmt.Errorf("turn %d: prompt_messages[%d]: %w", s.turns+1, d, err)
		}
		s.addChild(cur, n)
		cur = n
		path = append(path, cur)
	}
	s.lastMsgs, s.lastPath, s.path = t.PromptMessages, path, path
	if len(t.OutputIDs) > 0 && !s.seen {
		s.replay, s.seen = kind, true
	}
	s.turns++
	// A generated leaf is an assistant node whatever its message says.
	resp.role, resp.hasRole = "assistant", true
	leaf.none, leaf.turn, leaf.turnIndex, leaf.useTool = rnone, s.keepTurn(t), s.turns, useTool
	s.addChild(cur, leaf)
	return nil
}

// addChild appends n to p's children; a first child's one-entry list comes
// from the session's slab (most nodes have exactly one child).
func (s *Session) addChild(p, n *node) {
	if p.children != nil {
		p.children = append(p.children, n)
		return
	}
	c := grow(&s.kidSlab, 128)
	*c = append(*c, n)
	i := len(*c) - 1
	p.children = (*c)[i : i+1 : i+1]
}

// sameMemory reports whether a and b are the same bytes in memory.
func sameMemory(a, b json.RawMessage) bool {
	return len(a) == len(b) && (len(a) == 0 || &a[0] == &b[0])
}

// validateTurn checks a turn's logprobs and replay shapes.
func (s *Session) validateTurn(t *Turn) (replayKind, error) {
	var k replayKind
	n := len(t.OutputIDs)
	if len(t.OutputLogProbs) != 0 && len(t.OutputLogProbs) != n {
		return k, fmt.Errorf("output_log_probs has %d entries for %d output_ids", len(t.OutputLogProbs), n)
	}
	if t.TopPTokenOffsets != nil || t.TopPTokenIDs != nil || t.TopPLogProbs != nil {
		off := t.TopPTokenOffsets
		if len(off) != n+1 || off[0] != 0 || int(off[n]) != len(t.TopPTokenIDs) {
			return k, fmt.Errorf("rollout_top_p_token_offsets must have len(output_ids)+1 = %d entries from 0 to %d (the number of top-p ids)", n+1, len(t.TopPTokenIDs))
		}
		for i := 1; i <= n; i++ {
			if off[i] < off[i-1] {
				return k, fmt.Errorf("rollout_top_p_token_offsets decrease at %d", i)
			}
		}
		if t.TopPLogProbs != nil && len(t.TopPLogProbs) != len(t.TopPTokenIDs) {
			return k, fmt.Errorf("rollout_top_p_log_probs has %d entries, rollout_top_p_token_ids %d", len(t.TopPLogProbs), len(t.TopPTokenIDs))
		}
		k.topP, k.topPLP = true, t.TopPLogProbs != nil
	}
	if t.TopKTokenIDs != nil || t.TopKLogProbs != nil || t.TopK != 0 {
		if t.TopK <= 0 || len(t.TopKTokenIDs) != n*int(t.TopK) || len(t.TopKLogProbs) != len(t.TopKTokenIDs) {
			return k, fmt.Errorf("top-k heads must be [len(output_ids)=%d, k=%d] ids and logprobs (have %d ids, %d logprobs)", n, t.TopK, len(t.TopKTokenIDs), len(t.TopKLogProbs))
		}
		k.topK, k.k = true, t.TopK
	}
	if t.RoutedExperts != nil || t.RoutedExpertsShape != nil {
		sh := t.RoutedExpertsShape
		want := len(t.PromptIDs) + n - 1
		if len(sh) != 3 || int(sh[0]) != want || sh[1] <= 0 || sh[2] <= 0 || int(sh[0])*int(sh[1])*int(sh[2]) != len(t.RoutedExperts) {
			return k, fmt.Errorf("rollout_routed_experts shape %v with %d values, want [%d, layers, topk] (prompt+output-1 positions)", sh, len(t.RoutedExperts), want)
		}
		k.routes = true
	}
	if n > 0 && s.seen && k != s.replay {
		return k, fmt.Errorf("replay columns %s differ from earlier turns' %s", k, s.replay)
	}
	return k, nil
}

func (k replayKind) String() string {
	return fmt.Sprintf("{top_p:%t top_p_log_probs:%t top_k:%d routed_experts:%t}", k.topP, k.topPLP, k.k, k.routes)
}
