package engine

import (
	"encoding/json"
	"testing"

	"github.com/stretchr/testify/assert"
)

// scanTokenize agrees with encoding/json wherever it answers and declines
// what it cannot vouch for.
func TestScanTokenize(t *testing.T) {
	cases := []struct {
		body string
		ok   bool
	}{
		{`{"count":3,"max_model_len":4096,"tokens":[1,22,333],"token_strs":null}`, true},
		{` { "tokens" : [ ] , "count" : 0 } `, true},
		{`{"tokens":[5],"extra":{"a":["]",{"b":"}"}]},"max_model_len":null}`, true},
		{`{"tokens":[2147483647]}`, true},
		{`{"tokens":[2147483648]}`, false},
		{`{"tokens":[-1]}`, false},
		{`{"tokens":[1.0]}`, false},
		{`{"tokens":[01]}`, false},
		{`{"tokens":[1,]}`, false},
		{`{"tokens":[1]`, false},
		{`{"count":2}`, false},
		{`{"tokens":[1]} x`, false},
		{`[1,2]`, false},
	}
	for _, c := range cases {
		ids, count, hasCount, maxLen, ok := scanTokenize([]byte(c.body))
		assert.Equal(t, c.ok, ok, c.body)
		if !ok {
			continue
		}
		var want struct {
			Count       *int    `json:"count"`
			MaxModelLen *int    `json:"max_model_len"`
			Tokens      []int32 `json:"tokens"`
		}
		if !assert.NoError(t, json.Unmarshal([]byte(c.body), &want), c.body) {
			continue
		}
		assert.Equal(t, want.Tokens, ids, c.body)
		assert.Equal(t, want.Count != nil, hasCount, c.body)
		if want.Count != nil {
			assert.Equal(t, *want.Count, count)
		}
		if want.MaxModelLen != nil {
			assert.Equal(t, *want.MaxModelLen, maxLen)
		}
	}
}
