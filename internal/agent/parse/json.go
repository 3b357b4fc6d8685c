package parse

import (
	"encoding/json"

	"github.com/kilnrl/kiln/internal/ojson"
)

// Values are ojson's: nil, bool, json.Number (a valid JSON number
// literal), string, []any and *ojson.Object (keys in the order the model
// wrote them).

// parseJSON decodes exactly one JSON value surrounded by optional JSON
// white space, as Python's json.loads does, except that NaN and the
// infinities are refused (they have no JSON encoding). lenient allows raw
// control characters inside strings (json.loads(strict=False)).
func parseJSON(s string, lenient bool) (any, bool) {
	var v any
	var err error
	if lenient {
		v, err = ojson.DecodeLenient([]byte(s))
	} else {
		v, err = ojson.Decode([]byte(s))
	}
	return v, err == nil
}

// encode writes v as compact JSON: keys in order, no HTML escaping,
// invalid UTF-8 as U+FFFD.
func encode(v any) json.RawMessage { return ojson.Marshal(v) }
