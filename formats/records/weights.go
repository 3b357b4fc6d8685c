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

// WeightsEntry is one row of the weights kind (Arrow IPC, docs/records.md
// §12, docs/sync.md §1.2): a file of the model directory an engine loads,
// or one tensor inside a safetensors file of it. A version's rows describe
// the whole directory as reconstructed, whether the version is full or a
// delta, so one version's rows verify it.
type WeightsEntry struct {
	// Entry is EntryFile or EntryTensor.
	Entry string
	// Name is the file's path in the directory (relative, slash
	// separated), or the tensor's name.
	Name string
	// File is the file a tensor lives in; for a file, Name again.
	File string
	// DType and Shape are the tensor's safetensors dtype and shape
	// (empty for a file).
	DType string
	Shape []int64
	// Offset is where a tensor's bytes start in File (absolute: past the
	// 8-byte length and the header); 0 for a file.
	Offset int64
	// Size is the tensor's or the file's length in bytes.
	Size int64
	// Checksum is a file's sha256, or a tensor's xxh3-128, in lowercase
	// hex (64 or 32 digits).
	Checksum string
	// Encoding says where this version holds the bytes: EncStored (a
	// file kept whole as an attachment, or a tensor inside such a file),
	// EncUnchanged (the base's), or a delta payload (EncXOR,
	// EncOverwrite, EncReplace) for a tensor.
	Encoding string
	// Payload is the attachment holding the bytes: the file itself for a
	// stored file, the pack for a delta tensor, "" otherwise;
	// PayloadOffset and PayloadSize locate a tensor's zstd frame in it.
	Payload       string
	PayloadOffset int64
	PayloadSize   int64
}

// Weights entry types and encodings (docs/sync.md §1.1).
const (
	EntryFile   = "file"
	EntryTensor = "tensor"

	EncStored    = "stored"
	EncUnchanged = "unchanged"
	EncXOR       = "xor"
	EncOverwrite = "overwrite"
	EncReplace   = "replace"
)

var weightsSchema = arrow.NewSchema([]arrow.Field{
	{Name: "entry", Type: arrow.BinaryTypes.String},
	{Name: "name", Type: arrow.BinaryTypes.String},
	{Name: "file", Type: arrow.BinaryTypes.String},
	{Name: "dtype", Type: arrow.BinaryTypes.String},
	{Name: "shape", Type: arrow.ListOf(arrow.PrimitiveTypes.Int64)},
	{Name: "offset", Type: arrow.PrimitiveTypes.Int64},
	{Name: "size", Type: arrow.PrimitiveTypes.Int64},
	{Name: "checksum", Type: arrow.BinaryTypes.String},
	{Name: "encoding", Type: arrow.BinaryTypes.String},
	{Name: "payload", Type: arrow.BinaryTypes.String},
	{Name: "payload_offset", Type: arrow.PrimitiveTypes.Int64},
	{Name: "payload_size", Type: arrow.PrimitiveTypes.Int64},
}, nil)

// WeightsKind is the weights record kind.
func WeightsKind() Kind { return weightsKind }

var weightsKind = Kind{
	Name:     "weights",
	Encoding: Arrow,
	Ext:      ".arrow",
	Schema:   weightsSchema.String(),
	EachJSON: eachJSONValue(EachWeightsEntry),
}

// checkRelPath accepts a relative, slash-separated path without empty,
// "." or ".." segments.
func checkRelPath(what, p string) error {
	if p == "" || strings.HasPrefix(p, "/") || strings.Contains(p, "\\") {
		return fmt.Errorf("%s %q: want a relative slash-separated path", what, p)
	}
	for _, seg := range strings.Split(p, "/") {
		if seg == "" || seg == "." || seg == ".." {
			return fmt.Errorf("%s %q: empty, \".\" or \"..\" path segment", what, p)
		}
	}
	return nil
}

// Validate checks a row: safe paths, sizes and offsets ≥ 0, a checksum of
// the right form for its entry, an encoding its entry may have, and a
// payload where the encoding needs one.
func (e *WeightsEntry) Validate() error {
	if err := checkRelPath("weights file", e.File); err != nil {
		return err
	}
	if e.Size < 0 || e.Offset < 0 || e.PayloadOffset < 0 || e.PayloadSize < 0 {
		return fmt.Errorf("weights %s %q: negative size or offset", e.Entry, e.Name)
	}
	digits := 0
	switch e.Entry {
	case EntryFile:
		if e.Name != e.File {
			return fmt.Errorf("weights file %q: file column %q differs", e.Name, e.File)
		}
		if e.DType != "" || len(e.Shape) > 0 || e.Offset != 0 {
			return fmt.Errorf("weights file %q: a file has no dtype, shape or offset", e.Name)
		}
		switch e.Encoding {
		case EncStored, EncUnchanged:
		default:
			return fmt.Errorf("weights file %q: encoding %q (want %s or %s)", e.Name, e.Encoding, EncStored, EncUnchanged)
		}
		digits = 64
	case EntryTensor:
		if e.Name == "" || e.DType == "" {
			return fmt.Errorf("weights tensor %q in %q: empty name or dtype", e.Name, e.File)
		}
		for _, d := range e.Shape {
			if d < 0 {
				return fmt.Errorf("weights tensor %q: negative dimension in shape %v", e.Name, e.Shape)
			}
		}
		switch e.Encoding {
		case EncStored, EncUnchanged, EncXOR, EncOverwrite, EncReplace:
		default:
			return fmt.Errorf("weights tensor %q: unknown encoding %q", e.Name, e.Encoding)
		}
		digits = 32
	default:
		return fmt.Errorf("weights entry %q: type %q (want %s or %s)", e.Name, e.Entry, EntryFile, EntryTensor)
	}
	if b, err := hex.DecodeString(e.Checksum); err != nil || len(b)*2 != digits || strings.ToLower(e.Checksum) != e.Checksum {
		return fmt.Errorf("weights %s %q: checksum %q is not %d lowercase hex digits", e.Entry, e.Name, e.Checksum, digits)
	}
	needsPayload := e.Encoding == EncXOR || e.Encoding == EncOverwrite || e.Encoding == EncReplace ||
		(e.Entry == EntryFile && e.Encoding == EncStored)
	switch {
	case needsPayload:
		if err := checkRelPath("weights payload", e.Payload); err != nil {
			return fmt.Errorf("weights %s %q (%s): %w", e.Entry, e.Name, e.Encoding, err)
		}
	case e.Payload != "" || e.PayloadOffset != 0 || e.PayloadSize != 0:
		return fmt.Errorf("weights %s %q (%s): has a payload it does not use", e.Entry, e.Name, e.Encoding)
	}
	return nil
}

