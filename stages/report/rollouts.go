package report

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"sort"
	"strings"

	"github.com/kilnrl/kiln/formats/records"
	"github.com/kilnrl/kiln/formats/store"
)

// rolloutView is what the rollout template renders (docs/report.md §2).
type rolloutView struct {
	Step    int
	R       *Rollout
	Anchor  string
	Weights string
	Patch   []patchLine
	Log     string
	// LogNote says why the log is not shown (none, or its attachment is
	// gone).
	LogNote     string
	AbortDetail string
	GradeError  string
	Sessions    []sessionView
	// TurnsNote says why there is no conversation.
	TurnsNote string
}

type sessionView struct {
	ID    string
	Turns []turnView
}

type turnView struct {
	Turn      int32
	Context   []msgView // the prompt messages new since the previous turn
	Rewritten bool      // the prompt is not the previous one extended
	Response  *msgView
	Sampled   int
	LogprobMu string
	Finish    string
	IllFormed bool
	Duration  string
}

type msgView struct {
	Role, Content, Reasoning string
	Calls                    []callView
}

type callView struct{ Name, Args string }

type patchLine struct{ Class, Text string }

// turnRecord is what the report keeps of one turn row.
type turnRecord struct {
	session   string
	turn      int32
	prompt    string
	response  *string
	out       int
	lpSum     float64
	lpN       int
	finish    string
	illFormed bool
	durMs     *int64
}

// readTurns reads a step's turns, grouped by rollout id.
func readTurns(ctx context.Context, s *Step) (map[int64][]turnRecord, error) {
	v := s.versions["turns"]
	if v == nil {
		return nil, nil
	}
	out := map[int64][]turnRecord{}
	err := v.EachShard(ctx, func(_ int, data []byte) error {
		return records.EachTurn(data, func(t *records.Turn) error {
			tr := turnRecord{session: t.Session, turn: t.Turn, prompt: t.PromptMessages, out: len(t.OutputIDs), finish: t.FinishReason, illFormed: t.IllFormed}
			if t.ResponseMessage != nil {
				s := *t.ResponseMessage
				tr.response = &s
			}
			if t.DurationMs != nil {
				d := *t.DurationMs
				tr.durMs = &d
			}
			for _, lp := range t.OutputLogProbs {
				tr.lpSum += float64(lp)
				tr.lpN++
			}
			out[t.RolloutID] = append(out[t.RolloutID], tr)
			return nil
		})
	})
	if err != nil {
		return nil, fmt.Errorf("reading %s: %w", v.Ref(), err)
	}
	return out, nil
}

// view builds a rollout's view from its rows, turns and grading log.
func view(ctx context.Context, st store.Store, step *Step, x *Rollout, turns []turnRecord, haveTurns bool, logBytes int) rolloutView {
	v := rolloutView{Step: step.Step, R: x, Anchor: anchor(step.Step, x.ID), Weights: x.row.WeightsVersion}
	if x.row.AbortDetail != nil {
		v.AbortDetail = *x.row.AbortDetail
	}
	for _, l := range strings.SplitAfter(x.row.Patch, "\n") {
		if l == "" {
			continue
		}
		c := ""
		switch {
		case strings.HasPrefix(l, "+++"), strings.HasPrefix(l, "---"), strings.HasPrefix(l, "diff "):
			c = "file"
		case strings.HasPrefix(l, "+"):
			c = "add"
		case strings.HasPrefix(l, "-"):
			c = "del"
		case strings.HasPrefix(l, "@@"):
			c = "hunk"
		}
		v.Patch = append(v.Patch, patchLine{c, strings.TrimSuffix(l, "\n")})
	}
	if g := x.grade; g != nil {
		if g.Error != nil {
			v.GradeError = *g.Error
		}
		if g.Log == nil {
			v.LogNote = "the grade names no grading log"
		} else {
			v.Log, v.LogNote = readLog(ctx, st, *g.Log, logBytes)
		}
	} else {
		v.LogNote = "no grade of this rollout in the step"
	}
	switch {
	case !haveTurns:
		v.TurnsNote = "the step has no turns version: the conversation cannot be shown"
	case len(turns) == 0:
		v.TurnsNote = "no turn of this rollout is in the step's turns"
	}
	bySession := map[string]int{}
	// Per session: the message count of its previous prompt plus the
	// response, and that prompt (a valid JSON array).
	prev, prevPrompt := map[string]int{}, map[string]string{}
	for _, t := range turns {
		i, ok := bySession[t.session]
		if !ok {
			i = len(v.Sessions)
			bySession[t.session] = i
			v.Sessions = append(v.Sessions, sessionView{ID: t.session})
		}
		tv := turnView{Turn: t.turn, Sampled: t.out, Finish: t.finish, IllFormed: t.illFormed}
		if t.lpN > 0 {
			tv.LogprobMu = fmt.Sprintf("%.3f", t.lpSum/float64(t.lpN))
		}
		if t.durMs != nil {
			tv.Duration = fmt.Sprintf("%.2fs", float64(*t.durMs)/1000)
		}
		if n, fresh, ok := extension(prevPrompt[t.session], prev[t.session], t.prompt); ok {
			// The usual turn: the previous prompt, byte for byte, then
			// the previous response and the new messages; only those
			// are parsed, so a rollout's conversation costs its size,
			// not its turns times its history.
			for _, m := range fresh {
				tv.Context = append(tv.Context, message(m))
			}
			prev[t.session], prevPrompt[t.session] = n+1, t.prompt
		} else if msgs, err := splitArray(t.prompt); err != nil {
			tv.Context = []msgView{{Role: "kiln", Content: "prompt_messages is not a JSON array: " + err.Error()}}
		} else {
			from := 0
			if n, ok := prev[t.session]; ok {
				if n <= len(msgs) {
					from = n
				} else {
					tv.Rewritten = true
				}
			}
			for _, m := range msgs[from:] {
				tv.Context = append(tv.Context, message(m))
			}
			prev[t.session], prevPrompt[t.session] = len(msgs)+1, t.prompt
		}
		if t.response != nil {
			m := message(json.RawMessage(*t.response))
			tv.Response = &m
		}
		v.Sessions[i].Turns = append(v.Sessions[i].Turns, tv)
	}
	for i := range v.Sessions {
		sort.SliceStable(v.Sessions[i].Turns, func(a, b int) bool { return v.Sessions[i].Turns[a].Turn < v.Sessions[i].Turns[b].Turn })
	}
	return v
}

