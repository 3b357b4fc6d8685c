package enginetest

import (
	"bytes"
	"encoding/json"
	"maps"
	"slices"
	"strings"
	"testing"

	"github.com/kilnrl/kiln/internal/ojson"
)

// fieldsCases are bodies objectFields must read as encoding/json reads them
// into a map[string]json.RawMessage.
var fieldsCases = []string{
	`{}`, ` { } `, `{"a":1}`, `{"a":1,"a":2}`, `{"a" : [1, 2] , "b":{"c":null}}`, `{"token_ids":[1,2,3],"sampling_params":{"max_tokens":3}}`,
	`{"a\u005fb":1}`, `{"\u00e9":"x"}`, "{\"\xff\":1}", `{"a\"b":true}`, `{"a":"\ud800"}`, `{"a":1}x`, `{"a":1} {"b":2}`, `{"a":1}}`,
	`null`, `[]`, `1`, `"s"`, ``, ` `, `{`, `{"a"}`, `{"a":}`, `{"a":1,}`, `{a:1}`, `{"a":01}`, `{"a":[1,]}`, `{"a":1 "b":2}`,
	`{"a":"\x"}`, "{\"a\":\"\x01\"}", `{"a":tru}`, `{"a":nan}`, "\ufeff{}", `{"a":1.5e3,"b":-0}`,
	`{"a":[1,2],"a":[3]}`, `{"a":[1,2],"a":"x"}`, `{"a":[1,2.5]}`, `{"a":null}`, `{"a":[1,"\q"]}`, `{"a":[01]}`, "{\"a\x01\":1}",
	`{"a":` + strings.Repeat("[", 9999) + strings.Repeat("]", 9999) + `}`, `{"a":` + strings.Repeat("[", 10000) + strings.Repeat("]", 10000) + `}`,
}

func TestObjectFields(t *testing.T) {
	for _, in := range fieldsCases {
		checkFields(t, in)
	}
}

func checkFields(t *testing.T, in string) {
	t.Helper()
	var dec map[string]json.RawMessage
	decOK := json.NewDecoder(bytes.NewReader([]byte(in))).Decode(&dec) == nil && dec != nil
	var un map[string]json.RawMessage
	unOK := json.Unmarshal([]byte(in), &un) == nil && un != nil
	for _, c := range []struct {
		trailing bool
		want     map[string]json.RawMessage
		wantOK   bool
	}{{true, dec, decOK}, {false, un, unOK}} {
		got, ints, intsOK, ok := objectFields([]byte(in), c.trailing, "a")
		if ok != c.wantOK {
			t.Fatalf("objectFields(%q, trailing %v) ok = %v, encoding/json %v", in, c.trailing, ok, c.wantOK)
		}
		if ok && !maps.EqualFunc(got, c.want, func(a, b json.RawMessage) bool { return bytes.Equal(a, b) }) {
			t.Fatalf("objectFields(%q, trailing %v) = %q, encoding/json %q", in, c.trailing, got, c.want)
		}
		if wantInts, wantIntsOK := ojson.DecodeInts(c.want["a"]); ok && (intsOK != wantIntsOK || !slices.Equal(ints, wantInts) || (ints == nil) != (wantInts == nil)) {
			t.Fatalf("objectFields(%q, trailing %v) ints = %v, %v; DecodeInts of the field %v, %v", in, c.trailing, ints, intsOK, wantInts, wantIntsOK)
		}
	}
}

func FuzzObjectFields(f *testing.F) {
	for _, in := range fieldsCases {
		f.Add(in)
	}
	f.Fuzz(checkFields)
}
