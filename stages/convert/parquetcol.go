package convert

import (
	"context"
	"errors"
	"fmt"
	"io"
	"strings"

	"github.com/parquet-go/parquet-go"
)

// stringColumn is one leaf column of a Parquet file holding strings (or
// bytes), found by path, with the definition level of each ancestor so a
// null can be told apart from a null parent.
type stringColumn struct {
	path  []string
	leaf  int   // leaf column index
	defAt []int // defAt[i]: the definition level at which path[i] is present
}

// findStringColumn locates path (e.g. extra_info, instance_json) in f's
// schema: every step must exist, the parents be groups (structs), none
// repeated, and the leaf a byte array. Its error says which step is missing
// or mistyped.
func findStringColumn(f *parquet.File, path ...string) (stringColumn, error) {
	col := f.Root()
	sc := stringColumn{path: path}
	def := 0
	for i, name := range path {
		next := col.Column(name)
		where := strings.Join(path[:i+1], ".")
		if next == nil {
			have := []string{}
			for _, c := range col.Columns() {
				have = append(have, c.Name())
			}
			return sc, fmt.Errorf("column %q is missing (the file has %s)", where, strings.Join(have, ", "))
		}
		if next.Repeated() {
			return sc, fmt.Errorf("column %q is repeated (a list); want a single value per row", where)
		}
		if next.Optional() {
			def++
		}
		sc.defAt = append(sc.defAt, def)
		last := i == len(path)-1
		switch {
		case !last && next.Leaf():
			return sc, fmt.Errorf("column %q is %s, want a struct holding %q", where, next.Type().Kind(), path[i+1])
		case last && !next.Leaf():
			return sc, fmt.Errorf("column %q is a group, want a string", where)
		case last && next.Type().Kind() != parquet.ByteArray:
			return sc, fmt.Errorf("column %q is %s (%s), want a string", where, next.Type().Kind(), next.Type())
		}
		col = next
	}
	sc.leaf = col.Index()
	return sc, nil
}

// nullAt returns the name of the outermost null step for a value whose
// definition level is def ("" when the value is present).
func (sc stringColumn) nullAt(def int) string {
	for i, d := range sc.defAt {
		if def < d {
			return strings.Join(sc.path[:i+1], ".")
		}
	}
	return ""
}

// each streams the column's values in row order, one page at a time, so
// memory holds one page whatever the file's size. row counts from 0; null
// names the null step, or is "". v is valid only during the call.
func (sc stringColumn) each(ctx context.Context, f *parquet.File, fn func(row int64, v []byte, null string) error) error {
	var row int64
	values := make([]parquet.Value, 64)
	for _, rg := range f.RowGroups() {
		pages := rg.ColumnChunks()[sc.leaf].Pages()
		err := func() error {
			defer pages.Close()
			for {
				if err := ctx.Err(); err != nil {
					return err
				}
				page, err := pages.ReadPage()
				if errors.Is(err, io.EOF) {
					return nil
				}
				if err != nil {
					return fmt.Errorf("row %d: %w", row+1, err)
				}
				err = func() error {
					defer parquet.Release(page)
					r := page.Values()
					for {
						n, err := r.ReadValues(values)
						for _, v := range values[:n] {
							null := ""
							if v.IsNull() {
								null = sc.nullAt(v.DefinitionLevel())
							}
							if ferr := fn(row, v.ByteArray(), null); ferr != nil {
								return ferr
							}
							row++
						}
						if errors.Is(err, io.EOF) {
							return nil
						}
						if err != nil {
							return fmt.Errorf("row %d: %w", row+1, err)
						}
					}
				}()
				if err != nil {
					return err
				}
			}
		}()
		if err != nil {
			return err
		}
	}
	return nil
}
