package records

import (
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"path"
	"strings"

	"github.com/parquet-go/parquet-go"
)

// Image is one row of the images kind (Parquet): one task image imported
// into a bundle (kiln-images). Bundles live on each sandbox node's disk
// under a bundle root chosen at use time; Bundle is relative to that root.
type Image struct {
	// Image is the reference exactly as the tasks name it.
	Image string `parquet:"image" json:"image"`
	// Digest is the image manifest's digest, "sha256:<hex>".
	Digest string `parquet:"digest" json:"digest"`
	// Bundle is the bundle directory relative to the bundle root
	// ("sha256/<hex>"); the root filesystem is Bundle + "/rootfs".
	Bundle string `parquet:"bundle" json:"bundle"`
	// Env is a JSON object: the image config's Env split at the first "=",
	// in image order, after the per-image overrides (EnvPathPrepend).
	Env string `parquet:"env" json:"env"`
	// Workdir is the tasks' working directory for this image (they must
	// agree). It always wins over ConfigWorkdir for running tasks.
	Workdir *string `parquet:"workdir,optional" json:"workdir"`
	// ConfigWorkdir is the image config's WorkingDir ("/" when unset), kept
	// for information only.
	ConfigWorkdir string `parquet:"config_workdir" json:"config_workdir"`
	// Command is a JSON array: the config's Entrypoint followed by its Cmd.
	Command string `parquet:"command" json:"command"`
	// Source says where the image came from: "registry", "oci:PATH",
	// "docker-archive:PATH" or "oci-archive:PATH".
	Source string `parquet:"source" json:"source"`
	// SizeBytes is the total uncompressed size of the image's layers.
	SizeBytes int64 `parquet:"size_bytes" json:"size_bytes"`
	// Files is the number of layer entries applied (all layers).
	Files int64 `parquet:"files" json:"files"`
	// EnvPathPrepend is the directory put in front of PATH (nil: none).
	EnvPathPrepend *string `parquet:"env_path_prepend,optional" json:"env_path_prepend"`
}

var imageJSONColumns = map[string]bool{"env": true, "command": true}

// ImagesKind is the images record kind.
func ImagesKind() Kind { return imagesKind }

var imagesKind = Kind{
	Name:     "images",
	Encoding: Parquet,
	Ext:      ".parquet",
	Schema:   parquet.SchemaOf(Image{}).String(),
	EachJSON: eachJSONValue(EachImage),
}

// Validate checks the invariants an images row must hold on write.
func (im *Image) Validate() error {
	if im.Image == "" {
		return fmt.Errorf("images row: empty image")
	}
	if !strings.HasPrefix(im.Digest, "sha256:") || len(im.Digest) != len("sha256:")+64 {
		return fmt.Errorf("image %q: digest %q is not sha256:<64 hex>", im.Image, im.Digest)
	}
	if im.Bundle == "" || path.IsAbs(im.Bundle) || path.Clean(im.Bundle) != im.Bundle || strings.HasPrefix(im.Bundle, "..") {
		return fmt.Errorf("image %q: bundle %q must be a clean path relative to the bundle root", im.Image, im.Bundle)
	}
	if v := strings.TrimSpace(im.Env); !json.Valid([]byte(v)) || !strings.HasPrefix(v, "{") {
		return fmt.Errorf("image %q: env is not a JSON object", im.Image)
	}
	if v := strings.TrimSpace(im.Command); !json.Valid([]byte(v)) || !strings.HasPrefix(v, "[") {
		return fmt.Errorf("image %q: command is not a JSON array", im.Image)
	}
	return nil
}

// MarshalRow is the row's JSON view: columns in schema order, env and
// command embedded as JSON.
func (im *Image) MarshalRow() (json.RawMessage, error) {
	return marshalRow(im, imageJSONColumns)
}

// ImageEncoder streams images rows into one Parquet shard (zstd).
type ImageEncoder = ParquetEncoder[Image, *Image]

// NewImageEncoder writes a Parquet file to w; Close finishes it.
func NewImageEncoder(w io.Writer) *ImageEncoder { return newParquetEncoder[Image](w) }

// EachImage decodes an images shard in row order.
func EachImage(shard []byte, fn func(Image) error) error {
	return eachParquetRow(shard, "images", fn)
}

// EnvList is the image's Env as KEY=VALUE entries in the image config's
// order, as a sandbox's environment takes them.
func (im Image) EnvList() ([]string, error) {
	dec := json.NewDecoder(strings.NewReader(im.Env))
	if tok, err := dec.Token(); err != nil || tok != json.Delim('{') {
		return nil, errors.New("env is not a JSON object")
	}
	var out []string
	for dec.More() {
		k, err := dec.Token()
		if err != nil {
			return nil, fmt.Errorf("env: %w", err)
		}
		var v string
		if err := dec.Decode(&v); err != nil {
			return nil, fmt.Errorf("env: value of %v is not a string", k)
		}
		out = append(out, fmt.Sprint(k)+"="+v)
	}
	if _, err := dec.Token(); err != nil {
		return nil, fmt.Errorf("env: %w", err)
	}
	return out, nil
}
