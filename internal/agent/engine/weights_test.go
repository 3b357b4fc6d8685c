package engine

import (
	"strings"
	"sync"
	"testing"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
)

// weightsReply is a shape (C) reply of two output tokens whose choice ends
// with field (`"weight_versions":...`, or anything else).
func weightsReply(field string) string {
	return `{"choices":[{"token_ids":[5,6],"logprobs":{"content":[{"token_id":5,"logprob":-1},{"token_id":6,"logprob":-2}]},` +
		`"finish_reason":"stop"` + field + `}],"output_mode":"tokens","usage":{"prompt_tokens":3,"completion_tokens":2}}`
}

// TestWeightVersions: choices[0].weight_versions is read as a list of
// integers and strings (serve.py writes integers; vLLM's upstream form is
// unconfirmed, so strings are taken too), and every other form is ignored
// without failing the reply. Both readings of the reply (the typed and the
// step-by-step one) give the same versions.
func TestWeightVersions(t *testing.T) {
	for _, tc := range []struct {
		name  string
		field string
		want  []string
	}{
		{"absent", ``, nil},
		{"null", `,"weight_versions":null`, nil},
		{"ints, one per token", `,"weight_versions":[7,7]`, []string{"7", "7"}},
		{"a change mid-reply", `,"weight_versions":[7,8]`, []string{"7", "8"}},
		{"strings", `,"weight_versions":["7","step-8"]`, []string{"7", "step-8"}},
		{"ints and strings", `,"weight_versions":[7,"7"]`, []string{"7", "7"}},
		{"negative and zero", `,"weight_versions":[0,-1]`, []string{"0", "-1"}},
		{"escaped string", `,"weight_versions":["\u0037","a\"b"]`, []string{"7", `a"b`}},
		{"any length", `,"weight_versions":[7]`, []string{"7"}},
		{"case-folded key", `,"Weight_Versions":[9,9]`, []string{"9", "9"}},
		{"the last of a repeated key", `,"weight_versions":[1,1],"weight_versions":[2,2]`, []string{"2", "2"}},
		{"a repeated key, the last null", `,"weight_versions":[1,1],"weight_versions":null`, nil},
		{"empty list", `,"weight_versions":[]`, nil},
		{"a number", `,"weight_versions":7`, nil},
		{"a string", `,"weight_versions":"7"`, nil},
		{"an object", `,"weight_versions":{"0":7}`, nil},
		{"a fraction", `,"weight_versions":[7,7.5]`, nil},
		{"an exponent", `,"weight_versions":[7,1e3]`, nil},
		{"past int64", `,"weight_versions":[9223372036854775808]`, nil},
		{"a null entry", `,"weight_versions":[7,null]`, nil},
		{"a bool entry", `,"weight_versions":[true,7]`, nil},
		{"a nested list", `,"weight_versions":[[7],[7]]`, nil},
	} {
		t.Run(tc.name, func(t *testing.T) {
			body := []byte(weightsReply(tc.field))
			req := &GenerateRequest{PromptIDs: []int32{1, 2, 3}}
			g, err := parseGenerate(body, req)
			require.NoError(t, err, "%s", body)
			assert.Equal(t, tc.want, g.WeightVersions)
		})
	}
}

// TestGenerateObserve: Options.Observe sees every generation Generate
// returns, with its request and its weight versions, and none of a
// probe's.
func TestGenerateObserve(t *testing.T) {
	f := newFake(t, map[string]reply{
		"GET /version":                {body: []byte(`{"version":"0.32.0"}`)},
		"GET /v1/models":              {body: []byte(`{"data":[{"id":"m","max_model_len":4096}]}`)},
		"POST /inference/v1/generate": {body: []byte(weightsReply(`,"weight_versions":[7,8]`))},
	})
	var mu sync.Mutex
	var seenIDs []string
	var seenVersions [][]string
	c := newClient(t, f.URL, Options{Mode: ModeGenerate, Observe: func(req *GenerateRequest, g *Generation) {
		mu.Lock()
		defer mu.Unlock()
		seenIDs = append(seenIDs, req.SessionID)
		seenVersions = append(seenVersions, g.WeightVersions)
	}})
	_, err := c.Probe(bg)
	require.NoError(t, err)
	assert.Empty(t, seenIDs, "the probe's generation is not observed")
	g, err := c.Generate(bg, GenerateRequest{PromptIDs: []int32{1, 2, 3}, SessionID: "s-1", Sampling: SamplingParams{MaxTokens: 4}})
	require.NoError(t, err)
	assert.Equal(t, []string{"7", "8"}, g.WeightVersions)
	assert.Equal(t, []string{"s-1"}, seenIDs)
	assert.Equal(t, [][]string{{"7", "8"}}, seenVersions)

	// An invalid reply is an error and is not observed.
	f.mu.Lock()
	f.routes["POST /inference/v1/generate"] = reply{body: []byte(strings.Replace(weightsReply(`,"weight_versions":[7,7]`), `"token_ids":[5,6]`, `"token_ids":[5]`, 1))}
	f.mu.Unlock()
	_, err = c.Generate(bg, GenerateRequest{PromptIDs: []int32{1, 2, 3}, SessionID: "s-2", Sampling: SamplingParams{MaxTokens: 4}})
	require.Error(t, err)
	assert.Equal(t, []string{"s-1"}, seenIDs)
}
