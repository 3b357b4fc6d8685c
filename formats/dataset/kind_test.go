package dataset_test

import (
	"context"
	"testing"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/kilnrl/kiln/formats/dataset"
	"github.com/kilnrl/kiln/formats/records"
	"github.com/kilnrl/kiln/formats/store"
)

// TestWriterRefusesAnotherKind: a name holds one record kind. A writer of
// another kind is refused before it writes anything, naming both kinds,
// whether the name's kind is found through its latest pointer or, without
// one, its newest version; the same kind, and a new name, are written.
func TestWriterRefusesAnotherKind(t *testing.T) {
	ctx := context.Background()
	for _, c := range []struct {
		name      string
		noPointer bool
	}{{"through the pointer", false}, {"without a pointer", true}} {
		t.Run(c.name, func(t *testing.T) {
			st, err := store.NewLocal(t.TempDir())
			require.NoError(t, err)
			require.NoError(t, rerun(ctx, st, "tasks", map[string]any{"v": 1}, nil))
			if c.noPointer {
				require.NoError(t, st.Delete(ctx, latestKey))
			}
			other := spec("tasks", map[string]any{"v": 2}, dataset.Part{})
			other.Kind = records.TrajectoriesKind()
			_, err = dataset.NewWriter(ctx, st, other)
			require.ErrorIs(t, err, dataset.ErrKindMismatch)
			assert.ErrorContains(t, err, "holds tasks")
			assert.ErrorContains(t, err, "writes trajectories")
			vs, err := dataset.List(ctx, st, "tasks")
			require.NoError(t, err)
			assert.Len(t, vs, 1)

			require.NoError(t, rerun(ctx, st, "tasks", map[string]any{"v": 3}, nil), "the same kind")
			other.Name = "trajectories"
			_, err = dataset.NewWriter(ctx, st, other)
			require.NoError(t, err, "a new name takes any kind")
		})
	}
}