// splitArray is a JSON array's elements.
func splitArray(s string) ([]json.RawMessage, error) {
	var msgs []json.RawMessage
	err := json.Unmarshal([]byte(s), &msgs)
	return msgs, err
}

// extension reports whether prompt is prevPrompt (a JSON array of prevN-1
// messages, prevN counting the response that followed it) extended: the
// same bytes up to its closing bracket, then a comma and at least one more
// element (the previous response, as the agent sent it back). It returns
// the new prompt's message count and its messages after the response.
// The byte-for-byte prefix holds the same elements as prevPrompt (a JSON
// parser is in the same state after the same bytes), so this is what
// splitting the whole prompt and skipping prevN messages gives, for the
// cost of the new messages alone; anything else is not ok, and the caller
// splits the whole prompt.
func extension(prevPrompt string, prevN int, prompt string) (int, []json.RawMessage, bool) {
	k := len(prevPrompt) - 1
	if prevN < 2 || k < 1 || prevPrompt[k] != ']' || len(prompt) <= len(prevPrompt) || prompt[k] != ',' || prompt[:k] != prevPrompt[:k] {
		return 0, nil, false
	}
	tail, err := splitArray("[" + prompt[k+1:])
	if err != nil || len(tail) == 0 {
		return 0, nil, false
	}
	return prevN - 1 + len(tail), tail[1:], true
}

// message reads one chat message (docs/records.md §5: the adapter's
// translated messages: role, content as text or parts, reasoning_content,
// tool_calls of {function: {name, arguments}}).
func message(raw json.RawMessage) msgView {
	var m struct {
		Role      string          `json:"role"`
		Content   json.RawMessage `json:"content"`
		Reasoning json.RawMessage `json:"reasoning_content"`
		ToolCalls []struct {
			Function struct {
				Name      string          `json:"name"`
				Arguments json.RawMessage `json:"arguments"`
			} `json:"function"`
		} `json:"tool_calls"`
	}
	if err := json.Unmarshal(raw, &m); err != nil {
		return msgView{Role: "?", Content: string(raw)}
	}
	v := msgView{Role: m.Role, Content: text(m.Content), Reasoning: text(m.Reasoning)}
	for _, c := range m.ToolCalls {
		args := text(c.Function.Arguments)
		v.Calls = append(v.Calls, callView{Name: c.Function.Name, Args: args})
	}
	return v
}

// text is a JSON value as text: a string itself, a list of parts their
// text fields, anything else indented JSON.
func text(raw json.RawMessage) string {
	if len(raw) == 0 || string(raw) == "null" {
		return ""
	}
	var s string
	if json.Unmarshal(raw, &s) == nil {
		return s
	}
	var parts []map[string]any
	if json.Unmarshal(raw, &parts) == nil {
		var b []string
		ok := true
		for _, p := range parts {
			t, isText := p["text"].(string)
			if !isText {
				ok = false
				break
			}
			b = append(b, t)
		}
		if ok {
			return strings.Join(b, "\n")
		}
	}
	var v any
	if json.Unmarshal(raw, &v) == nil {
		if out, err := json.MarshalIndent(v, "", "  "); err == nil {
			return string(out)
		}
	}
	return string(raw)
}

// readLog reads a grading log attachment, its head and tail when longer
// than n bytes; a missing one is a note.
func readLog(ctx context.Context, st store.Store, key string, n int) (string, string) {
	info, err := st.Stat(ctx, key)
	if errors.Is(err, store.ErrNotExist) {
		return "", fmt.Sprintf("the grading log %q is not in the store: its version's attachments were removed (kiln forget, kiln gc)", key)
	}
	if err != nil {
		return "", fmt.Sprintf("the grading log %q cannot be read: %v", key, err)
	}
	if info.Size <= int64(n) {
		b, _, err := store.ReadAll(ctx, st, key)
		if err != nil {
			return "", fmt.Sprintf("the grading log %q cannot be read: %v", key, err)
		}
		return string(b), ""
	}
	part := func(off, length int64) string {
		rc, err := st.GetRange(ctx, key, off, length)
		if err != nil {
			return ""
		}
		defer rc.Close()
		b, _ := io.ReadAll(rc)
		return string(b)
	}
	half := int64(n / 2)
	return part(0, half) + fmt.Sprintf("\n[... %d bytes cut: kiln cat the attachment for all of it ...]\n", info.Size-2*half) + part(info.Size-half, half),
		fmt.Sprintf("the log is %d bytes: its first and last %d are shown", info.Size, half)
}

func anchor(step int, id int64) string { return fmt.Sprintf("r-%d-%d", step, id) }
