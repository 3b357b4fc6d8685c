package records_test

import (
	"bytes"
	"encoding/json"
	"os"
	"path/filepath"
	"testing"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/kilnrl/kiln/formats/records"
)

// TestIndependentReadersAdvantages reads an advantages shard (zstd, several
// record batches) with Apache Arrow JS (testdata/interop/arrow_trajectories.cjs
// prints any Arrow IPC file's rows) and compares every column with kiln's
// JSON view of the same rows.
func TestIndependentReadersAdvantages(t *testing.T) {
	npmDir := interopNPMDir(t)
	rows := []records.Advantage{
		{RolloutID: 0, Segment: 0, GroupIndex: 7, Advantage: 0.8660239037870368, RolloutTrainedTokens: 5, Reward: 1},
		{RolloutID: 0, Segment: 1, GroupIndex: 7, Advantage: 0.8660239037870368, RolloutTrainedTokens: 5, Reward: 1},
		{RolloutID: 1 << 40, Segment: 3, GroupIndex: 8, Advantage: -1.499997000006, RolloutTrainedTokens: 123456, Reward: 0},
	}
	var buf bytes.Buffer
	enc, err := records.NewAdvantageEncoder(&buf, records.ArrowOptions{BatchTokens: 2})
	require.NoError(t, err)
	require.NoError(t, enc.Write(rows...))
	require.NoError(t, enc.Close())
	file := filepath.Join(t.TempDir(), "advantages.arrow")
	require.NoError(t, os.WriteFile(file, buf.Bytes(), 0o644))

	var got struct {
		NumRows    int              `json:"numRows"`
		Batches    int              `json:"batches"`
		ZstdFrames int              `json:"zstdFrames"`
		Rows       []map[string]any `json:"rows"`
		Fields     []struct {
			Name     string `json:"name"`
			Nullable bool   `json:"nullable"`
		} `json:"fields"`
	}
	require.NoError(t, json.Unmarshal(runNode(t, npmDir, "arrow_trajectories.cjs", file), &got))
	assert.Equal(t, 2, got.Batches)
	assert.Positive(t, got.ZstdFrames)
	schema := records.AdvantageSchema()
	require.Len(t, got.Fields, len(schema.Fields()))
	for i, f := range schema.Fields() {
		assert.Equal(t, f.Name, got.Fields[i].Name)
		assert.False(t, got.Fields[i].Nullable)
	}
	var kiln []map[string]any
	require.NoError(t, records.AdvantagesKind().EachJSON(buf.Bytes(), func(row json.RawMessage) error {
		var m map[string]any
		if err := json.Unmarshal(row, &m); err != nil {
			return err
		}
		kiln = append(kiln, m)
		return nil
	}))
	require.Equal(t, len(rows), got.NumRows)
	assert.Equal(t, kiln, got.Rows)
}
