package records

import (
	"bytes"
	"encoding/json"
	"fmt"
	"strings"

	"github.com/parquet-go/parquet-go"
)

// CheckShard decodes every row of one shard of kind k, after checking that
// the file's schema is the kind's, and returns the row count: what kiln
// verify holds a shard to beyond its checksum (a shard that hashes right
// but was written under another schema, or does not decode, is corrupt).
func (k Kind) CheckShard(shard []byte) (int64, error) {
	if k.Encoding == Parquet {
		f, err := parquet.OpenFile(bytes.NewReader(shard), int64(len(shard)))
		if err != nil {
			return 0, fmt.Errorf("%s shard: %w", k.Name, err)
		}
		if got := f.Schema().String(); !k.Reads(fingerprint(got)) {
			return 0, fmt.Errorf("%s shard: its schema (%s, %s) differs from the %s kind's (%s)",
				k.Name, fingerprint(got), firstLine(got), k.Name, k.Fingerprint())
		}
	}
	var n int64
	err := k.EachJSON(shard, func(json.RawMessage) error { n++; return nil })
	return n, err
}

func firstLine(s string) string {
	line, _, _ := strings.Cut(s, "\n")
	return strings.TrimSuffix(strings.TrimSpace(line), " {")
}
