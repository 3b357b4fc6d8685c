package rollout

import (
	"context"
	"errors"
	"net/http/httptest"
	"path/filepath"
	"strings"
	"sync"
	"testing"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/kilnrl/kiln/fixtures"
	"github.com/kilnrl/kiln/formats/dataset"
	"github.com/kilnrl/kiln/formats/records"
	"github.com/kilnrl/kiln/formats/store"
	"github.com/kilnrl/kiln/internal/agent/adapter"
	"github.com/kilnrl/kiln/internal/agent/engine"
	"github.com/kilnrl/kiln/internal/agent/enginetest"
	"github.com/kilnrl/kiln/internal/stagecmd"
	"github.com/kilnrl/kiln/internal/stagecmd/stagetest"
)

// putWeights commits a weights version of name whose manifest carries
// metrics (kiln-sync's weights_number), with no rows: what a run stage
// reads of it is the kind and the number. It stands in for kiln-sync
// publish.
func putWeights(t testing.TB, st store.Store, name string, metrics map[string]any) dataset.Ref {
	t.Helper()
	ctx := context.Background()
	w, err := dataset.NewWriter(ctx, st, dataset.Spec{Name: name, Kind: records.WeightsKind(),
		Identity: dataset.Identity{Stage: "test-sync", Args: map[string]any{"test": t.Name(), "metrics": metrics}}})
	require.NoError(t, err)
	res, err := w.Commit(ctx, metrics)
	require.NoError(t, err)
	return res.Ref
}

// startWeightsEngine serves the scripted engine reporting weights version
// serves (nil: none), as serve.py does: in /v1/models and per token.
func startWeightsEngine(t testing.TB, s enginetest.Script, serves *int64) string {
	t.Helper()
	srv := httptest.NewServer(enginetest.New(enginetest.Options{Script: s, MaxModelLen: 1 << 16, WeightVersion: serves}))
	t.Cleanup(srv.Close)
	return srv.URL
}

func TestWeightsNumber(t *testing.T) {
	for _, tc := range []struct {
		v    any
		want int64
		ok   bool
	}{
		{float64(7), 7, true},
		{float64(0), 0, true},
		{"7", 7, true},
		{int64(3), 3, true},
		{float64(7.5), 0, false},
		{float64(-1), 0, false},
		{"-1", 0, false},
		{"seven", 0, false},
		{nil, 0, false},
		{true, 0, false},
	} {
		n, ok := weightsNumber(tc.v)
		assert.Equal(t, tc.ok, ok, "%#v", tc.v)
		if tc.ok {
			assert.Equal(t, tc.want, n, "%#v", tc.v)
		}
	}
}

// An engine's version names the weights number when it is the same
// integer (serve.py and vLLM report the number kiln-sync gave them, as a
// string or a number).
func TestSameVersion(t *testing.T) {
	for _, tc := range []struct {
		served string
		n      int64
		want   bool
	}{
		{"7", 7, true}, {" 7 ", 7, true}, {"007", 7, true}, {"8", 7, false}, {"step-7", 7, false}, {"", 7, false}, {"0", 0, true},
	} {
		assert.Equal(t, tc.want, sameVersion(tc.served, tc.n), "%q vs %d", tc.served, tc.n)
	}
}

// checkServedWeights passes only when every engine serves the number, and
// otherwise names each engine that does not, what it serves (or that it
// reports none) and what was asked, and says to run kiln-sync.
func TestCheckServedWeights(t *testing.T) {
	st, err := store.NewLocal(t.TempDir())
	require.NoError(t, err)
	w := &pinnedWeights{ref: putWeights(t, st, "weights/policy", map[string]any{"weights_number": 7}), number: 7}
	seven, six := int64(7), int64(6)
	ok := startWeightsEngine(t, enginetest.Sequence("x"), &seven)
	stale := startWeightsEngine(t, enginetest.Sequence("x"), &six)
	none := startWeightsEngine(t, enginetest.Sequence("x"), nil)
	for _, tc := range []struct {
		name    string
		engines []string
		want    []string // in the error; none: no error
	}{
		{"all serve it", []string{ok, ok}, nil},
		{"one serves another", []string{ok, stale}, []string{stale + " serves weights number 6, not 7", "1 of 2 engines", "weights number 7", "kiln-sync reload", w.ref.String()}},
		{"one reports none", []string{none, ok}, []string{none + ": cannot tell which weights it serves", "reports no weights version", "kiln-sync"}},
		{"both", []string{stale, none}, []string{"2 of 2 engines", stale + " serves weights number 6", none + ": cannot tell"}},
	} {
		t.Run(tc.name, func(t *testing.T) {
			err := checkServedWeights(context.Background(), tc.engines, w, RunOptions{})
			if tc.want == nil {
				require.NoError(t, err)
				return
			}
			require.Error(t, err)
			assert.NotContains(t, err.Error(), ok+" ", "an engine serving the number is not named")
			assert.Equal(t, stagecmd.ExitFailure, stagecmd.ExitCode(err))
			for _, s := range tc.want {
				assert.Contains(t, err.Error(), s)
			}
		})
	}
}

