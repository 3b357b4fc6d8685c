package dataset

import (
	"context"
	"crypto/sha256"
	"encoding/hex"
	"encoding/json"
	"fmt"
	"io"
	"os"
	"path/filepath"
	"sort"
	"strings"

	"github.com/kilnrl/kiln/formats/store"
)

// Identity is the complete description of a computation whose output is a
// version: the version id is a hash of it. It deliberately excludes where
// and how the work is split (--shard), who ran it and when, and the names of
// external files (only their content counts), so equal work always lands in
// the same version and different work never does.
type Identity struct {
	Stage string
	// CodeVersion is the stage's semantic version: bump it whenever the
	// stage's output for the same inputs changes. It is not the binary's
	// build id, so rebuilding kiln does not invalidate expensive outputs
	// such as rollouts; the build id is recorded in the manifest instead.
	CodeVersion string
	// Args are the arguments that affect the output, JSON-encodable.
	Args map[string]any
	// Inputs are the dataset versions read; each must be pinned.
	Inputs []Ref
	// External are the non-dataset inputs, by content.
	External []External
}

// VersionLen is the length of generated version ids (hex digits).
const VersionLen = 20

// Version is the id Identity yields.
func (id Identity) Version() (string, error) {
	for _, in := range id.Inputs {
		if !in.Pinned() {
			return "", fmt.Errorf("input %q is not pinned to a version", in.Name)
		}
	}
	ext := make([]map[string]any, len(id.External))
	for i, e := range id.External {
		ext[i] = map[string]any{"role": e.Role, "sha256": e.SHA256, "etag": e.ETag, "size": e.Size}
	}
	inputs := make([]string, len(id.Inputs))
	for i, in := range id.Inputs {
		inputs[i] = in.String()
	}
	sort.Strings(inputs)
	// encoding/json sorts map keys, so this is canonical.
	b, err := json.Marshal(map[string]any{
		"stage": id.Stage, "code_version": id.CodeVersion, "args": id.Args,
		"inputs": inputs, "external": ext,
	})
	if err != nil {
		return "", fmt.Errorf("arguments of stage %q are not JSON-encodable: %w", id.Stage, err)
	}
	sum := sha256.Sum256(b)
	return hex.EncodeToString(sum[:])[:VersionLen], nil
}

// FileInput identifies a local file by its sha256.
func FileInput(role, path string) (External, error) {
	if abs, err := filepath.Abs(path); err == nil {
		path = abs
	}
	f, err := os.Open(path)
	if err != nil {
		return External{}, fmt.Errorf("%s input: %w", role, err)
	}
	defer f.Close()
	h := sha256.New()
	n, err := io.Copy(h, f)
	if err != nil {
		return External{}, fmt.Errorf("%s input %q: %w", role, path, err)
	}
	return External{Role: role, URI: path, SHA256: hex.EncodeToString(h.Sum(nil)), Size: n}, nil
}

// ObjectInput identifies an object in a store by its ETag and size, without
// reading it (S3 ETags change whenever the content does).
func ObjectInput(ctx context.Context, role string, st store.Store, key string) (External, error) {
	info, err := st.Stat(ctx, key)
	if err != nil {
		return External{}, fmt.Errorf("%s input %q in %s: %w", role, key, st.URI(), err)
	}
	return External{Role: role, URI: strings.TrimSuffix(st.URI(), "/") + "/" + key, ETag: info.ETag, Size: info.Size}, nil
}
