package rollout

import (
	"context"
	"os"
	"path/filepath"
	"testing"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/kilnrl/kiln/internal/agent/engine"
	"github.com/kilnrl/kiln/internal/testenv/gputest"
)

// rendererFiles are what a replay renderer is given of a checkpoint: its
// config, generation config, tokenizer and chat template, no weights
// (docs/serve.md §9).
var rendererFiles = []string{"config.json", "generation_config.json", "tokenizer.json", "tokenizer_config.json"}

// TestReplayServePy is the replay of docs/rollout.md §7 on the real
// tokenizer path, with no GPU: the shell agent, in bwrap sandboxes on the
// fixture tasks × 2 samples, is run against python -m kiln_gpu.serve on the
// tiny Qwen3 checkpoint (the real Qwen3 tokenizer and chat template; the
// random model's garbage outputs are the recording), sampling with top-k
// and top-p so that the turns hold sampling masks. Its turns version is
// then replayed with serve.py --tokenizer-only as --replay-renderer, on a
// copy of the checkpoint without its weights file: the replay gives the
// same rows, turns (prompt and output ids, logprobs, finish reasons,
// masks), segments and patches, and the renderer refuses to generate.
// Needs root, bwrap, the fixtures, the gpu venv and the Qwen3 tokenizer:
// skips without them, fails under CI=true.
func TestReplayServePy(t *testing.T) {
	if testing.Short() {
		t.Skip("starts two Python servers and bwrap sandboxes")
	}
	ge := gputest.Find(t)
	w := newRunWorld(t)
	ctx := context.Background()
	tiny := ge.Tiny(t)

	o := w.options(ge.Serve(t, tiny))
	o.TokenizerDir = tiny
	o.Jobs = 2 * len(w.set.Tasks)
	// Small enough to be quick on CPU; top-p below 1 asks for sampling
	// masks, top-k keeps them short on a near-uniform random model.
	o.MaxTokens, o.MaxTurns, o.TopK, o.TopP = 24, 3, 20, 0.9
	rec, err, logs := w.run(t, ctx, "rollout/servepy", o, nil)
	require.NoError(t, err, logs)
	recTurns := readTurns(t, w.st, rec.Turns.Ref)
	recRows := readRollouts(t, w.st, rec.Rollouts.Ref)
	require.Len(t, recRows, 2*len(w.set.Tasks))
	require.NotEmpty(t, recTurns, "the recording has no turns:\n%s", logs)
	masks, promptTokens, outputTokens, finish := 0, 0, 0, map[string]int{}
	for _, tr := range recTurns {
		require.NotEmpty(t, tr.OutputIDs, "rollout %d turn %d", tr.RolloutID, tr.Turn)
		masks += len(tr.TopPTokenIDs)
		promptTokens, outputTokens = promptTokens+len(tr.PromptIDs), outputTokens+len(tr.OutputIDs)
		finish[tr.FinishReason]++
	}
	assert.NotZero(t, masks, "the recorded turns hold top-p sampling masks")
	t.Logf("recorded %d rollouts, %d turns (%d prompt tokens, %d output tokens, %d sampling-mask ids, finish reasons %v)",
		len(recRows), len(recTurns), promptTokens, outputTokens, masks, finish)

	weightless := filepath.Join(t.TempDir(), "tiny-tokenizer")
	require.NoError(t, os.Mkdir(weightless, 0o755))
	for _, f := range rendererFiles {
		b, err := os.ReadFile(filepath.Join(tiny, f))
		require.NoError(t, err)
		require.NoError(t, os.WriteFile(filepath.Join(weightless, f), b, 0o644))
	}
	renderer := ge.Serve(t, weightless, "--tokenizer-only")

	replay := w.options("replay://" + rec.Turns.Ref.String())
	replay.TokenizerDir, replay.Jobs = tiny, o.Jobs
	replay.MaxTokens, replay.MaxTurns, replay.TopK, replay.TopP = o.MaxTokens, o.MaxTurns, o.TopK, o.TopP
	replay.ReplayRenderer = renderer
	res, err, logs := w.run(t, ctx, "rollout/servepy-replay", replay, nil)
	require.NoError(t, err, logs)
	assertReplayedAsRecorded(t, w.st, rec, res)

	// The renderer is serve.py --tokenizer-only: it never generates, and
	// kiln's engine client pointed at it as an engine says so.
	c, err := engine.New(engine.Options{BaseURL: renderer, Mode: engine.ModeGenerate})
	require.NoError(t, err)
	_, err = c.Probe(ctx)
	require.Error(t, err)
	assert.Contains(t, err.Error(), "503")
	assert.Contains(t, err.Error(), "serve.py --tokenizer-only does not generate; it is a replay renderer")
}
