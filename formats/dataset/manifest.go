package dataset

import (
	"encoding/json"
	"fmt"
	"time"
)

// ManifestFormat tags manifests written by this package.
const ManifestFormat = "kiln.dataset/v1"

// Manifest is the commit record of one version. It is written once and never
// changed.
type Manifest struct {
	Format   string `json:"format"`
	Dataset  string `json:"dataset"`
	Version  string `json:"version"`
	Kind     string `json:"kind"`
	Encoding string `json:"encoding"`
	// Schema is the record kind's schema fingerprint.
	Schema string  `json:"schema"`
	Shards []Shard `json:"shards"`
	Rows   int64   `json:"rows"`
	Bytes  int64   `json:"bytes"`
	// Parts is the number of parts (Slurm array tasks) that wrote the version.
	Parts    int            `json:"parts"`
	Producer Producer       `json:"producer"`
	Inputs   []Ref          `json:"inputs"`
	External []External     `json:"external"`
	Created  time.Time      `json:"created"` // writer's clock; ordering uses the store's
	Metrics  map[string]any `json:"metrics,omitempty"`
}

// Shard is one file of a version.
type Shard struct {
	Key    string `json:"key"` // relative to the version directory
	Part   int    `json:"part"`
	Rows   int64  `json:"rows"`
	Bytes  int64  `json:"bytes"`
	SHA256 string `json:"sha256"`
}

// Producer says what wrote a version.
type Producer struct {
	Stage       string         `json:"stage"`
	CodeVersion string         `json:"code_version"`
	Build       string         `json:"build,omitempty"`
	Args        map[string]any `json:"args"`
	Host        string         `json:"host,omitempty"`
}

// External is an input that is not a dataset, identified by content: a local
// file by its sha256, an S3 object by its ETag and size.
type External struct {
	Role   string `json:"role"`
	URI    string `json:"uri"`
	SHA256 string `json:"sha256,omitempty"`
	ETag   string `json:"etag,omitempty"`
	Size   int64  `json:"size"`
}

func (r Ref) MarshalJSON() ([]byte, error) { return json.Marshal(r.String()) }

func (r *Ref) UnmarshalJSON(b []byte) error {
	var s string
	if err := json.Unmarshal(b, &s); err != nil {
		return err
	}
	p, err := ParseRef(s)
	if err != nil {
		return err
	}
	*r = p
	return nil
}

// validate checks a decoded manifest against the version it was read as.
func (m *Manifest) validate(name, version string) error {
	switch {
	case m.Format != ManifestFormat:
		return fmt.Errorf("format %q, want %q", m.Format, ManifestFormat)
	case m.Dataset != name || m.Version != version:
		return fmt.Errorf("names %s@%s, but is stored as %s@%s", m.Dataset, m.Version, name, version)
	case m.Kind == "":
		return fmt.Errorf("no record kind")
	}
	var rows, bytes int64
	for _, s := range m.Shards {
		if s.Key == "" || len(s.SHA256) != 64 || s.Bytes < 0 || s.Rows < 0 {
			return fmt.Errorf("malformed shard entry %+v", s)
		}
		rows += s.Rows
		bytes += s.Bytes
	}
	if rows != m.Rows || bytes != m.Bytes {
		return fmt.Errorf("totals (%d rows, %d bytes) disagree with its shards (%d rows, %d bytes)", m.Rows, m.Bytes, rows, bytes)
	}
	return nil
}
