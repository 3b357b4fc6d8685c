package train

import (
	"context"

	"github.com/kilnrl/kiln/formats/dataset"
	"github.com/kilnrl/kiln/formats/records"
	"github.com/kilnrl/kiln/internal/modeldir"
)

// ReadCheckpointFiles reads a checkpoints version's file rows.
func ReadCheckpointFiles(ctx context.Context, v *dataset.Version) ([]records.CheckpointFile, error) {
	return modeldir.ReadCheckpointFiles(ctx, v)
}
