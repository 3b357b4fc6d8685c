package images

import (
	"bytes"
	"errors"
	"io"
	"os"
	"path/filepath"
	"testing"

	v1 "github.com/google/go-containerregistry/pkg/v1"
	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
)

// TestDecompressIntoScratch: while a base layer is decompressed, its
// partial bytes live in the build's scratch directory, never under the
// shared cache (a build killed there would leave them where nothing sweeps
// them); an error leaves nothing in either, and a complete layer is renamed
// to its name whole.
func TestDecompressIntoScratch(t *testing.T) {
	shared, scratch := t.TempDir(), t.TempDir()
	path := filepath.Join(shared, "blobs", "sha256", "abc")
	var during []string
	failing := readerLayer{open: func() io.ReadCloser {
		return io.NopCloser(io.MultiReader(
			bytes.NewReader(make([]byte, 1<<16)),
			readFunc(func([]byte) (int, error) {
				for _, dir := range []string{filepath.Dir(path), scratch} {
					ents, _ := os.ReadDir(dir)
					for _, e := range ents {
						during = append(during, filepath.Join(filepath.Base(dir), e.Name()))
					}
				}
				return 0, errors.New("connection reset")
			})))
	}}
	err := decompressInto(path, scratch, failing)
	require.ErrorContains(t, err, "connection reset")
	require.Len(t, during, 1, "one partial file while writing: %q", during)
	assert.Equal(t, filepath.Base(scratch), filepath.Dir(during[0]), "the partial layer is in scratch, not beside its name")
	for _, dir := range []string{filepath.Dir(path), scratch} {
		ents, err := os.ReadDir(dir)
		require.NoError(t, err)
		assert.Empty(t, ents, "%s after a failed decompression", dir)
	}

	whole := readerLayer{open: func() io.ReadCloser { return io.NopCloser(bytes.NewReader(make([]byte, 3<<16))) }}
	require.NoError(t, decompressInto(path, scratch, whole))
	st, err := os.Stat(path)
	require.NoError(t, err)
	assert.EqualValues(t, 3<<16, st.Size())
	ents, _ := os.ReadDir(scratch)
	assert.Empty(t, ents, "scratch after a complete decompression")
}

// readerLayer is a v1.Layer whose only method in use is Uncompressed.
type readerLayer struct {
	v1.Layer
	open func() io.ReadCloser
}

func (l readerLayer) Uncompressed() (io.ReadCloser, error) { return l.open(), nil }

type readFunc func([]byte) (int, error)

func (f readFunc) Read(p []byte) (int, error) { return f(p) }
