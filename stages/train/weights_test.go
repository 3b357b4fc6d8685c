package train

import (
	"context"
	"io"
	"testing"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/kilnrl/kiln/formats/dataset"
	"github.com/kilnrl/kiln/formats/records"
)

// generatedWith reads the weights from the trajectories' manifest metrics
// as kiln-rollout run writes them (the number as a decimal string, so
// that parts do not sum it), a number, or lists; anything else names
// nothing.
func TestGeneratedWith(t *testing.T) {
	for _, tc := range []struct {
		name    string
		metrics map[string]any
		want    []GeneratedWeights
	}{
		{"none", map[string]any{"runs": 4.0}, []GeneratedWeights{}},
		{"nil metrics", nil, []GeneratedWeights{}},
		{"as kiln-rollout writes it", map[string]any{"weights": "weights/policy@a", "weights_number": "7"}, []GeneratedWeights{{"weights/policy@a", 7}}},
		{"a number", map[string]any{"weights": "weights/policy@a", "weights_number": 7.0}, []GeneratedWeights{{"weights/policy@a", 7}}},
		{"no number", map[string]any{"weights": "weights/policy@a"}, []GeneratedWeights{{"weights/policy@a", -1}}},
		{"a bad number", map[string]any{"weights": "weights/policy@a", "weights_number": 7.5}, []GeneratedWeights{{"weights/policy@a", -1}}},
		{"lists, distinct", map[string]any{"weights": []any{"weights/policy@a", "weights/policy@b", "weights/policy@a"}, "weights_number": []any{"7", 8.0, "7"}},
			[]GeneratedWeights{{"weights/policy@a", 7}, {"weights/policy@b", 8}}},
		{"not a reference", map[string]any{"weights": 7.0, "weights_number": "7"}, []GeneratedWeights{}},
	} {
		t.Run(tc.name, func(t *testing.T) {
			assert.Equal(t, tc.want, generatedWith(tc.metrics))
		})
	}
}

// TestTrainNamesWeights: the checkpoints version names the weights its
// trajectories were generated with (generated_with_weights), read from the
// trajectories' manifest; none when they name none.
func TestTrainNamesWeights(t *testing.T) {
	w := newWorld(t)
	ctx := context.Background()
	segs := fixture()
	for i := range segs {
		segs[i].TopPOffsets, segs[i].TopPIDs, segs[i].TopPLogProbs = nil, nil, nil
	}
	// Trajectories as kiln-rollout run --weights commits them.
	traj := putWithMetrics(t, w, "rollout/w/trajectories", segs, map[string]any{"runs": 8, "weights": "weights/policy@abc", "weights_number": "7"})
	adv := putAdvantages(t, w.st, "advantages-w", traj, segs)
	for _, tc := range []struct {
		name       string
		traj, adv  dataset.Ref
		wantWeight []any
	}{
		{"with weights", traj, adv, []any{map[string]any{"weights": "weights/policy@abc", "weights_number": 7.0}}},
		{"without", w.trajectories, w.advantages, []any{}},
	} {
		t.Run(tc.name, func(t *testing.T) {
			out, errs, code := w.run(t, "--trajectories", tc.traj.String(), "--advantages", tc.adv.String(), "--model", w.model, "--out", "ckpt-w")
			require.Equal(t, 0, code, errs)
			v, err := dataset.OpenString(ctx, w.st, lastLine(out))
			require.NoError(t, err)
			assert.Equal(t, tc.wantWeight, v.Metrics["generated_with_weights"])
		})
	}
}

// putWithMetrics commits segs as a trajectories version whose manifest
// carries metrics.
func putWithMetrics(t *testing.T, w *world, name string, segs []Segment, metrics map[string]any) dataset.Ref {
	t.Helper()
	ctx := context.Background()
	wr, err := dataset.NewWriter(ctx, w.st, dataset.Spec{Name: name, Kind: records.TrajectoriesKind(),
		Identity: dataset.Identity{Stage: "test", Args: map[string]any{"t": t.Name()}}})
	require.NoError(t, err)
	_, err = wr.WriteShard(ctx, int64(len(segs)), nil, func(out io.Writer) error {
		enc, err := records.NewTrajectoryEncoder(out, records.ArrowOptions{})
		if err != nil {
			return err
		}
		for _, s := range segs {
			if err := enc.Write(records.Trajectory{RolloutID: s.RolloutID, Index: s.RolloutID, Segment: s.Segment, Tokens: s.Tokens,
				ResponseLength: s.ResponseLength, LossMask: s.LossMask, RolloutLogProbs: s.RolloutLogProbs}); err != nil {
				return err
			}
		}
		return enc.Close()
	})
	require.NoError(t, err)
	res, err := wr.Commit(ctx, metrics)
	require.NoError(t, err)
	return res.Ref
}
