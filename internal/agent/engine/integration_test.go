package engine_test

import (
	"context"
	"encoding/json"
	"errors"
	"net/http/httptest"
	"testing"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/kilnrl/kiln/internal/agent/engine"
	"github.com/kilnrl/kiln/internal/agent/enginetest"
)

// The engine client against the scripted engine: two independent readings
// of docs/engine-wire.md must agree on every route, response shape and fault.
func TestClientAgainstScriptedEngine(t *testing.T) {
	ctx := context.Background()
	msgs := []json.RawMessage{
		json.RawMessage(`{"role":"system","content":"You are a coding agent."}`),
		json.RawMessage(`{"role":"user","content":"Fix the bug <b>é</b>"}`),
	}
	tools := []json.RawMessage{json.RawMessage(`{"type":"function","function":{"name":"bash","description":"run","parameters":{"type":"object","properties":{"cmd":{"type":"string"}}}}}`)}
	shapes := []struct {
		name  string
		shape enginetest.ResponseShape
	}{{"token_ids", enginetest.ShapeTokenIDs}, {"scale_out", enginetest.ShapeScaleOut}, {"disagg", enginetest.ShapeDisagg}}
	for _, sh := range shapes {
		for _, mode := range []engine.Mode{engine.ModeGenerate, engine.ModeCompletions} {
			t.Run(sh.name+"/"+modeName(mode), func(t *testing.T) {
				eng := enginetest.New(enginetest.Options{Shape: sh.shape, MaxModelLen: 2048,
					Script: enginetest.Sequence("I will run <tool_call>\n{\"name\":\"bash\",\"arguments\":{\"cmd\":\"ls\"}}\n</tool_call>", "done")})
				srv := httptest.NewServer(eng)
				defer srv.Close()
				c, err := engine.New(engine.Options{BaseURL: srv.URL, Mode: mode})
				require.NoError(t, err)
				caps, err := c.Probe(ctx)
				require.NoError(t, err)
				assert.Equal(t, 2048, caps.MaxModelLen)

				prompt, err := c.TokenizeChat(ctx, engine.ChatRequest{Messages: msgs, Tools: tools, AddGenerationPrompt: true})
				require.NoError(t, err)
				text, err := c.Detokenize(ctx, prompt)
				require.NoError(t, err)
				assert.Contains(t, text, "Fix the bug <b>é</b>")
				assert.Contains(t, text, `"name": "bash"`)

				gen, err := c.Generate(ctx, engine.GenerateRequest{PromptIDs: prompt, SessionID: "sess-1",
					Sampling: engine.SamplingParams{MaxTokens: 256}})
				require.NoError(t, err)
				require.NotEmpty(t, gen.OutputIDs)
				assert.Len(t, gen.LogProbs, len(gen.OutputIDs))
				assert.Equal(t, "stop", gen.FinishReason)
				out, err := c.Detokenize(ctx, gen.OutputIDs)
				require.NoError(t, err)
				assert.Contains(t, out, `{"name":"bash","arguments":{"cmd":"ls"}}`)
				reqs := eng.RequestsTo(string(gen.Route))
				require.NotEmpty(t, reqs)
				assert.Equal(t, "sess-1", reqs[len(reqs)-1].SessionID, "x-session-id routes the request")

				// Turn 2 continues from turn 1's exact tokens.
				next := append(append(append([]int32{}, prompt...), gen.OutputIDs...), 10)
				gen2, err := c.Generate(ctx, engine.GenerateRequest{PromptIDs: next, SessionID: "sess-1", Sampling: engine.SamplingParams{MaxTokens: 16}})
				require.NoError(t, err)
				out2, _ := c.Detokenize(ctx, gen2.OutputIDs)
				assert.Contains(t, out2, "done")
			})
		}
	}
}

func modeName(m engine.Mode) string {
	if m == engine.ModeCompletions {
		return "completions"
	}
	return "generate"
}

