package dataset

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"

	"github.com/kilnrl/kiln/formats/store"
)

// ReceiptedRows returns the row keys that part's row receipts in version
// ref name for the shards the version keeps: for a committed version the
// shards its manifest lists, for a finished part those of its part
// receipt, otherwise those still in the store. A stage writing several
// versions in lockstep (Spec.Adopt) uses it to learn what a version that
// finished before the others holds. Receipts of committed versions may
// have been collected (kiln gc): the result is then empty.
func ReceiptedRows(ctx context.Context, st store.Store, ref Ref, part Part) (map[string]bool, error) {
	dir := versionDir(ref.Name, ref.Version)
	var kept map[string]bool // shard keys the version keeps; nil: any present
	if v, err := openVersion(ctx, st, ref.Name, ref.Version); err == nil {
		kept = map[string]bool{}
		for _, s := range v.Shards {
			kept[s.Key] = true
		}
	} else if !errors.Is(err, ErrNotFound) {
		return nil, err
	} else {
		key := dir + fmt.Sprintf("parts/%05d-of-%05d.json", part.Index, part.count())
		data, _, err := store.ReadAll(ctx, st, key)
		switch {
		case err == nil:
			var pr partReceipt
			if err := json.Unmarshal(data, &pr); err != nil {
				return nil, fmt.Errorf("dataset %s: part receipt %q: %w", ref, key, err)
			}
			kept = map[string]bool{}
			for _, s := range pr.Shards {
				kept[s.Key] = true
			}
		case !errors.Is(err, store.ErrNotExist):
			return nil, err
		}
	}
	rows := map[string]bool{}
	prefix := dir + fmt.Sprintf("rows/p%05d/", part.Index)
	var keys []string
	if err := st.List(ctx, prefix, func(info store.Info) error {
		keys = append(keys, info.Key)
		return nil
	}); err != nil {
		return nil, err
	}
	for _, key := range keys {
		data, _, err := store.ReadAll(ctx, st, key)
		if err != nil {
			continue
		}
		var rr rowReceipt
		if json.Unmarshal(data, &rr) != nil {
			continue
		}
		if kept != nil && !kept[rr.Shard.Key] {
			continue
		}
		if kept == nil {
			if info, err := st.Stat(ctx, dir+rr.Shard.Key); err != nil || info.Size != rr.Shard.Bytes {
				continue
			}
		}
		for _, k := range rr.RowKeys {
			rows[k] = true
		}
	}
	return rows, nil
}
