package convert

import (
	"fmt"

	"github.com/kilnrl/kiln/internal/ojson"
)

// unquoteJSON decodes a JSON string literal that a JSON decoder has already
// validated (a json.RawMessage beginning with '"'), as encoding/json does:
// escapes resolved, invalid UTF-8 and lone surrogates become U+FFFD
// (ojson.Unquote). It saves a second validating pass over large strings
// (test patches).
func unquoteJSON(raw []byte) (string, error) {
	s, ok := ojson.Unquote(raw)
	if !ok {
		return "", fmt.Errorf("invalid JSON string literal %.40q", raw)
	}
	return s, nil
}