func TestClientRejectsFaultyReplies(t *testing.T) {
	ctx := context.Background()
	cases := []struct {
		fault  enginetest.Fault
		reason engine.Reason
	}{
		{enginetest.FaultMissingLogprobs, engine.ReasonMissingLogprobs},
		{enginetest.FaultNaNLogprob, engine.ReasonNonFiniteLogprob},
		{enginetest.FaultFewerLogprobs, engine.ReasonLengthMismatch},
		{enginetest.FaultExtraLogprob, engine.ReasonLengthMismatch},
		{enginetest.FaultMismatchedTokenID, engine.ReasonTokenMismatch},
		{enginetest.FaultUsageMismatch, engine.ReasonUsageMismatch},
		{enginetest.FaultMissingTokenIDs, engine.ReasonMissingTokenIDs},
	}
	for _, c := range cases {
		t.Run(string(c.reason), func(t *testing.T) {
			eng := enginetest.New(enginetest.Options{})
			srv := httptest.NewServer(eng)
			defer srv.Close()
			cl, err := engine.New(engine.Options{BaseURL: srv.URL, Mode: engine.ModeGenerate})
			require.NoError(t, err)
			_, err = cl.Probe(ctx)
			require.NoError(t, err)
			eng.InjectFault(c.fault)
			_, err = cl.Generate(ctx, engine.GenerateRequest{PromptIDs: []int32{72, 105}, Sampling: engine.SamplingParams{MaxTokens: 8}})
			var re *engine.ReplyError
			require.True(t, errors.As(err, &re), "fault %v: got %v", c.fault, err)
			assert.Equal(t, c.reason, re.Reason)
		})
	}
}

func TestProbeNamesTheMissingFlag(t *testing.T) {
	srv := httptest.NewServer(enginetest.New(enginetest.Options{Generate: enginetest.GenerateDisabled}))
	defer srv.Close()
	c, err := engine.New(engine.Options{BaseURL: srv.URL, Mode: engine.ModeGenerate})
	require.NoError(t, err)
	_, err = c.Probe(context.Background())
	require.Error(t, err)
	assert.Contains(t, err.Error(), "--enable-scale-out")
	// Auto mode falls back to completions with a token prompt.
	auto, err := engine.New(engine.Options{BaseURL: srv.URL, Mode: engine.ModeAuto})
	require.NoError(t, err)
	gen, err := auto.Generate(context.Background(), engine.GenerateRequest{PromptIDs: []int32{72, 105}, Sampling: engine.SamplingParams{MaxTokens: 8}})
	require.NoError(t, err)
	assert.Equal(t, engine.RouteCompletions, gen.Route)
}

func TestContextOverflowAndSpecialTokens(t *testing.T) {
	srv := httptest.NewServer(enginetest.New(enginetest.Options{MaxModelLen: 64}))
	defer srv.Close()
	c, err := engine.New(engine.Options{BaseURL: srv.URL, Mode: engine.ModeGenerate})
	require.NoError(t, err)
	_, err = c.Generate(context.Background(), engine.GenerateRequest{PromptIDs: make([]int32, 64), Sampling: engine.SamplingParams{MaxTokens: 8}})
	var over *engine.ContextOverflowError
	require.True(t, errors.As(err, &over), "%v", err)
	assert.Equal(t, 64, over.MaxContext)

	dir := t.TempDir()
	require.NoError(t, enginetest.WriteTokenizerFiles(dir))
	sp, err := engine.LoadSpecialTokens(dir)
	require.NoError(t, err)
	assert.Equal(t, int32(enginetest.IMEnd), sp.IMEnd)
	assert.Equal(t, int32(enginetest.IMStart), sp.IMStart)
	assert.Equal(t, int32(enginetest.ThinkEnd), sp.ThinkEnd)
	assert.True(t, sp.IsStop(int32(enginetest.IMEnd)))
}

// The client reads the per-token weight versions the scripted engine
// reports as serve.py does (docs/serve.md §6): one per output token of the
// version it serves, or a script's own list (a reload mid-reply); none
// when the engine serves no version.
func TestClientWeightVersionsScripted(t *testing.T) {
	ctx := context.Background()
	seven := int64(7)
	for _, tc := range []struct {
		name    string
		serves  *int64
		scripts []int64
		want    []string
	}{
		{"no version", nil, nil, nil},
		{"one per token", &seven, nil, []string{"7", "7", "7"}},
		{"scripted change", &seven, []int64{7, 8}, []string{"7", "8"}},
	} {
		t.Run(tc.name, func(t *testing.T) {
			eng := enginetest.New(enginetest.Options{WeightVersion: tc.serves,
				Script: enginetest.SequenceOutputs(enginetest.Output{Text: "ab", WeightVersions: tc.scripts})})
			srv := httptest.NewServer(eng)
			defer srv.Close()
			c, err := engine.New(engine.Options{BaseURL: srv.URL, Mode: engine.ModeGenerate})
			require.NoError(t, err)
			gen, err := c.Generate(ctx, engine.GenerateRequest{PromptIDs: []int32{1, 2}, SessionID: "s",
				Sampling: engine.SamplingParams{MaxTokens: 16}})
			require.NoError(t, err)
			require.Len(t, gen.OutputIDs, 3) // "a", "b", <|im_end|>
			assert.Equal(t, tc.want, gen.WeightVersions)
		})
	}
}
