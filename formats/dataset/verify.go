package dataset

import (
	"context"
	"errors"
	"fmt"
)

// ShardCheck is the outcome of verifying one shard: Err is nil when the
// shard is whole (size, sha256), has its kind's schema, decodes, and holds
// the rows its manifest says.
type ShardCheck struct {
	Shard Shard
	Err   error
}

// Verify reads every shard of v whole and checks it against the manifest
// and the record kind (docs/design.md §2): size and sha256, schema, every
// row decodes, row count. fn, if set, is called with each shard's outcome
// in manifest order. A corrupt shard does not stop the check: the error
// returned names every corrupt shard and satisfies ErrCorrupt. Any other
// failure (the store unreachable) stops it and is returned as it is, since
// it says nothing about the data. Attachments have no checksum in the
// manifest and are not checked.
func Verify(ctx context.Context, v *Version, fn func(ShardCheck)) error {
	var corrupt []error
	for i, s := range v.Shards {
		data, err := v.ReadShard(ctx, i)
		if err == nil {
			var rows int64
			rows, err = v.kind.CheckShard(data)
			switch {
			case err != nil:
				err = fmt.Errorf("dataset %s: shard %q: %w: %w", v.Ref(), s.Key, err, ErrCorrupt)
			case rows != s.Rows:
				err = fmt.Errorf("dataset %s: shard %q holds %d rows, the manifest says %d: %w", v.Ref(), s.Key, rows, s.Rows, ErrCorrupt)
			}
		}
		if err != nil && !errors.Is(err, ErrCorrupt) {
			return err
		}
		if fn != nil {
			fn(ShardCheck{Shard: s, Err: err})
		}
		if err != nil {
			corrupt = append(corrupt, err)
		}
	}
	if len(corrupt) > 0 {
		return fmt.Errorf("dataset %s: %d of %d shard(s) corrupt (restore them, or rerun the stage that wrote it into a new version): %w",
			v.Ref(), len(corrupt), len(v.Shards), errors.Join(corrupt...))
	}
	return nil
}
