package adapter_test

import (
	"encoding/json"
	"net/http"
	"testing"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/kilnrl/kiln/internal/agent/adapter"
	"github.com/kilnrl/kiln/internal/agent/engine"
	"github.com/kilnrl/kiln/internal/agent/enginetest"
)

func constant(text string) enginetest.Script {
	return func(enginetest.Request) enginetest.Output { return enginetest.Output{Text: text} }
}

// Minimal one-message requests per protocol.
var protoRequests = []struct {
	name, path string
	body       map[string]any
}{
	{"anthropic", "/v1/messages", map[string]any{"max_tokens": 50, "messages": []any{map[string]any{"role": "user", "content": "hello there, how are you today?"}}}},
	{"responses", "/v1/responses", map[string]any{"store": false, "input": []any{map[string]any{"type": "message", "role": "user", "content": "hello there, how are you today?"}}}},
	{"chat", "/v1/chat/completions", map[string]any{"messages": []any{map[string]any{"role": "user", "content": "hello there, how are you today?"}}}},
}

// docs/adapter.md §8 case 4 (kiln variant): a prompt that leaves no room is the protocol's
// own context-overflow error, 400, with no engine call and no record.
func TestContextOverflowIsProtocolError(t *testing.T) {
	for _, pr := range protoRequests {
		t.Run(pr.name, func(t *testing.T) {
			f := qwenFixture(t, constant("hi"), adapter.Options{})
			require.NoError(t, f.ad.Open("s", adapter.SessionOptions{MaxContextTokens: 20}))
			r := f.post(t, pr.path, "s", pr.body)
			assert.Equal(t, http.StatusBadRequest, r.status)
			if pr.name == "anthropic" {
				assert.Contains(t, string(r.body), `"type":"error"`)
				assert.Contains(t, string(r.body), "prompt is too long")
			} else {
				assert.Contains(t, string(r.body), "context_length_exceeded")
			}
			assert.Equal(t, 0, f.generateCalls())
			turns, err := f.ad.Finish("s")
			require.NoError(t, err)
			assert.Empty(t, turns)
		})
	}
}

// docs/adapter.md §8 case 4: the clamp of max_tokens to the context (session limit and
// engine context length, the smaller).
func TestContextClamp(t *testing.T) {
	f := qwenFixture(t, constant("hi"), adapter.Options{})
	require.NoError(t, f.ad.Open("s", adapter.SessionOptions{MaxContextTokens: 60}))
	r := f.post(t, "/v1/messages", "s", map[string]any{"max_tokens": 500, "messages": []any{map[string]any{"role": "user", "content": "hi"}}})
	require.Equal(t, http.StatusOK, r.status, string(r.body))
	turns, err := f.ad.Finish("s")
	require.NoError(t, err)
	require.Len(t, turns, 1)
	var body struct {
		SamplingParams map[string]any `json:"sampling_params"`
	}
	require.NoError(t, json.Unmarshal(f.eng.RequestsTo("/inference/v1/generate")[0].Body, &body))
	assert.EqualValues(t, 60-len(turns[0].PromptIDs), body.SamplingParams["max_tokens"])
}

// docs/adapter.md §8 cases 5 and 6: engine faults and invalid replies fail the request
// (5xx) and record nothing; the session keeps working afterwards.
func TestEngineFaultsRecordNothing(t *testing.T) {
	faults := []enginetest.Fault{enginetest.FaultServerError, enginetest.FaultMissingLogprobs, enginetest.FaultUsageMismatch,
		enginetest.FaultMismatchedTokenID, enginetest.FaultNaNLogprob, enginetest.FaultFewerLogprobs, enginetest.FaultDropConnection}
	for _, pr := range protoRequests {
		t.Run(pr.name, func(t *testing.T) {
			f := qwenFixture(t, constant("fine"), adapter.Options{})
			for _, fault := range faults {
				f.eng.InjectFault(fault)
				r := f.post(t, pr.path, "s", pr.body)
				assert.GreaterOrEqual(t, r.status, 500, "fault %d: %s", fault, r.body)
				if fault == enginetest.FaultServerError {
					assert.Contains(t, string(r.body), "vllm upstream 500")
				}
			}
			r := f.post(t, pr.path, "s", pr.body)
			require.Equal(t, http.StatusOK, r.status, string(r.body))
			turns, err := f.ad.Finish("s")
			require.NoError(t, err)
			require.Len(t, turns, 1)
			assert.Equal(t, int32(0), turns[0].Turn)
		})
	}
}

