package rollout

import (
	"context"
	"errors"
	"fmt"
	"slices"
	"strings"

	"github.com/kilnrl/kiln/formats/dataset"
	"github.com/kilnrl/kiln/formats/records"
	"github.com/kilnrl/kiln/formats/store"
	"github.com/kilnrl/kiln/internal/stagecmd"
)

// AbortReplayMismatch is the abort reason of a replayed run whose agent
// sent a prompt the recording does not hold (docs/rollout.md §7).
const AbortReplayMismatch = records.AbortReplayMismatch

// replayScheme prefixes an --engine that replays a turns version.
const replayScheme = "replay://"

// replayRef is the dataset reference of a replay:// engine, ok false for
// any other engine URL.
func replayRef(engineURL string) (ref string, ok bool) {
	return strings.CutPrefix(engineURL, replayScheme)
}

// replayBook is a recorded turns version indexed for replay: each run's
// turns (by rollout id) in call order (docs/rollout.md §7).
type replayBook struct {
	runs map[int64][]records.Turn
}

// newReplayBook indexes turns by rollout id. Each run's turns must be
// numbered 0, 1, ... with none missing or repeated: a replay serves the
// nth call of a run its nth recorded turn.
func newReplayBook(turns []records.Turn) (*replayBook, error) {
	b := &replayBook{runs: map[int64][]records.Turn{}}
	for _, t := range turns {
		b.runs[t.RolloutID] = append(b.runs[t.RolloutID], t)
	}
	for id, ts := range b.runs {
		slices.SortFunc(ts, func(x, y records.Turn) int { return int(x.Turn) - int(y.Turn) })
		for i, t := range ts {
			if int(t.Turn) != i {
				return nil, fmt.Errorf("rollout %d: turn %d where turn %d was expected: a replay needs every turn of a run, numbered from 0 (replay the turns version kiln-rollout run committed)", id, t.Turn, i)
			}
		}
	}
	return b, nil
}

// loadReplayBook reads the turns version ref names.
func loadReplayBook(ctx context.Context, st store.Store, ref string) (*replayBook, error) {
	r, err := dataset.ParseRef(ref)
	if err != nil {
		return nil, stagecmd.Usagef("--engine %s%s: %v: give a turns version, e.g. replay://NAME/turns@VERSION", replayScheme, ref, err)
	}
	v, err := dataset.OpenKind(ctx, st, r, records.TurnsKind(), "--engine")
	if errors.Is(err, dataset.ErrKindMismatch) {
		return nil, fmt.Errorf("%w: replay the NAME/turns version of the run", err)
	}
	if err != nil {
		return nil, err
	}
	var turns []records.Turn
	if err := v.EachShard(ctx, func(_ int, data []byte) error {
		return records.EachTurn(data, func(t *records.Turn) error { turns = append(turns, *t); return nil })
	}); err != nil {
		return nil, fmt.Errorf("--engine %s%s: %w", replayScheme, ref, err)
	}
	b, err := newReplayBook(turns)
	if err != nil {
		return nil, stagecmd.BadInputf("--engine %s%s: %v", replayScheme, ref, err)
	}
	return b, nil
}

// replayMismatchError says why a replayed call has no recorded answer.
type replayMismatchError struct {
	RolloutID int64
	Turn      int
	// Position is the first prompt position that differs (-1: the run has
	// no such turn recorded).
	Position     int
	Recorded     []int32 // the recorded prompt (nil when no turn)
	Got          []int32
	RecordedRuns int // turns recorded for the run
}

func (e *replayMismatchError) Error() string {
	switch {
	case e.Position < 0 && e.RecordedRuns == 0:
		return fmt.Sprintf("replay: rollout %d turn %d: the recording has no turn of this rollout", e.RolloutID, e.Turn)
	case e.Position < 0:
		return fmt.Sprintf("replay: rollout %d turn %d was never recorded: the recording has %d turns of this rollout", e.RolloutID, e.Turn, e.RecordedRuns)
	case e.Position >= len(e.Got) || e.Position >= len(e.Recorded):
		return fmt.Sprintf("replay: rollout %d turn %d: the prompt has %d tokens, the recorded one %d; they agree up to position %d",
			e.RolloutID, e.Turn, len(e.Got), len(e.Recorded), e.Position)
	default:
		return fmt.Sprintf("replay: rollout %d turn %d: prompt token %d is %d, the recorded one %d",
			e.RolloutID, e.Turn, e.Position, e.Got[e.Position], e.Recorded[e.Position])
	}
}

// next is the recorded turn for a run's turn-th call (0-based) with prompt
// ids prompt, or a *replayMismatchError naming the turn and the first
// differing prompt position.
func (b *replayBook) next(rolloutID int64, turn int, prompt []int32) (*records.Turn, error) {
	ts := b.runs[rolloutID]
	if turn < 0 || turn >= len(ts) {
		return nil, &replayMismatchError{RolloutID: rolloutID, Turn: turn, Position: -1, Got: prompt, RecordedRuns: len(ts)}
	}
	t := &ts[turn]
	n := min(len(prompt), len(t.PromptIDs))
	for i := 0; i < n; i++ {
		if prompt[i] != t.PromptIDs[i] {
			return nil, &replayMismatchError{RolloutID: rolloutID, Turn: turn, Position: i, Recorded: t.PromptIDs, Got: prompt, RecordedRuns: len(ts)}
		}
	}
	if len(prompt) != len(t.PromptIDs) {
		return nil, &replayMismatchError{RolloutID: rolloutID, Turn: turn, Position: n, Recorded: t.PromptIDs, Got: prompt, RecordedRuns: len(ts)}
	}
	return t, nil
}
