package records

import (
	"bytes"
	"encoding/json"
	"fmt"
	"io"

	"github.com/parquet-go/parquet-go"
	"github.com/parquet-go/parquet-go/compress/zstd"
)

// row is what every Parquet record kind's row type provides: the checks it
// must pass before it is written.
type row[T any] interface {
	*T
	Validate() error
}

// ParquetEncoder streams validated rows of one kind into one Parquet shard
// (zstd). Write checks every row before any is appended; Close writes the
// footer, and the shard is not readable before it.
type ParquetEncoder[T any, P row[T]] struct {
	w *parquet.GenericWriter[T]
}

func newParquetEncoder[T any, P row[T]](w io.Writer, opts ...parquet.WriterOption) *ParquetEncoder[T, P] {
	opts = append([]parquet.WriterOption{parquet.Compression(&zstd.Codec{Level: zstd.SpeedDefault})}, opts...)
	return &ParquetEncoder[T, P]{w: parquet.NewGenericWriter[T](w, opts...)}
}

// Write validates and appends rows.
func (e *ParquetEncoder[T, P]) Write(rows ...T) error {
	for i := range rows {
		if err := P(&rows[i]).Validate(); err != nil {
			return err
		}
	}
	_, err := e.w.Write(rows)
	return err
}

// Close writes the footer.
func (e *ParquetEncoder[T, P]) Close() error { return e.w.Close() }

// eachParquetRow decodes a Parquet shard of rows of type T in row order.
func eachParquetRow[T any](shard []byte, kind string, fn func(T) error) error {
	f, err := parquet.OpenFile(bytes.NewReader(shard), int64(len(shard)))
	if err != nil {
		return fmt.Errorf("%s shard: %w", kind, err)
	}
	r := parquet.NewGenericReader[T](f)
	defer r.Close()
	buf := make([]T, 256)
	for {
		n, err := r.Read(buf)
		for i := 0; i < n; i++ {
			if ferr := fn(buf[i]); ferr != nil {
				return ferr
			}
		}
		if err == io.EOF {
			return nil
		}
		if err != nil {
			return fmt.Errorf("%s shard: %w", kind, err)
		}
	}
}

// marshalRow is a row's JSON view: its fields in schema order, without HTML
// escaping, the string columns named in jsonCols embedded as JSON.
func marshalRow(v any, jsonCols map[string]bool) (json.RawMessage, error) {
	var b bytes.Buffer
	enc := json.NewEncoder(&b)
	enc.SetEscapeHTML(false)
	if err := enc.Encode(v); err != nil {
		return nil, err
	}
	raw := bytes.TrimSpace(b.Bytes())
	if len(jsonCols) == 0 {
		return raw, nil
	}
	return embedJSONColumns(raw, jsonCols)
}