// observeWeights ends a session's run, once, when a generation of it
// reports a token of other weights, naming the session's turn and the
// versions seen; generations without versions, of no session, or of the
// number asked pass.
func TestObserveWeights(t *testing.T) {
	fr, _, _ := newTestFront(t, 1, false)
	fr.weights = &pinnedWeights{ref: dataset.Ref{Name: "weights/policy", Version: "v1"}, number: 7}
	var causes []error
	id := newSessionID()
	_, err := fr.open(id, adapter.SessionOptions{}, func(err error) { causes = append(causes, err) })
	require.NoError(t, err)
	defer fr.close(id)
	gen := func(sid string, versions ...string) {
		fr.observeWeights(&engine.GenerateRequest{SessionID: sid}, &engine.Generation{WeightVersions: versions})
	}
	gen("")                // the probe: no session
	gen("kiln-other", "8") // not a session of this stage
	gen(id, "7", "7", "7") // turn 0: the number asked
	gen(id)                // turn 1: no versions reported
	require.Empty(t, causes)
	gen(id, "7", "8", "8", "7") // turn 2: a reload mid-reply
	gen(id, "9")                // turn 3: the run is already ending
	require.Len(t, causes, 1)
	var changed *weightsChangedError
	require.True(t, errors.As(causes[0], &changed))
	assert.Equal(t, "turn 2 was generated with weights version 7, 8, but the run asked for weights number 7 (weights/policy@v1): "+
		"an engine loaded other weights while the run went (a kiln-sync reload during the rollouts?)", changed.Error())

	// Without --weights nothing is checked.
	fr.weights = nil
	other := newSessionID()
	_, err = fr.open(other, adapter.SessionOptions{}, func(err error) { causes = append(causes, err) })
	require.NoError(t, err)
	defer fr.close(other)
	gen(other, "8")
	assert.Len(t, causes, 1)
}

// TestRunWeightsUsage: --weights with --weights-version, an unknown
// --engine-protocol and a --weights version of another kind are usage
// errors (exit 2), and a weights version without a number bad input (exit
// 5), all before any engine is asked or any sandbox boots.
func TestRunWeightsUsage(t *testing.T) {
	dir := t.TempDir()
	st, err := store.NewLocal(dir)
	require.NoError(t, err)
	weights := putWeights(t, st, "weights/policy", map[string]any{"weights_number": 7})
	unnumbered := putWeights(t, st, "weights/unnumbered", map[string]any{"full": true})
	other := putTurnsForTest(t, st, "rollout/old/turns")
	base := []string{"run", "--store", dir, "--tasks", "tasks@t", "--images", "images@i", "--bundles", dir,
		"--engine", "http://127.0.0.1:1", "--out", "rollout/usage"}
	for _, tc := range []struct {
		name string
		args []string
		code int
		want []string
	}{
		{"both weights flags", []string{"--weights", weights.String(), "--weights-version", "step-3"}, 2,
			[]string{"--weights " + `"` + weights.String() + `"`, "--weights-version", "give one"}},
		{"unknown protocol", []string{"--weights", weights.String(), "--engine-protocol", "tgi"}, 2, []string{"--engine-protocol", "tgi"}},
		{"another kind", []string{"--weights", other.String()}, 2, []string{"--weights " + other.String() + " holds turns records, not weights"}},
		{"another kind by name", []string{"--weights", "rollout/old/turns"}, 2, []string{"--weights " + other.String() + " holds turns records"}},
		{"no number", []string{"--weights", unnumbered.String()}, 5, []string{unnumbered.String(), "no weights number"}},
		{"not found", []string{"--weights", "weights/nope@0123"}, 3, []string{"weights/nope@0123"}},
	} {
		t.Run(tc.name, func(t *testing.T) {
			r := stagetest.Run(t, stageCommands, append(append([]string(nil), base...), tc.args...)...)
			assert.Equal(t, tc.code, r.Code, r.Stderr)
			for _, s := range tc.want {
				assert.Contains(t, r.Stderr, s)
			}
		})
	}
	_, err = dataset.OpenString(context.Background(), st, "rollout/usage/rollouts")
	assert.Error(t, err, "nothing is written")
}