// WeightsEncoder streams weights rows into one Arrow IPC file.
type WeightsEncoder struct{ *arrowWriter }

// NewWeightsEncoder writes an Arrow IPC file to w; Close finishes it.
func NewWeightsEncoder(w io.Writer, opts ArrowOptions) (*WeightsEncoder, error) {
	if opts.BatchTokens <= 0 {
		opts.BatchTokens = 1 << 16 // rows
	}
	aw, err := newArrowWriter(w, weightsSchema, opts)
	if err != nil {
		return nil, err
	}
	return &WeightsEncoder{aw}, nil
}

// Write validates and appends rows.
func (e *WeightsEncoder) Write(rows ...WeightsEntry) error {
	str := func(name string) *array.StringBuilder { return e.col(name).(*array.StringBuilder) }
	i64 := func(name string) *array.Int64Builder { return e.col(name).(*array.Int64Builder) }
	entry, name, file, dtype := str("entry"), str("name"), str("file"), str("dtype")
	shape := e.col("shape").(*array.ListBuilder)
	dims := shape.ValueBuilder().(*array.Int64Builder)
	offset, size := i64("offset"), i64("size")
	sum, enc, payload := str("checksum"), str("encoding"), str("payload")
	poff, psize := i64("payload_offset"), i64("payload_size")
	for i := range rows {
		r := &rows[i]
		if err := r.Validate(); err != nil {
			return err
		}
		entry.Append(r.Entry)
		name.Append(r.Name)
		file.Append(r.File)
		dtype.Append(r.DType)
		shape.Append(true)
		dims.AppendValues(r.Shape, nil)
		offset.Append(r.Offset)
		size.Append(r.Size)
		sum.Append(r.Checksum)
		enc.Append(r.Encoding)
		payload.Append(r.Payload)
		poff.Append(r.PayloadOffset)
		psize.Append(r.PayloadSize)
		if err := e.rowDone(1); err != nil {
			return err
		}
	}
	return nil
}

// EachWeightsEntry decodes a weights shard held in memory, in row order,
// checking every row.
func EachWeightsEntry(shard []byte, fn func(WeightsEntry) error) error {
	return eachBatch("weights", shard, weightsSchema, func(rec arrow.RecordBatch) error {
		col := func(name string) arrow.Array { return rec.Column(rec.Schema().FieldIndices(name)[0]) }
		str := func(name string) *array.String { return col(name).(*array.String) }
		i64 := func(name string) *array.Int64 { return col(name).(*array.Int64) }
		entry, name, file, dtype := str("entry"), str("name"), str("file"), str("dtype")
		shape := col("shape").(*array.List)
		dims := shape.ListValues().(*array.Int64)
		offset, size, poff, psize := i64("offset"), i64("size"), i64("payload_offset"), i64("payload_size")
		sum, enc, payload := str("checksum"), str("encoding"), str("payload")
		for r := 0; r < int(rec.NumRows()); r++ {
			lo, hi := shape.ValueOffsets(r)
			e := WeightsEntry{
				Entry: entry.Value(r), Name: name.Value(r), File: file.Value(r), DType: dtype.Value(r),
				Offset: offset.Value(r), Size: size.Value(r), Checksum: sum.Value(r), Encoding: enc.Value(r),
				Payload: payload.Value(r), PayloadOffset: poff.Value(r), PayloadSize: psize.Value(r),
			}
			if hi > lo {
				e.Shape = append([]int64(nil), dims.Int64Values()[lo:hi]...)
			}
			if err := e.Validate(); err != nil {
				return fmt.Errorf("weights shard: %w", err)
			}
			if err := fn(e); err != nil {
				return err
			}
		}
		return nil
	})
}

type weightsRow struct {
	Entry         string  `json:"entry"`
	Name          string  `json:"name"`
	File          string  `json:"file"`
	DType         string  `json:"dtype"`
	Shape         []int64 `json:"shape"`
	Offset        int64   `json:"offset"`
	Size          int64   `json:"size"`
	Checksum      string  `json:"checksum"`
	Encoding      string  `json:"encoding"`
	Payload       string  `json:"payload"`
	PayloadOffset int64   `json:"payload_offset"`
	PayloadSize   int64   `json:"payload_size"`
}

// MarshalRow is the row's JSON view (field names as the Arrow columns).
func (e *WeightsEntry) MarshalRow() (json.RawMessage, error) {
	r := weightsRow(*e)
	if r.Shape == nil {
		r.Shape = []int64{}
	}
	return marshalNoEscape(r)
}
