package rollout

import (
	"bytes"
	"context"
	"fmt"
	"net/http/httptest"
	"slices"
	"testing"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/kilnrl/kiln/fixtures"
	"github.com/kilnrl/kiln/formats/dataset"
	"github.com/kilnrl/kiln/formats/records"
	"github.com/kilnrl/kiln/formats/store"
	"github.com/kilnrl/kiln/internal/agent/enginetest"
	"github.com/kilnrl/kiln/internal/agent/harness"
	"github.com/kilnrl/kiln/internal/stagecmd"
	"github.com/kilnrl/kiln/stages/grade"
)

// turnsByRollout are turns ordered by rollout and call, without what
// differs per invocation.
func turnsByRollout(turns []records.Turn) []records.Turn {
	out := slices.Clone(turns)
	for i := range out {
		// Per invocation: the session token and the call's clock.
		out[i].Session, out[i].StartedMs, out[i].DurationMs = "", nil, nil
	}
	slices.SortFunc(out, func(a, b records.Turn) int {
		if a.RolloutID != b.RolloutID {
			return int(a.RolloutID - b.RolloutID)
		}
		return int(a.Turn - b.Turn)
	})
	return out
}

func segmentsByRollout(segs []records.Trajectory) []records.Trajectory {
	out := slices.Clone(segs)
	slices.SortFunc(out, func(a, b records.Trajectory) int {
		if a.RolloutID != b.RolloutID {
			return int(a.RolloutID - b.RolloutID)
		}
		return int(a.Segment - b.Segment)
	})
	return out
}

func rowsByRollout(rows []records.Rollout) map[int64]records.Rollout {
	out := map[int64]records.Rollout{}
	for _, r := range rows {
		out[r.RolloutID] = r
	}
	return out
}

// assertReplayedAsRecorded checks that the replay res reproduced the
// recorded run rec (docs/rollout.md §7.2): under another version id, the
// same rows (abort reasons, patches, agent exit codes, turn and token
// counts), the same turns (prompt and output ids, logprobs, finish reasons,
// sampling masks, ...) and the same segments.
func assertReplayedAsRecorded(t *testing.T, st store.Store, rec, res RunResults) {
	t.Helper()
	assert.NotEqual(t, rec.Turns.Ref.Version, res.Turns.Ref.Version, "a replay is another version")
	assert.False(t, res.Trajectories.Existed)
	recRows := rowsByRollout(readRollouts(t, st, rec.Rollouts.Ref))
	rows := rowsByRollout(readRollouts(t, st, res.Rollouts.Ref))
	require.Len(t, rows, len(recRows))
	for id, want := range recRows {
		got := rows[id]
		assert.Equal(t, deref(want.AbortReason), deref(got.AbortReason), "rollout %d", id)
		assert.Equal(t, want.AbortDetail == nil, got.AbortDetail == nil, "rollout %d: an abort detail exactly when the recording has one", id)
		assert.Equal(t, want.Patch, got.Patch, "rollout %d", id)
		assert.Equal(t, want.AgentExitCode, got.AgentExitCode, "rollout %d", id)
		assert.Equal(t, [3]int64{want.Turns, want.PromptTokens, want.OutputTokens}, [3]int64{got.Turns, got.PromptTokens, got.OutputTokens}, "rollout %d", id)
	}
	assert.Equal(t, turnsByRollout(readTurns(t, st, rec.Turns.Ref)), turnsByRollout(readTurns(t, st, res.Turns.Ref)))
	assert.Equal(t, segmentsByRollout(readSegments(t, st, rec.Trajectories.Ref)), segmentsByRollout(readSegments(t, st, res.Trajectories.Ref)))
}

