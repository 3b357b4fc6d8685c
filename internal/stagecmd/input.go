package stagecmd

import (
	"context"
	"fmt"
	"io"
	"net/url"
	"os"
	"strings"

	"github.com/klauspost/compress/zstd"

	"github.com/kilnrl/kiln/formats/dataset"
	"github.com/kilnrl/kiln/formats/store"
)

// Input is an external input file: a local path, or an s3://bucket/key
// object (endpoint and credentials as for S3 stores).
type Input struct {
	Name string
	st   store.Store // nil for a local file
	key  string
}

// ParseInput parses a local path or an s3:// object URI.
func ParseInput(name string) (Input, error) {
	if !strings.HasPrefix(name, "s3://") {
		return Input{Name: name}, nil
	}
	u, err := url.Parse(name)
	if err != nil || u.Host == "" || strings.Trim(u.Path, "/") == "" {
		return Input{}, fmt.Errorf("input %q: want s3://bucket/key", name)
	}
	st, err := store.Open("s3://" + u.Host)
	if err != nil {
		return Input{}, fmt.Errorf("input %q: %w", name, err)
	}
	return Input{Name: name, st: st, key: strings.TrimPrefix(u.Path, "/")}, nil
}

// Identify names the input by content for version ids: a file's sha256,
// an object's ETag and size.
func (in Input) Identify(ctx context.Context, role string) (dataset.External, error) {
	if in.st == nil {
		return dataset.FileInput(role, in.Name)
	}
	return dataset.ObjectInput(ctx, role, in.st, in.key)
}

// Open reads the input, decompressing a .zst suffix.
func (in Input) Open(ctx context.Context) (io.ReadCloser, error) {
	var rc io.ReadCloser
	if in.st == nil {
		f, err := os.Open(in.Name)
		if err != nil {
			return nil, err
		}
		rc = f
	} else {
		r, _, err := in.st.Get(ctx, in.key)
		if err != nil {
			return nil, fmt.Errorf("input %q: %w", in.Name, err)
		}
		rc = r
	}
	if !strings.HasSuffix(in.Name, ".zst") {
		return rc, nil
	}
	zr, err := zstd.NewReader(rc)
	if err != nil {
		rc.Close()
		return nil, fmt.Errorf("input %q: %w", in.Name, err)
	}
	return struct {
		io.Reader
		io.Closer
	}{zr.IOReadCloser(), rc}, nil
}
