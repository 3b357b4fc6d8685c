package convert

import (
	"bytes"
	"encoding/json"
	"testing"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
)

// scanToMap is scanObject's result as encoding/json gives it: last key wins.
func scanToMap(data []byte) (map[string]json.RawMessage, error) {
	members, err := scanObject(data)
	if err != nil {
		return nil, err
	}
	m := map[string]json.RawMessage{}
	for _, mb := range members {
		m[mb.key] = mb.raw
	}
	return m, nil
}

var scanSeeds = []string{
	`{}`, ` { "a" : 1 } `, `{"a":"x\ny","b":[1,2,{"c":null}],"d":-0.5e+3,"e":true,"f":false}`,
	`{"a":1,"a":2}`, `{"k\u00e9y":"\ud83d\ude00"}`, `{"a":01}`, `{"a":1.}`, `{"a":"\x"}`, `{"a":[1,]}`,
	`{"a":1}x`, `[1]`, `null`, `{"a":"` + "\x01" + `"}`, `{"a":tru}`, `{"a":-}`, `{"a" 1}`, `{,}`, `{"a":1,}`,
	"{\"a\":\"\xff\"}", `{"a":"\u12"}`, `{"a":1e}`, `{"a":{"b":{"c":[[[]]]}}}`, "\t{\"a\":0}\r\n", `{"":""}`,
}

func TestScanObjectMatchesEncodingJSON(t *testing.T) {
	for _, s := range scanSeeds {
		checkScan(t, []byte(s))
	}
}

func checkScan(t *testing.T, data []byte) {
	var want map[string]json.RawMessage
	wantErr := json.Unmarshal(data, &want)
	if wantErr == nil && want == nil {
		wantErr = assert.AnError // JSON null: not an object
	}
	got, err := scanToMap(data)
	require.Equal(t, wantErr == nil, err == nil, "%q: encoding/json %v, scanObject %v", data, wantErr, err)
	if err != nil {
		return
	}
	require.Len(t, got, len(want), "%q", data)
	for k, v := range want {
		assert.True(t, bytes.Equal(v, got[k]), "%q: key %q: %s vs %s", data, k, v, got[k])
	}
}

func FuzzScanObject(f *testing.F) {
	for _, s := range scanSeeds {
		f.Add([]byte(s))
	}
	f.Fuzz(func(t *testing.T, data []byte) { checkScan(t, data) })
}