// TestReplayRun is docs/rollout.md §7 end to end, in real bwrap sandboxes
// on the fixture tasks with the shell agent: a recorded run (the first
// sample of every task fixes the bug, the second only looks around) is
// replayed from its turns version against a renderer that fails the test
// if it is ever asked to generate. The replay gives the same turns,
// segments, patches and rows (and kiln-grade the same rewards) under
// another version id. A replay whose agent sends other prompts ends every
// affected run as replay_mismatch naming the rollout, the turn and the
// first differing token, with no turns or segments, replays the others as
// recorded, and the stage succeeds with every row.
func TestReplayRun(t *testing.T) {
	w := newRunWorld(t)
	ctx := context.Background()
	model := newScriptedModel(w.set, func(_ fixtures.Task, nth int) behaviour {
		if nth == 0 {
			return fixIt
		}
		return lookAround
	})
	o := w.options(startEngine(t, model.script))
	o.Jobs = 2 * len(w.set.Tasks)
	rec, err, logs := w.run(t, ctx, "rollout/replay", o, nil)
	require.NoError(t, err, logs)
	recRows := rowsByRollout(readRollouts(t, w.st, rec.Rollouts.Ref))
	recTurns := turnsByRollout(readTurns(t, w.st, rec.Turns.Ref))
	recSegs := segmentsByRollout(readSegments(t, w.st, rec.Trajectories.Ref))
	require.Len(t, recRows, 2*len(w.set.Tasks))
	for _, r := range recRows {
		require.Nil(t, r.AbortReason, "recorded rollout %d aborted: %s\n%s", r.RolloutID, deref(r.AbortReason), logs)
	}

	replay := w.options("replay://" + rec.Turns.Ref.String())
	replay.Jobs = o.Jobs
	renderer := enginetest.New(enginetest.Options{Script: noGenerate(t), MaxModelLen: 1 << 16})
	rsrv := httptest.NewServer(renderer)
	t.Cleanup(rsrv.Close)
	replay.ReplayRenderer = rsrv.URL

	t.Run("same", func(t *testing.T) {
		res, err, logs := w.run(t, ctx, "rollout/replay", replay, nil)
		require.NoError(t, err, logs)
		assertReplayedAsRecorded(t, w.st, rec, res)
		n := len(recRows)
		assert.Contains(t, logs, fmt.Sprintf("replay: %d of %d runs matched %s (every recorded turn answered)\n", n, n, rec.Turns.Ref))
		// The renderer rendered and decoded, and never generated.
		assert.NotEmpty(t, renderer.RequestsTo("/tokenize"))
		assert.NotEmpty(t, renderer.RequestsTo("/detokenize"))
		assert.Empty(t, renderer.RequestsTo("/inference/v1/generate"))
		assert.Empty(t, renderer.RequestsTo("/v1/completions"))

		// kiln-grade rewards the replayed patches as the recorded ones:
		// exactly the fixing samples.
		var gout, gerr bytes.Buffer
		genv := &stagecmd.Env{Stdout: &gout, Stderr: &gerr, Log: stagecmd.NewLogger(&gerr, false)}
		gres, err := grade.Run(ctx, genv, w.st, stagecmd.Output{Name: "grades/replay"},
			grade.Options{Tasks: w.tasks, Images: w.images, Bundles: w.bundles, Rollouts: res.Rollouts.Ref.String(), Jobs: 4, Timeout: 2 * time.Minute})
		require.NoError(t, err, gerr.String())
		v, err := dataset.Open(ctx, w.st, gres.Ref)
		require.NoError(t, err)
		rewards := map[int64]float64{}
		require.NoError(t, v.EachShard(ctx, func(_ int, data []byte) error {
			return records.EachGrade(data, func(g records.Grade) error { rewards[g.Index] = g.Reward; return nil })
		}))
		require.Len(t, rewards, len(recRows))
		fixed := 0
		for id, r := range rewards {
			want := 0.0
			if recRows[id].Patch != "" {
				want, fixed = 1, fixed+1
			}
			assert.Equal(t, want, r, "rollout %d", id)
		}
		assert.Equal(t, len(w.set.Tasks), fixed)
	})

	// The agent's commands find no ls: the runs that only look around send
	// another tool result in their second call; the fixing runs (edit
	// calls only) are replayed as recorded.
	t.Run("some changed", func(t *testing.T) {
		changed := replay
		extra, err := harness.ParseExtra("", `{"PATH":"/nonexistent"}`)
		require.NoError(t, err)
		changed.Harness.Extra = extra
		res, err, logs := w.run(t, ctx, "rollout/replay-some", changed, nil)
		require.NoError(t, err, logs)
		rows := rowsByRollout(readRollouts(t, w.st, res.Rollouts.Ref))
		require.Len(t, rows, len(recRows))
		var wantTurns []records.Turn
		var wantSegs []records.Trajectory
		mismatched := 0
		for id, r := range rows {
			if recRows[id].Patch != "" {
				assert.Nil(t, r.AbortReason, "fixing rollout %d: %s", id, deref(r.AbortReason))
				assert.Nil(t, r.AbortDetail, "fixing rollout %d", id)
				assert.Equal(t, recRows[id].Patch, r.Patch, "rollout %d", id)
				for _, tr := range recTurns {
					if tr.RolloutID == id {
						wantTurns = append(wantTurns, tr)
					}
				}
				for _, s := range recSegs {
					if s.RolloutID == id {
						wantSegs = append(wantSegs, s)
					}
				}
				continue
			}
			mismatched++
			assert.Equal(t, AbortReplayMismatch, deref(r.AbortReason), "rollout %d", id)
			assert.Regexp(t, fmt.Sprintf(`rollout=%d reason=replay_mismatch detail="replay: rollout %d turn 1: prompt token [0-9]+ is [0-9]+, the recorded one [0-9]+"`, id, id), logs)
			// The row's abort_detail is that mismatch message (docs/rollout.md §7.3).
			assert.Regexp(t, fmt.Sprintf(`^replay: rollout %d turn 1: prompt token [0-9]+ is [0-9]+, the recorded one [0-9]+$`, id), deref(r.AbortDetail))
		}
		assert.Equal(t, len(w.set.Tasks), mismatched)
		assert.Contains(t, logs, fmt.Sprintf("replay: %d of %d runs matched %s (every recorded turn answered); %d mismatched (a prompt the recording does not hold), 0 made fewer calls than recorded\n",
			len(rows)-mismatched, len(rows), rec.Turns.Ref, mismatched))
		assert.Equal(t, turnsByRollout(wantTurns), turnsByRollout(readTurns(t, w.st, res.Turns.Ref)))
		assert.Equal(t, segmentsByRollout(wantSegs), segmentsByRollout(readSegments(t, w.st, res.Trajectories.Ref)))
	})

	// Only a turns version replays; nothing is written otherwise.
	t.Run("refused", func(t *testing.T) {
		bad := replay
		bad.Engines = []string{"replay://" + rec.Trajectories.Ref.String()}
		_, err, _ := w.run(t, ctx, "rollout/replay-bad", bad, nil)
		require.Equal(t, stagecmd.ExitUsage, stagecmd.ExitCode(err), "%v", err)
		assert.ErrorContains(t, err, "holds trajectories records, not turns: replay the NAME/turns version of the run")
		bad.Engines = []string{"replay://rollout/replay/turns@0000000000000000000a"}
		_, err, _ = w.run(t, ctx, "rollout/replay-bad", bad, nil)
		assert.ErrorContains(t, err, "--engine: dataset rollout/replay/turns@0000000000000000000a: not found")
		_, err = dataset.OpenString(ctx, w.st, "rollout/replay-bad/rollouts")
		assert.Error(t, err, "nothing committed")
	})

	// The agent reads another task file: every run's first prompt differs.
	t.Run("changed prompts", func(t *testing.T) {
		changed := replay
		extra, err := harness.ParseExtra(`["--task-file","/etc/passwd"]`, "")
		require.NoError(t, err)
		changed.Harness.Extra = extra
		res, err, logs := w.run(t, ctx, "rollout/replay-changed", changed, nil)
		require.NoError(t, err, logs)
		rows := rowsByRollout(readRollouts(t, w.st, res.Rollouts.Ref))
		require.Len(t, rows, len(recRows))
		turns := turnsByRollout(readTurns(t, w.st, res.Turns.Ref))
		segs := segmentsByRollout(readSegments(t, w.st, res.Trajectories.Ref))
		mismatched := 0
		for id, r := range rows {
			require.Equal(t, AbortReplayMismatch, deref(r.AbortReason), "rollout %d", id)
			mismatched++
			// The abort's detail (the stage's "run aborted" warning) names
			// the rollout, the turn and the first differing prompt token.
			assert.Regexp(t, fmt.Sprintf(`rollout=%d reason=replay_mismatch detail="replay: rollout %d turn 0: prompt token [0-9]+ is [0-9]+, the recorded one [0-9]+"`, id, id), logs)
			// So does the row: its abort_detail is the mismatch message.
			assert.Regexp(t, fmt.Sprintf(`^replay: rollout %d turn 0: prompt token [0-9]+ is [0-9]+, the recorded one [0-9]+$`, id), deref(r.AbortDetail))
			assert.Zero(t, r.Turns, "rollout %d", id)
			for _, tr := range turns {
				assert.NotEqual(t, id, tr.RolloutID, "turns of mismatched rollout %d", id)
			}
			for _, s := range segs {
				assert.NotEqual(t, id, s.RolloutID, "segments of mismatched rollout %d", id)
			}
		}
		assert.Equal(t, len(recRows), mismatched, logs)
	})
}
