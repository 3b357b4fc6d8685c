package dataset_test

import (
	"context"
	"fmt"
	"sync"
	"testing"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/kilnrl/kiln/formats/dataset"
	"github.com/kilnrl/kiln/formats/store"
)

// forwardOnly is a Spec.LatestIf that moves the pointer only to a higher
// number, numbers being known per version id.
func forwardOnly(numbers map[string]int, mine int) func(context.Context, *dataset.Latest) (bool, error) {
	return func(_ context.Context, cur *dataset.Latest) (bool, error) {
		if cur == nil {
			return true, nil
		}
		n, ok := numbers[cur.Version]
		if !ok {
			return false, fmt.Errorf("pointer names unknown version %s", cur.Version)
		}
		return n < mine, nil
	}
}

// TestLatestIf: with a forward-only condition, the pointer ends at the
// highest number whatever order the writers commit in, concurrently or
// one after the other, and a rerun of a lower one leaves it there.
func TestLatestIf(t *testing.T) {
	eachStore(t, func(t *testing.T, st store.Store) {
		ctx := context.Background()
		const writers = 8
		numbers := map[string]int{}
		specs := make([]dataset.Spec, writers)
		for i := range writers {
			specs[i] = spec("tasks", map[string]any{"n": i}, dataset.Part{})
			v, err := specs[i].Identity.Version()
			require.NoError(t, err)
			numbers[v] = i
		}
		for i := range specs {
			specs[i].LatestIf = forwardOnly(numbers, i)
		}
		commit := func(s dataset.Spec) (dataset.Result, error) {
			w, err := dataset.NewWriter(ctx, st, s)
			if err != nil {
				return dataset.Result{}, err
			}
			if w.Existing() == nil {
				if _, err := w.WriteShard(ctx, 1, nil, encodeTasks(tasks(0, 1))); err != nil {
					return dataset.Result{}, err
				}
			}
			return w.Commit(ctx, nil)
		}
		var wg sync.WaitGroup
		errs := make(chan error, writers)
		for i := range writers {
			wg.Go(func() {
				if _, err := commit(specs[i]); err != nil {
					errs <- fmt.Errorf("writer %d: %w", i, err)
				}
			})
		}
		wg.Wait()
		close(errs)
		for err := range errs {
			require.NoError(t, err)
		}
		l, err := dataset.ReadLatest(ctx, st, "tasks")
		require.NoError(t, err)
		assert.Equal(t, writers-1, numbers[l.Version], "the pointer ends at the highest number")

		// A rerun of a lower version finds it committed and keeps the pointer.
		res, err := commit(specs[2])
		require.NoError(t, err)
		assert.True(t, res.Existed)
		require.NotNil(t, res.Latest)
		assert.Equal(t, writers-1, numbers[res.Latest.Version])
		l, err = dataset.ReadLatest(ctx, st, "tasks")
		require.NoError(t, err)
		assert.Equal(t, writers-1, numbers[l.Version])
	})
}
