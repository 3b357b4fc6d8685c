package dataset

import (
	"context"
	"errors"
	"fmt"
	"io"
	"sort"
	"strings"

	"github.com/kilnrl/kiln/formats/store"
)

// AttachmentPath turns what a row names as an attachment of v — its full
// store key (as AttachmentKey returns it, and grade rows' log holds), or
// its path relative to the version's attachments — into that relative
// path. A key inside another version's directory is refused, naming that
// version, so a reader never takes one version's file for another's.
func (v *Version) AttachmentPath(keyOrRel string) (string, error) {
	dir := versionDir(v.Dataset, v.Version) + attachmentsDir
	rel := strings.TrimPrefix(keyOrRel, "/")
	switch {
	case strings.HasPrefix(rel, dir):
		rel = strings.TrimPrefix(rel, dir)
	case strings.HasPrefix(rel, attachmentsDir):
		rel = strings.TrimPrefix(rel, attachmentsDir)
	default:
		if name, version, _, ok := splitVersionKey(rel); ok {
			return "", fmt.Errorf("attachment %q belongs to %s@%s, not %s: name that version", keyOrRel, name, version, v.Ref())
		}
	}
	if err := store.CheckKey(dir + rel); err != nil || rel == "" {
		return "", fmt.Errorf("attachment %q: want a path inside the version's attachments (no empty, \".\" or \"..\" segments)", keyOrRel)
	}
	return rel, nil
}

// OpenAttachment opens the attachment rel (see AttachmentPath) of v. A
// missing one is an error satisfying ErrNotFound.
func (v *Version) OpenAttachment(ctx context.Context, rel string) (io.ReadCloser, store.Info, error) {
	key := AttachmentKey(v.Ref(), rel)
	rc, info, err := v.st.Get(ctx, key)
	if errors.Is(err, store.ErrNotExist) {
		return nil, store.Info{}, fmt.Errorf("dataset %s: attachment %q: %w in %s", v.Ref(), rel, ErrNotFound, v.st.URI())
	}
	if err != nil {
		return nil, store.Info{}, fmt.Errorf("dataset %s: attachment %q: %w", v.Ref(), rel, err)
	}
	return rc, info, nil
}

// Attachments calls fn with every attachment of v, in key order: its path
// relative to the attachments directory, and its Info.
func (v *Version) Attachments(ctx context.Context, fn func(rel string, info store.Info) error) error {
	dir := versionDir(v.Dataset, v.Version) + attachmentsDir
	var all []store.Info
	err := v.st.List(ctx, dir, func(info store.Info) error {
		all = append(all, info)
		return nil
	})
	if err != nil {
		return fmt.Errorf("dataset %s: listing attachments: %w", v.Ref(), err)
	}
	sort.Slice(all, func(i, j int) bool { return all[i].Key < all[j].Key })
	for _, info := range all {
		if err := fn(strings.TrimPrefix(info.Key, dir), info); err != nil {
			return err
		}
	}
	return nil
}

// ShardURI is where shard i of v lives, as a URI other tools read
// (DuckDB, polars, pyarrow): s3://bucket/prefix/... on S3, an absolute
// path on a local store.
func (v *Version) ShardURI(i int) string {
	key := versionDir(v.Dataset, v.Version) + v.Shards[i].Key
	uri := v.st.URI()
	if p, ok := strings.CutPrefix(uri, "file://"); ok {
		return strings.TrimSuffix(p, "/") + "/" + key
	}
	return strings.TrimSuffix(uri, "/") + "/" + key
}
