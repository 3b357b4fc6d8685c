package records

import (
	"fmt"
	"io"

	"github.com/apache/arrow-go/v18/arrow"
	"github.com/apache/arrow-go/v18/arrow/array"
	"github.com/apache/arrow-go/v18/arrow/ipc"
	"github.com/apache/arrow-go/v18/arrow/memory"
)

// ArrowOptions select how token data is written.
type ArrowOptions struct {
	// Uncompressed writes plain buffers, which readers can mmap without
	// copying; the default compresses every buffer with zstd.
	Uncompressed bool
	// BatchTokens bounds a record batch (default 4M tokens).
	BatchTokens int
}

// arrowWriter is the Arrow IPC file plumbing of the token-data kinds: one
// record builder, flushed as a batch every BatchTokens tokens.
type arrowWriter struct {
	w           *ipc.FileWriter
	b           *array.RecordBuilder
	rows, toks  int
	batchTokens int
}

func newArrowWriter(w io.Writer, schema *arrow.Schema, opts ArrowOptions) (*arrowWriter, error) {
	ipcOpts := []ipc.Option{ipc.WithSchema(schema)}
	if !opts.Uncompressed {
		ipcOpts = append(ipcOpts, ipc.WithZstd())
	}
	fw, err := ipc.NewFileWriter(w, ipcOpts...)
	if err != nil {
		return nil, err
	}
	if opts.BatchTokens <= 0 {
		opts.BatchTokens = 4 << 20
	}
	return &arrowWriter{w: fw, b: array.NewRecordBuilder(memory.DefaultAllocator, schema), batchTokens: opts.BatchTokens}, nil
}

// col is the builder of the schema's column name: encoders set fields by
// name, so a reordered schema cannot fill a column with another's values.
// A name the schema lacks is a bug in this package: it panics, and every
// encoder's tests write rows.
func (a *arrowWriter) col(name string) array.Builder {
	idx := a.b.Schema().FieldIndices(name)
	if len(idx) != 1 {
		panic("records: the schema has no column " + name)
	}
	return a.b.Field(idx[0])
}

// rowDone counts a row appended to the builder and flushes a full batch.
func (a *arrowWriter) rowDone(tokens int) error {
	a.rows++
	a.toks += tokens
	if a.toks >= a.batchTokens {
		return a.flush()
	}
	return nil
}

func (a *arrowWriter) flush() error {
	if a.rows == 0 {
		return nil
	}
	rec := a.b.NewRecordBatch()
	defer rec.Release()
	a.rows, a.toks = 0, 0
	return a.w.Write(rec)
}

// Close flushes the last batch and writes the footer.
func (a *arrowWriter) Close() error {
	defer a.b.Release()
	if err := a.flush(); err != nil {
		return err
	}
	return a.w.Close()
}

// eachBatch reads an Arrow IPC file held in memory (uncompressed buffers are
// used in place), checks its schema, and calls fn with each record batch.
func eachBatch(kind string, shard []byte, schema *arrow.Schema, fn func(arrow.RecordBatch) error) error {
	r, err := ipc.NewMappedFileReader(shard)
	if err != nil {
		return fmt.Errorf("%s shard: %w", kind, err)
	}
	defer r.Close()
	if !r.Schema().Equal(schema) {
		return fmt.Errorf("%s shard: schema differs from the %s kind:\n%s", kind, kind, r.Schema())
	}
	for i := 0; i < r.NumRecords(); i++ {
		rec, err := r.RecordAt(i)
		if err != nil {
			return fmt.Errorf("%s shard: batch %d: %w", kind, i, err)
		}
		err = fn(rec)
		rec.Release()
		if err != nil {
			return err
		}
	}
	return nil
}