// docs/adapter.md §4.9 (kiln): bad JSON is a 400 in each protocol's error shape.
func TestBadJSON(t *testing.T) {
	f := qwenFixture(t, constant("x"), adapter.Options{})
	r := f.do(t, http.MethodPost, "/v1/messages", "s", "{nope")
	assert.Equal(t, http.StatusBadRequest, r.status)
	assert.Contains(t, string(r.body), `"type":"error"`)
	for _, p := range []string{"/v1/responses", "/v1/chat/completions"} {
		r := f.do(t, http.MethodPost, p, "s", "[1,")
		assert.Equal(t, http.StatusBadRequest, r.status)
		var e struct {
			Error struct{ Type, Message string } `json:"error"`
		}
		require.NoError(t, json.Unmarshal(r.body, &e), string(r.body))
		assert.Equal(t, "invalid_request_error", e.Error.Type)
	}
	assert.Equal(t, 0, f.generateCalls())
}

// docs/adapter.md §8 case 15: auxiliary routes, no engine call.
func TestAuxRoutes(t *testing.T) {
	f := qwenFixture(t, constant("x"), adapter.Options{})
	r := f.do(t, http.MethodPost, "/v1/messages/count_tokens?beta=true", "", `{"messages":[]}`)
	assert.Equal(t, http.StatusOK, r.status)
	assert.JSONEq(t, `{"input_tokens":0}`, string(r.body))
	for _, p := range []string{"/v1/models", "/healthz"} {
		r := f.do(t, http.MethodGet, p, "", "")
		assert.Equal(t, http.StatusOK, r.status)
		assert.JSONEq(t, `{"ok":true}`, string(r.body))
	}
	r = f.do(t, http.MethodHead, "/api/hello", "", "")
	assert.Equal(t, http.StatusOK, r.status)
	assert.Equal(t, 0, f.generateCalls())
	assert.Equal(t, 0, f.tokenizeCalls())
}

// docs/adapter.md §8 case 8: the turn cap answers 429 rate_limit_error.
func TestTurnCap(t *testing.T) {
	f := qwenFixture(t, constant("x"), adapter.Options{MaxTurnsPerSession: 1})
	body := protoRequests[0].body
	assert.Equal(t, http.StatusOK, f.post(t, "/v1/messages", "s", body).status)
	r := f.post(t, "/v1/messages", "s", body)
	assert.Equal(t, http.StatusTooManyRequests, r.status)
	assert.Contains(t, string(r.body), "rate_limit_error")
}

// docs/adapter.md §2.2: unknown sessions auto-open by default; AutoOpen=false refuses them;
// Open refuses duplicate ids.
func TestSessionLifecycle(t *testing.T) {
	no := false
	f := qwenFixture(t, constant("x"), adapter.Options{AutoOpen: &no})
	r := f.post(t, "/v1/messages", "ghost", protoRequests[0].body)
	assert.Equal(t, http.StatusNotFound, r.status)
	require.NoError(t, f.ad.Open("s", adapter.SessionOptions{}))
	assert.Error(t, f.ad.Open("s", adapter.SessionOptions{}))
	assert.Equal(t, http.StatusOK, f.post(t, "/v1/messages", "s", protoRequests[0].body).status)
	f.ad.Drop("s")
	assert.Equal(t, http.StatusServiceUnavailable, f.post(t, "/v1/messages", "s", protoRequests[0].body).status)
	turns, err := f.ad.Finish("s")
	require.NoError(t, err)
	assert.Empty(t, turns)

	g := qwenFixture(t, constant("x"), adapter.Options{})
	assert.Equal(t, http.StatusOK, g.post(t, "/v1/messages", "auto", protoRequests[0].body).status)
	turns, err = g.ad.Finish("auto")
	require.NoError(t, err)
	assert.Len(t, turns, 1)
}

