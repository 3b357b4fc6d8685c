package sync

import (
	"bytes"
	"encoding/binary"
	"testing"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/kilnrl/kiln/internal/stagecmd"
	"github.com/kilnrl/kiln/stages/sync/synctest"
)

// TestSafetensorsHeader: a well-formed file's tensors come back in file
// order with absolute offsets; every way a header can disagree with the
// bytes is bad input (exit 5) naming the file.
func TestSafetensorsHeader(t *testing.T) {
	good, err := synctest.Safetensors([]synctest.Tensor{
		{Name: "b", DType: "F32", Shape: []int64{2, 2}, Data: make([]byte, 16)},
		{Name: "a", DType: "BF16", Shape: []int64{3}, Data: make([]byte, 6)},
		{Name: "e", DType: "U8", Shape: []int64{0}, Data: nil},
	})
	require.NoError(t, err)
	h, err := readSafetensorsHeader(bytes.NewReader(good), int64(len(good)), "m.safetensors")
	require.NoError(t, err)
	require.Len(t, h.Tensors, 3)
	assert.Equal(t, "b", h.Tensors[0].Name)
	assert.Equal(t, h.DataStart, h.Tensors[0].Offset)
	assert.Equal(t, int64(16), h.Tensors[0].Size)
	assert.Equal(t, map[string]string{"format": "pt"}, h.Metadata)

	raw := func(header string, data int) []byte {
		b := binary.LittleEndian.AppendUint64(nil, uint64(len(header)))
		return append(append(b, header...), make([]byte, data)...)
	}
	cases := map[string][]byte{
		"short":           good[:5],
		"huge header":     binary.LittleEndian.AppendUint64(nil, 1<<40),
		"not json":        raw("{nope", 0),
		"unknown dtype":   raw(`{"a":{"dtype":"Q7","shape":[1],"data_offsets":[0,1]}}`, 1),
		"shape mismatch":  raw(`{"a":{"dtype":"F32","shape":[2],"data_offsets":[0,4]}}`, 4),
		"gap":             raw(`{"a":{"dtype":"U8","shape":[1],"data_offsets":[1,2]}}`, 2),
		"overlap":         raw(`{"a":{"dtype":"U8","shape":[2],"data_offsets":[0,2]},"b":{"dtype":"U8","shape":[2],"data_offsets":[1,3]}}`, 3),
		"trailing bytes":  raw(`{"a":{"dtype":"U8","shape":[1],"data_offsets":[0,1]}}`, 2),
		"truncated data":  raw(`{"a":{"dtype":"U8","shape":[4],"data_offsets":[0,4]}}`, 3),
		"negative shape":  raw(`{"a":{"dtype":"U8","shape":[-1],"data_offsets":[0,0]}}`, 0),
		"bad offsets":     raw(`{"a":{"dtype":"U8","shape":[1],"data_offsets":[1]}}`, 1),
		"metadata number": raw(`{"__metadata__":{"x":1}}`, 0),
	}
	for name, b := range cases {
		t.Run(name, func(t *testing.T) {
			_, err := readSafetensorsHeader(bytes.NewReader(b), int64(len(b)), "m.safetensors")
			require.Error(t, err)
			assert.Equal(t, stagecmd.ExitBadInput, stagecmd.ExitCode(err), "%v", err)
			assert.Contains(t, err.Error(), `"m.safetensors"`)
		})
	}
}
