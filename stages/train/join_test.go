package train

import (
	"context"
	"testing"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/kilnrl/kiln/formats/dataset"
	"github.com/kilnrl/kiln/internal/stagecmd"
)

// TestJoinBadInputs: each bad input of the join (docs/train-stage.md §2)
// is exit 5 from kiln-train naming the row, and commits nothing. The
// segments are fixture()'s without replay data: rollout 10 has segments
// 0, 1 and 2; 11, 12, 13 and 14 one each.
func TestJoinBadInputs(t *testing.T) {
	w := newWorld(t)
	plain := func() []Segment {
		segs := fixture()
		for i := range segs {
			segs[i].TopPOffsets, segs[i].TopPIDs, segs[i].TopPLogProbs = nil, nil, nil
		}
		return segs
	}
	without := func(segs []Segment, rollout int64, segment int32) []Segment {
		var out []Segment
		for _, s := range segs {
			if s.RolloutID != rollout || s.Segment != segment {
				out = append(out, s)
			}
		}
		return out
	}
	cases := []struct {
		name string
		traj []Segment // the trajectories' segments
		adv  []Segment // the advantages' rows (rollout, segment, advantage, denominator)
		want string
	}{
		{"advantages row twice", plain(), append(plain(), plain()[1]), "advantages: rollout 11 segment 0 has two rows"},
		{"trajectories segment twice", append(plain(), plain()[3]), plain(), "trajectories: rollout 12 segment 0 appears twice"},
		{"advantages row without its segment", without(plain(), 13, 0), plain(),
			"advantages row rollout 13 segment 0 has no segment in the trajectories"},
		{"rollout only partly in the advantages", plain(), without(plain(), 10, 1),
			"rollout 10 has advantages for some of its segments only"},
		{"denominator mismatch", plain(), func() []Segment {
			s := plain()
			s[5].RolloutTrainedTokens = 7 // rollout 13, one trained token
			return s
		}(), "rollout 13: advantages say 7 trained tokens (rollout_trained_tokens), its segments' loss masks hold 1"},
		{"mixed top-p", func() []Segment {
			s := plain()
			f := fixture()
			s[3].TopPOffsets, s[3].TopPIDs, s[3].TopPLogProbs = f[3].TopPOffsets, f[3].TopPIDs, f[3].TopPLogProbs // rollout 12
			return s
		}(), plain(), "rollout 12 segment 0 carries top-p replay data and rollout 14 segment 0 does not"},
	}
	for i, c := range cases {
		t.Run(c.name, func(t *testing.T) {
			traj := putSegments(t, w.st, "trajectories-bad-"+itoa(i), c.traj)
			adv := putAdvantages(t, w.st, "advantages-bad-"+itoa(i), traj, c.adv)
			out, errs, code := w.run(t, "--trajectories", traj.String(), "--advantages", adv.String(), "--model", w.model, "--out", "ckpt-"+itoa(i))
			assert.Equal(t, stagecmd.ExitBadInput, code, "stderr: %s", errs)
			assert.Contains(t, errs, "trajectories "+traj.String()+", advantages "+adv.String()+": "+c.want)
			assert.NotContains(t, out, "ckpt-"+itoa(i)+"@")
			_, err := dataset.Resolve(context.Background(), w.st, "ckpt-"+itoa(i))
			require.ErrorIs(t, err, dataset.ErrNotFound)
		})
	}
}
