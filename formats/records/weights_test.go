package records

import (
	"bytes"
	"encoding/json"
	"strings"
	"testing"

	"github.com/stretchr/testify/require"
)

func TestWeightsRoundTrip(t *testing.T) {
	sum64 := strings.Repeat("ab", 32)
	sum32 := strings.Repeat("cd", 16)
	rows := []WeightsEntry{
		{Entry: EntryFile, Name: "config.json", File: "config.json", Size: 10, Checksum: sum64, Encoding: EncUnchanged},
		{Entry: EntryFile, Name: "model.safetensors", File: "model.safetensors", Size: 100, Checksum: sum64, Encoding: EncStored, Payload: "model.safetensors"},
		{Entry: EntryTensor, Name: "lm_head.weight", File: "model.safetensors", DType: "BF16", Shape: []int64{4, 8}, Offset: 72, Size: 64, Checksum: sum32, Encoding: EncXOR, Payload: "packs/pack-00000.zst", PayloadOffset: 5, PayloadSize: 20},
		{Entry: EntryTensor, Name: "norm.weight", File: "model.safetensors", DType: "F32", Shape: []int64{}, Offset: 136, Size: 4, Checksum: sum32, Encoding: EncUnchanged},
	}
	var buf bytes.Buffer
	enc, err := NewWeightsEncoder(&buf, ArrowOptions{})
	require.NoError(t, err)
	require.NoError(t, enc.Write(rows...))
	require.NoError(t, enc.Close())
	var got []WeightsEntry
	require.NoError(t, EachWeightsEntry(buf.Bytes(), func(e WeightsEntry) error { got = append(got, e); return nil }))
	rows[3].Shape = nil // a scalar's empty shape decodes as nil
	require.Equal(t, rows, got)

	var js []map[string]any
	require.NoError(t, WeightsKind().EachJSON(buf.Bytes(), func(r json.RawMessage) error {
		var m map[string]any
		require.NoError(t, json.Unmarshal(r, &m))
		js = append(js, m)
		return nil
	}))
	require.Equal(t, "lm_head.weight", js[2]["name"])
	require.Equal(t, []any{4.0, 8.0}, js[2]["shape"])
}

func TestWeightsValidate(t *testing.T) {
	sum64 := strings.Repeat("ab", 32)
	sum32 := strings.Repeat("cd", 16)
	ok := WeightsEntry{Entry: EntryTensor, Name: "w", File: "m.safetensors", DType: "BF16", Size: 2, Checksum: sum32, Encoding: EncReplace, Payload: "packs/p.zst", PayloadSize: 9}
	for _, tc := range []struct {
		name string
		edit func(e *WeightsEntry)
		want string
	}{
		{"escaping file", func(e *WeightsEntry) { e.File = "../x" }, `".." path segment`},
		{"absolute file", func(e *WeightsEntry) { e.File = "/etc/passwd" }, "relative"},
		{"negative size", func(e *WeightsEntry) { e.Size = -1 }, "negative"},
		{"sha256 on a tensor", func(e *WeightsEntry) { e.Checksum = sum64 }, "32 lowercase hex"},
		{"upper-case checksum", func(e *WeightsEntry) { e.Checksum = strings.ToUpper(sum32) }, "lowercase"},
		{"unknown encoding", func(e *WeightsEntry) { e.Encoding = "gzip" }, "unknown encoding"},
		{"delta without payload", func(e *WeightsEntry) { e.Payload = "" }, "want a relative"},
		{"payload on unchanged", func(e *WeightsEntry) { e.Encoding = EncUnchanged }, "does not use"},
		{"escaping payload", func(e *WeightsEntry) { e.Payload = "a/../../b" }, `".." path segment`},
		{"file with dtype", func(e *WeightsEntry) {
			e.Entry = EntryFile
			e.Name = e.File
			e.Checksum = sum64
			e.Encoding = EncStored
		}, "no dtype"},
		{"file renamed", func(e *WeightsEntry) {
			*e = WeightsEntry{Entry: EntryFile, Name: "a", File: "b", Checksum: sum64, Encoding: EncUnchanged}
		}, "differs"},
		{"file xor", func(e *WeightsEntry) {
			*e = WeightsEntry{Entry: EntryFile, Name: "a", File: "a", Checksum: sum64, Encoding: EncXOR, Payload: "p"}
		}, "want stored or unchanged"},
		{"bad entry", func(e *WeightsEntry) { e.Entry = "dir" }, "want file or tensor"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			e := ok
			e.Shape = []int64{1}
			require.NoError(t, e.Validate())
			tc.edit(&e)
			err := e.Validate()
			require.Error(t, err)
			require.Contains(t, err.Error(), tc.want)
		})
	}
}
