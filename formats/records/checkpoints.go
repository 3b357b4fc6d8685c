package records

import (
	"encoding/hex"
	"encoding/json"
	"fmt"
	"io"
	"strings"

	"github.com/apache/arrow-go/v18/arrow"
	"github.com/apache/arrow-go/v18/arrow/array"
)

// CheckpointFile is one row of the checkpoints kind (Arrow IPC): one file
// of a trained checkpoint (docs/train-stage.md §6). The file itself is an
// attachment of the version at the path Name; the row says what it must
// hold, so a reader that materializes the checkpoint checks every byte.
type CheckpointFile struct {
	// Name is the file's path in the checkpoint directory, slash
	// separated, relative, without "." or ".." segments (config.json,
	// model-00001-of-00002.safetensors, optimizer.pt, ...).
	Name   string
	Size   int64
	SHA256 string // lowercase hex of the file's sha256
}

var checkpointSchema = arrow.NewSchema([]arrow.Field{
	{Name: "name", Type: arrow.BinaryTypes.String},
	{Name: "size", Type: arrow.PrimitiveTypes.Int64},
	{Name: "sha256", Type: arrow.BinaryTypes.String},
}, nil)

// CheckpointsKind is the checkpoints record kind.
func CheckpointsKind() Kind { return checkpointsKind }

var checkpointsKind = Kind{
	Name:     "checkpoints",
	Encoding: Arrow,
	Ext:      ".arrow",
	Schema:   checkpointSchema.String(),
	EachJSON: eachJSONValue(EachCheckpointFile),
}

// Validate checks a checkpoint file row: a safe relative name, a size of
// at least 0 and a 64-digit lowercase hex digest.
func (f *CheckpointFile) Validate() error {
	if f.Name == "" || strings.HasPrefix(f.Name, "/") || strings.Contains(f.Name, "\\") {
		return fmt.Errorf("checkpoint file %q: want a relative slash-separated path", f.Name)
	}
	for _, seg := range strings.Split(f.Name, "/") {
		if seg == "" || seg == "." || seg == ".." {
			return fmt.Errorf("checkpoint file %q: empty, \".\" or \"..\" path segment", f.Name)
		}
	}
	if f.Size < 0 {
		return fmt.Errorf("checkpoint file %q: size %d is negative", f.Name, f.Size)
	}
	if b, err := hex.DecodeString(f.SHA256); err != nil || len(b) != 32 || strings.ToLower(f.SHA256) != f.SHA256 {
		return fmt.Errorf("checkpoint file %q: sha256 %q is not 64 lowercase hex digits", f.Name, f.SHA256)
	}
	return nil
}

// CheckpointEncoder streams checkpoint file rows into one Arrow IPC file.
type CheckpointEncoder struct{ *arrowWriter }

// NewCheckpointEncoder writes an Arrow IPC file to w; Close finishes it.
func NewCheckpointEncoder(w io.Writer, opts ArrowOptions) (*CheckpointEncoder, error) {
	if opts.BatchTokens <= 0 {
		opts.BatchTokens = 1 << 16 // rows
	}
	aw, err := newArrowWriter(w, checkpointSchema, opts)
	if err != nil {
		return nil, err
	}
	return &CheckpointEncoder{aw}, nil
}

// Write validates and appends rows.
func (e *CheckpointEncoder) Write(rows ...CheckpointFile) error {
	name, size, sum := e.col("name").(*array.StringBuilder), e.col("size").(*array.Int64Builder), e.col("sha256").(*array.StringBuilder)
	for i := range rows {
		if err := rows[i].Validate(); err != nil {
			return err
		}
		name.Append(rows[i].Name)
		size.Append(rows[i].Size)
		sum.Append(rows[i].SHA256)
		if err := e.rowDone(1); err != nil {
			return err
		}
	}
	return nil
}

// EachCheckpointFile decodes a checkpoints shard held in memory, in row
// order, checking every row.
func EachCheckpointFile(shard []byte, fn func(CheckpointFile) error) error {
	return eachBatch("checkpoints", shard, checkpointSchema, func(rec arrow.RecordBatch) error {
		c := rec.Columns()
		name, size, sum := c[0].(*array.String), c[1].(*array.Int64), c[2].(*array.String)
		for r := 0; r < int(rec.NumRows()); r++ {
			f := CheckpointFile{Name: name.Value(r), Size: size.Value(r), SHA256: sum.Value(r)}
			if err := f.Validate(); err != nil {
				return fmt.Errorf("checkpoints shard: %w", err)
			}
			if err := fn(f); err != nil {
				return err
			}
		}
		return nil
	})
}

type checkpointRow struct {
	Name   string `json:"name"`
	Size   int64  `json:"size"`
	SHA256 string `json:"sha256"`
}

// MarshalRow is the row's JSON view (field names as the Arrow columns).
func (f *CheckpointFile) MarshalRow() (json.RawMessage, error) {
	return marshalNoEscape(checkpointRow(*f))
}
