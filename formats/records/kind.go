// Package records defines kiln's record kinds (docs/records.md §1): their schemas,
// their encodings at rest (Parquet for tables of records, Arrow IPC for token
// data), validation on write, and a JSON view of every row for show/export.
// Each kind lives in its own file; adding a kind means adding a file and a
// line to the kinds table below.
package records

import (
	"crypto/sha256"
	"encoding/hex"
	"encoding/json"
	"fmt"
	"sort"
)

// Encoding of a kind's shards.
const (
	Parquet = "parquet"
	Arrow   = "arrow"
)

// Kind describes one record kind.
type Kind struct {
	Name     string // "tasks", "trajectories", ...
	Encoding string // Parquet or Arrow
	Ext      string // shard file extension, with the dot
	// Schema is the canonical text of the schema; Fingerprint hashes it, so
	// a reader can refuse data written under another schema before decoding.
	Schema string
	// Older are the schema texts of earlier versions of the kind that this
	// kiln still reads: each lacks only optional columns added since, which
	// decode as null (docs/records.md: extend a kind, never rename).
	Older []string
	// EachJSON decodes one shard and calls fn with each row as a JSON object,
	// fields in schema order; JSON-valued columns are embedded, not quoted.
	EachJSON func(shard []byte, fn func(row json.RawMessage) error) error
}

// Fingerprint is "sha256:" and the hex digest of the kind's schema text.
func (k Kind) Fingerprint() string { return fingerprint(k.Schema) }

// Reads reports whether versions whose manifest names the schema
// fingerprint fp hold shards this kind decodes: the kind's own schema or
// one of its Older ones.
func (k Kind) Reads(fp string) bool {
	if fp == k.Fingerprint() {
		return true
	}
	for _, s := range k.Older {
		if fp == fingerprint(s) {
			return true
		}
	}
	return false
}

func fingerprint(schema string) string {
	sum := sha256.Sum256([]byte(schema))
	return "sha256:" + hex.EncodeToString(sum[:])
}

func kinds() map[string]Kind {
	return map[string]Kind{
		TasksKind().Name:        TasksKind(),
		TrajectoriesKind().Name: TrajectoriesKind(),
		TurnsKind().Name:        TurnsKind(),
		ImagesKind().Name:       ImagesKind(),
		GradesKind().Name:       GradesKind(),
		RolloutsKind().Name:     RolloutsKind(),
		AdvantagesKind().Name:   AdvantagesKind(),
		CheckpointsKind().Name:  CheckpointsKind(),
		WeightsKind().Name:      WeightsKind(),
	}
}

// Lookup returns the kind with the given name.
func Lookup(name string) (Kind, error) {
	if k, ok := kinds()[name]; ok {
		return k, nil
	}
	return Kind{}, fmt.Errorf("unknown record kind %q (known: %v)", name, Names())
}

// Names lists the known kinds, sorted.
func Names() []string {
	var names []string
	for n := range kinds() {
		names = append(names, n)
	}
	sort.Strings(names)
	return names
}

// rowMarshaler is a record that writes itself as its JSON row (records.md §9).
type rowMarshaler interface {
	MarshalRow() (json.RawMessage, error)
}

// eachJSON is the EachJSON of a kind whose reader hands each record over
// by pointer: every row as its MarshalRow.
func eachJSON[R rowMarshaler](each func([]byte, func(R) error) error) func([]byte, func(json.RawMessage) error) error {
	return func(shard []byte, fn func(json.RawMessage) error) error {
		return each(shard, func(r R) error {
			row, err := r.MarshalRow()
			if err != nil {
				return err
			}
			return fn(row)
		})
	}
}

// eachJSONValue is eachJSON for a reader that hands records over by value.
func eachJSONValue[T any, P interface {
	*T
	rowMarshaler
}](each func([]byte, func(T) error) error) func([]byte, func(json.RawMessage) error) error {
	return eachJSON(func(shard []byte, fn func(P) error) error {
		return each(shard, func(v T) error { return fn(P(&v)) })
	})
}
