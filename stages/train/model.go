package train

import (
	"context"

	"github.com/kilnrl/kiln/formats/dataset"
	"github.com/kilnrl/kiln/formats/store"
	"github.com/kilnrl/kiln/internal/modeldir"
)

// Model is a base model (or resume checkpoint) directory on local disk
// (internal/modeldir, shared with kiln-sync).
type Model = modeldir.Model

// ResolveModel turns --model (or --resume-from) into a local checked
// directory (modeldir.Resolve).
func ResolveModel(ctx context.Context, st store.Store, arg, cache, flag string) (*Model, error) {
	return modeldir.Resolve(ctx, st, arg, cache, flag)
}

func dirIdentity(role, dir string) (dataset.External, error) { return modeldir.Identity(role, dir) }

func isDir(s string) bool { return modeldir.IsDir(s) }
