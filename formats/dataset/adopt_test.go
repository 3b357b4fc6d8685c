package dataset_test

import (
	"context"
	"slices"
	"testing"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/kilnrl/kiln/formats/dataset"
	"github.com/kilnrl/kiln/formats/store"
)

// Spec.Adopt decides which receipts of an earlier attempt a resuming
// writer keeps; rejected ones are redone and never reach the manifest.
func TestSpecAdopt(t *testing.T) {
	cases := []struct {
		name  string
		adopt func([]string) bool
		done  []string // rows the resuming writer keeps
	}{
		{"nil adopts all", nil, []string{"task-000", "task-001", "task-002", "task-003"}},
		{"reject the second shard", func(keys []string) bool { return !slices.Contains(keys, "task-002") },
			[]string{"task-000", "task-001"}},
		{"reject all", func([]string) bool { return false }, nil},
	}
	for _, c := range cases {
		t.Run(c.name, func(t *testing.T) {
			ctx := context.Background()
			st, err := store.NewLocal(t.TempDir())
			require.NoError(t, err)
			first, err := dataset.NewWriter(ctx, st, spec("adopt", nil, dataset.Part{}))
			require.NoError(t, err)
			writeTasks(t, ctx, first, 0, 2)
			writeTasks(t, ctx, first, 2, 2)
			// The first attempt dies; the second resumes.
			s := spec("adopt", nil, dataset.Part{})
			s.Adopt = c.adopt
			again, err := dataset.NewWriter(ctx, st, s)
			require.NoError(t, err)
			var kept []string
			for _, tk := range tasks(0, 4) {
				if again.Done(tk.TaskID) {
					kept = append(kept, tk.TaskID)
				}
			}
			assert.Equal(t, c.done, kept)
			todo := 4 - len(kept)
			writeTasks(t, ctx, again, len(kept), todo)
			res, err := again.Commit(ctx, nil)
			require.NoError(t, err)
			assert.Equal(t, []string{"task-000", "task-001", "task-002", "task-003"}, readIDs(t, ctx, res.Version))
		})
	}
}