// docs/adapter.md §8 cases 1, 2, 3: the engine body's sampling params and session header.
func TestSamplingParams(t *testing.T) {
	f := qwenFixture(t, constant("x"), adapter.Options{})
	tk := -1
	tp := 1.0
	require.NoError(t, f.ad.Open("sid-a", adapter.SessionOptions{Sampling: &engine.SamplingParams{MaxTokens: 20, MinTokens: 2, TopK: &tk, TopP: &tp}}))
	r := f.post(t, "/v1/messages", "sid-a", map[string]any{"max_tokens": 7, "stop_sequences": []string{"X"},
		"messages": []any{map[string]any{"role": "user", "content": "hi"}}})
	require.Equal(t, http.StatusOK, r.status, string(r.body))
	reqs := f.eng.RequestsTo("/inference/v1/generate")
	require.Len(t, reqs, 1)
	assert.Equal(t, "sid-a", reqs[0].SessionID)
	var body struct {
		SamplingParams map[string]any `json:"sampling_params"`
	}
	require.NoError(t, json.Unmarshal(reqs[0].Body, &body))
	sp := body.SamplingParams
	assert.EqualValues(t, 7, sp["max_tokens"])
	assert.EqualValues(t, 2, sp["min_tokens"])
	assert.EqualValues(t, -1, sp["top_k"])
	assert.EqualValues(t, 1, sp["logprobs"])
	assert.Equal(t, []any{"X"}, sp["stop"])
	assert.Equal(t, true, sp["include_stop_str_in_output"])
}

// docs/adapter.md §1.4 step 8: a session opened with a seed sends
// TurnSeed(seed, n) on its n-th turn; a session without one sends none;
// a session's own sampling seed wins.
func TestSessionSeed(t *testing.T) {
	f := qwenFixture(t, constant("x"), adapter.Options{})
	seed, own := int64(7), int64(99)
	require.NoError(t, f.ad.Open("seeded", adapter.SessionOptions{Seed: &seed}))
	require.NoError(t, f.ad.Open("plain", adapter.SessionOptions{}))
	require.NoError(t, f.ad.Open("own", adapter.SessionOptions{Seed: &seed, Sampling: &engine.SamplingParams{MaxTokens: 8, Seed: &own}}))
	sent := func(sid string) []any {
		var seeds []any
		for _, r := range f.eng.RequestsTo("/inference/v1/generate") {
			if r.SessionID != sid {
				continue
			}
			var body struct {
				SamplingParams map[string]any `json:"sampling_params"`
			}
			require.NoError(t, json.Unmarshal(r.Body, &body))
			seeds = append(seeds, body.SamplingParams["seed"])
		}
		return seeds
	}
	msgs := []any{map[string]any{"role": "user", "content": "hi"}}
	for _, sid := range []string{"seeded", "plain", "own"} {
		for turn := 0; turn < 2; turn++ {
			m := msgs
			if turn == 1 {
				m = append(append([]any{}, msgs...), map[string]any{"role": "assistant", "content": "x"}, map[string]any{"role": "user", "content": "again"})
			}
			r := f.post(t, "/v1/messages", sid, map[string]any{"max_tokens": 4, "messages": m})
			require.Equal(t, http.StatusOK, r.status, string(r.body))
		}
	}
	s0, s1 := adapter.TurnSeed(seed, 0), adapter.TurnSeed(seed, 1)
	assert.NotEqual(t, s0, s1)
	assert.True(t, s0 >= 0 && s0 < 1<<31 && s1 >= 0 && s1 < 1<<31, "31-bit seeds: %d %d", s0, s1)
	assert.Equal(t, []any{float64(s0), float64(s1)}, sent("seeded"))
	assert.Equal(t, []any{nil, nil}, sent("plain"))
	assert.Equal(t, []any{float64(own), float64(own)}, sent("own"))
}
