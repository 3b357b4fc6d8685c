package dataset_test

import (
	"context"
	"errors"
	"fmt"
	"io"
	"io/fs"
	"os"
	"path/filepath"
	"syscall"
	"testing"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/kilnrl/kiln/formats/dataset"
	"github.com/kilnrl/kiln/formats/store"
)

// failingPut is a store whose Put of shards reads a little, then fails
// with err, as a full disk or a refused write does.
type failingPut struct {
	store.Store
	err error
}

func (f failingPut) Put(ctx context.Context, key string, r io.Reader, size int64) (store.Info, error) {
	io.CopyN(io.Discard, r, 10)
	return store.Info{}, fmt.Errorf("write %q: %w", key, f.err)
}

func TestWriteShardReportsTheStoresError(t *testing.T) {
	encodeErr := errors.New("row 7: malformed")
	cases := []struct {
		name    string
		err     error  // the store's Put error
		encode  error  // the encoder's own error, if any
		want    error  // errors.Is the reported error
		message string // in the reported error
	}{
		{"no space", syscall.ENOSPC, nil, syscall.ENOSPC, "no space left on device"},
		{"permission", fs.ErrPermission, nil, fs.ErrPermission, "permission denied"},
		{"not a directory", syscall.ENOTDIR, nil, syscall.ENOTDIR, "not a directory"},
		{"the encoder's error wins", syscall.ENOSPC, encodeErr, encodeErr, "row 7: malformed"},
	}
	for _, c := range cases {
		t.Run(c.name, func(t *testing.T) {
			ctx := context.Background()
			local, err := store.NewLocal(t.TempDir())
			require.NoError(t, err)
			w, err := dataset.NewWriter(ctx, failingPut{local, c.err}, spec("tasks/x", nil, dataset.Part{}))
			require.NoError(t, err)
			_, err = w.WriteShard(ctx, 1000, nil, func(wr io.Writer) error {
				if c.encode != nil {
					return c.encode
				}
				return encodeTasks(tasks(0, 1000))(wr)
			})
			require.Error(t, err)
			assert.ErrorIs(t, err, c.want)
			assert.ErrorContains(t, err, c.message)
			assert.NotContains(t, err.Error(), "stopped reading")
			assert.Contains(t, err.Error(), "tasks/x@", "names the version")
		})
	}
}

func TestWriteToStoreAtARegularFile(t *testing.T) {
	ctx := context.Background()
	file := filepath.Join(t.TempDir(), "not-a-dir")
	require.NoError(t, os.WriteFile(file, []byte("x"), 0o644))
	st, err := store.NewLocal(file)
	require.NoError(t, err)
	w, err := dataset.NewWriter(ctx, st, spec("tasks/x", nil, dataset.Part{}))
	if err == nil {
		_, err = w.WriteShard(ctx, 3, nil, encodeTasks(tasks(0, 3)))
	}
	require.Error(t, err)
	assert.ErrorIs(t, err, syscall.ENOTDIR)
	assert.NotContains(t, err.Error(), "stopped reading")
	assert.Contains(t, err.Error(), file)
}