// putTurnsForTest commits an empty turns version: a dataset of another
// kind than weights.
func putTurnsForTest(t testing.TB, st store.Store, name string) dataset.Ref {
	t.Helper()
	ctx := context.Background()
	w, err := dataset.NewWriter(ctx, st, dataset.Spec{Name: name, Kind: records.TurnsKind(),
		Identity: dataset.Identity{Stage: "test", Args: map[string]any{"test": t.Name()}}})
	require.NoError(t, err)
	res, err := w.Commit(ctx, nil)
	require.NoError(t, err)
	return res.Ref
}

// TestRunWeights runs the stage in bwrap sandboxes with --weights against
// engines that serve the weights number, another, or none, and one whose
// tokens change weights in one run (docs/sync.md §5).
func TestRunWeights(t *testing.T) {
	w := newRunWorld(t)
	ctx := context.Background()
	weights := putWeights(t, w.st, "weights/policy", map[string]any{"weights_number": 7})
	seven, six := int64(7), int64(6)

	// noSandbox checks that a stage that failed its engine check booted no
	// sandbox (a booted one saves its artifacts under the rollouts'
	// runs/), made no model call and committed nothing.
	noSandbox := func(t *testing.T, name string, model *scriptedModel) {
		t.Helper()
		require.NoError(t, w.st.List(ctx, name+"/", func(info store.Info) error {
			assert.NotContains(t, info.Key, "/runs/", "a sandbox booted")
			return nil
		}))
		assert.Empty(t, model.behaviours(), "an agent made a model call")
		for _, s := range []string{"/rollouts", "/turns", "/trajectories"} {
			_, err := dataset.OpenString(ctx, w.st, name+s)
			assert.Error(t, err, name+s)
		}
	}

	t.Run("serves the number", func(t *testing.T) {
		model := newScriptedModel(w.set, func(fixtures.Task, int) behaviour { return lookAround })
		o := w.options(startWeightsEngine(t, model.script, &seven))
		o.Samples, o.Jobs, o.WeightsVersion, o.Weights = 1, len(w.set.Tasks), "", "weights/policy" // a bare name, pinned by the stage
		res, err, logs := w.run(t, ctx, "rollout/weights-ok", o, nil)
		require.NoError(t, err, logs)
		rows := readRollouts(t, w.st, res.Rollouts.Ref)
		require.Len(t, rows, len(w.set.Tasks))
		for _, r := range rows {
			assert.Nil(t, r.AbortReason, "%s: %s", r.TaskID, deref(r.AbortDetail))
			assert.Equal(t, weights.String(), r.WeightsVersion, r.TaskID)
		}
		for _, v := range []*dataset.Version{res.Rollouts.Version, res.Turns.Version, res.Trajectories.Version} {
			require.NotNil(t, v)
			assert.Contains(t, v.Inputs, weights, "%s: lineage", v.Dataset)
			assert.Equal(t, weights.String(), v.Metrics["weights"], v.Dataset)
			assert.Equal(t, "7", v.Metrics["weights_number"], v.Dataset)
		}
		// The weights are part of the version id: the same run without
		// them (or with others) is another version.
		o2 := o
		o2.Weights, o2.WeightsVersion = "", ""
		var pv strings.Builder
		_, err = Run(ctx, w.env(&pv), w.st, RunOutput{Name: "rollout/weights-ok", PrintVersion: true}, o2)
		require.NoError(t, err)
		assert.NotContains(t, pv.String(), res.Rollouts.Ref.Version)
	})

	t.Run("serves another number", func(t *testing.T) {
		model := newScriptedModel(w.set, func(fixtures.Task, int) behaviour { return lookAround })
		url := startWeightsEngine(t, model.script, &six)
		r := stagetest.Run(t, stageCommands, "run", "--store", w.storeDir, "--tasks", w.tasks, "--images", w.images,
			"--bundles", w.bundles, "--engine", url, "--tokenizer-dir", w.tokenizer, "--mode", "generate",
			"--agent-binary", filepath.Join(w.tools, "kiln-agent"), "--weights", weights.String(), "--out", "rollout/weights-stale")
		assert.Equal(t, 1, r.Code, r.Stderr)
		assert.Contains(t, r.Stderr, url+" serves weights number 6, not 7")
		assert.Contains(t, r.Stderr, "--weights "+weights.String()+" is weights number 7")
		assert.Contains(t, r.Stderr, "no run was started")
		assert.Contains(t, r.Stderr, "kiln-sync reload")
		noSandbox(t, "rollout/weights-stale", model)
	})

	t.Run("reports no number", func(t *testing.T) {
		model := newScriptedModel(w.set, func(fixtures.Task, int) behaviour { return lookAround })
		url := startWeightsEngine(t, model.script, nil)
		o := w.options(url)
		o.WeightsVersion, o.Weights = "", weights.String()
		_, err, logs := w.run(t, ctx, "rollout/weights-none", o, nil)
		require.Error(t, err, logs)
		assert.Equal(t, stagecmd.ExitFailure, stagecmd.ExitCode(err))
		assert.Contains(t, err.Error(), url+": cannot tell which weights it serves")
		assert.Contains(t, err.Error(), "reports no weights version")
		noSandbox(t, "rollout/weights-none", model)
	})

	t.Run("tokens change weights mid-run", func(t *testing.T) {
		model := newScriptedModel(w.set, func(fixtures.Task, int) behaviour { return lookAround })
		// The first session's second model call (its final answer) is
		// generated partly with weights 8: a reload mid-reply.
		var mu sync.Mutex
		victim := ""
		script := func(r enginetest.Request) enginetest.Output {
			out := model.script(r)
			if r.SessionID == "" {
				return out
			}
			mu.Lock()
			if victim == "" {
				victim = r.SessionID
			}
			hit := victim == r.SessionID && r.Turn == 1
			mu.Unlock()
			if hit {
				out.WeightVersions = []int64{7, 7, 8}
			}
			return out
		}
		o := w.options(startWeightsEngine(t, script, &seven))
		o.Samples, o.Jobs, o.WeightsVersion, o.Weights = 1, len(w.set.Tasks), "", weights.String()
		res, err, logs := w.run(t, ctx, "rollout/weights-changed", o, nil)
		require.NoError(t, err, logs)
		rows := readRollouts(t, w.st, res.Rollouts.Ref)
		require.Len(t, rows, len(w.set.Tasks))
		turns := readTurns(t, w.st, res.Turns.Ref)
		aborted := 0
		for _, r := range rows {
			assert.Equal(t, weights.String(), r.WeightsVersion)
			if r.AbortReason == nil {
				assert.Positive(t, r.Turns, r.TaskID)
				continue
			}
			aborted++
			assert.Equal(t, AbortWeightsChanged, *r.AbortReason, "%s: %s", r.TaskID, deref(r.AbortDetail))
			assert.Equal(t, "turn 1 was generated with weights version 7, 8, but the run asked for weights number 7 ("+weights.String()+
				"): an engine loaded other weights while the run went (a kiln-sync reload during the rollouts?)", deref(r.AbortDetail))
			for _, tr := range turns {
				assert.NotEqual(t, r.RolloutID, tr.RolloutID, "an aborted run's turns were kept")
			}
		}
		assert.Equal(t, 1, aborted, logs)
		assert.Equal(t, 1, abortCount(res.Rollouts.Version.Metrics, AbortWeightsChanged))
	})
}

// abortCount is the manifest's count of runs aborted for reason.
func abortCount(m map[string]any, reason string) int {
	f, _ := m["abort_"+reason].(float64)
	return int(f)
}
