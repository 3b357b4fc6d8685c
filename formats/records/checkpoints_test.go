package records

import (
	"bytes"
	"encoding/json"
	"strings"
	"testing"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
)

func TestCheckpointsRoundTrip(t *testing.T) {
	sum := strings.Repeat("ab", 32)
	want := []CheckpointFile{
		{Name: "config.json", Size: 712, SHA256: sum},
		{Name: "model-00001-of-00001.safetensors", Size: 39_000_000, SHA256: sum},
		{Name: "sub/tokenizer.json", Size: 0, SHA256: sum},
	}
	for _, opts := range []ArrowOptions{{}, {Uncompressed: true}, {BatchTokens: 1}} {
		var buf bytes.Buffer
		enc, err := NewCheckpointEncoder(&buf, opts)
		require.NoError(t, err)
		require.NoError(t, enc.Write(want...))
		require.NoError(t, enc.Close())
		var got []CheckpointFile
		require.NoError(t, EachCheckpointFile(buf.Bytes(), func(f CheckpointFile) error { got = append(got, f); return nil }))
		assert.Equal(t, want, got, "options %+v", opts)
		var rows []json.RawMessage
		require.NoError(t, CheckpointsKind().EachJSON(buf.Bytes(), func(r json.RawMessage) error { rows = append(rows, r); return nil }))
		require.Len(t, rows, 3)
		assert.JSONEq(t, `{"name":"config.json","size":712,"sha256":"`+sum+`"}`, string(rows[0]))
	}
	k, err := Lookup("checkpoints")
	require.NoError(t, err)
	assert.Equal(t, Arrow, k.Encoding)
}

func TestCheckpointFileValidate(t *testing.T) {
	sum := strings.Repeat("0", 64)
	cases := []struct {
		f   CheckpointFile
		err string
	}{
		{CheckpointFile{Name: "", SHA256: sum}, "relative"},
		{CheckpointFile{Name: "/etc/passwd", SHA256: sum}, "relative"},
		{CheckpointFile{Name: "a/../b", SHA256: sum}, `".."`},
		{CheckpointFile{Name: "a//b", SHA256: sum}, "empty"},
		{CheckpointFile{Name: "a", Size: -1, SHA256: sum}, "negative"},
		{CheckpointFile{Name: "a", SHA256: "xyz"}, "64 lowercase hex"},
		{CheckpointFile{Name: "a", SHA256: strings.Repeat("A", 64)}, "64 lowercase hex"},
	}
	for _, c := range cases {
		var buf bytes.Buffer
		enc, err := NewCheckpointEncoder(&buf, ArrowOptions{})
		require.NoError(t, err)
		assert.ErrorContains(t, enc.Write(c.f), c.err, "%+v", c.f)
	}
}
