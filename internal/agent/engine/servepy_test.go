package engine_test

import (
	"bytes"
	"context"
	"encoding/json"
	"math"
	"net/http"
	"strings"
	"testing"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/kilnrl/kiln/internal/agent/engine"
	"github.com/kilnrl/kiln/internal/agent/enginetest"
	"github.com/kilnrl/kiln/internal/testenv/gputest"
)

// startServePy builds the tiny Qwen3 checkpoint (docs/train.md §5) and
// starts python -m kiln_gpu.serve on it (docs/serve.md §1); it returns the
// base URL. Without gpu/'s environment the test skips (fails under CI=true).
func startServePy(t *testing.T) string {
	t.Helper()
	if testing.Short() {
		t.Skip("starts a Python model server")
	}
	ge := gputest.Find(t)
	return ge.Serve(t, ge.Tiny(t))
}

// tokenizeText encodes text with /tokenize's prompt form (no special tokens).
func tokenizeText(t *testing.T, base, text string) []int32 {
	t.Helper()
	body, err := json.Marshal(map[string]any{"prompt": text, "add_special_tokens": false})
	require.NoError(t, err)
	r, err := http.Post(base+"/tokenize", "application/json", bytes.NewReader(body))
	require.NoError(t, err)
	defer r.Body.Close()
	require.Equal(t, http.StatusOK, r.StatusCode)
	var resp struct {
		Tokens []int32 `json:"tokens"`
	}
	require.NoError(t, json.NewDecoder(r.Body).Decode(&resp))
	return resp.Tokens
}

// kiln's own engine client against kiln_gpu.serve (docs/serve.md §8): probe,
// tokenize a chat with tools, generate on both routes, detokenize.
func TestServePyWithEngineClient(t *testing.T) {
	base := startServePy(t)
	ctx := context.Background()
	msgs := []json.RawMessage{
		json.RawMessage(`{"role":"system","content":"You are a coding agent."}`),
		json.RawMessage(`{"role":"user","content":"Fix the bug <b>é</b>"}`),
		json.RawMessage(`{"role":"assistant","content":"","reasoning_content":"look first","tool_calls":[{"id":"c1","type":"function","function":{"name":"bash","arguments":"{\"cmd\": \"ls\"}"}}]}`),
		json.RawMessage(`{"role":"tool","content":"main.go"}`),
	}
	tools := []json.RawMessage{json.RawMessage(`{"type":"function","function":{"name":"bash","description":"run","parameters":{"type":"object","properties":{"cmd":{"type":"string"}}}}}`)}
	for _, mode := range []engine.Mode{engine.ModeGenerate, engine.ModeCompletions} {
		t.Run(mode.String(), func(t *testing.T) {
			c, err := engine.New(engine.Options{BaseURL: base, Mode: mode, Model: "tiny"})
			require.NoError(t, err)
			caps, err := c.Probe(ctx)
			require.NoError(t, err)
			assert.Equal(t, 4096, caps.MaxModelLen)
			assert.Equal(t, []string{"tiny"}, caps.Models)

			prompt, err := c.TokenizeChat(ctx, engine.ChatRequest{Messages: msgs, Tools: tools, AddGenerationPrompt: true,
				ChatTemplateKwargs: json.RawMessage(`{"enable_thinking":false}`)})
			require.NoError(t, err)
			text, err := c.Detokenize(ctx, prompt)
			require.NoError(t, err)
			assert.Contains(t, text, "Fix the bug <b>é</b>")
			assert.Contains(t, text, `{"name": "bash", "arguments": {"cmd": "ls"}}`)
			assert.Contains(t, text, "<tools>")
			assert.True(t, strings.HasSuffix(text, "<|im_start|>assistant\n<think>\n\n</think>\n\n"), "%q", text)
			assert.Equal(t, prompt, tokenizeText(t, base, text), "ids round trip through the text")

			temp, seed, topP := 0.8, int64(7), 0.9
			req := engine.GenerateRequest{PromptIDs: prompt, ReturnSamplingMask: mode == engine.ModeGenerate,
				Sampling: engine.SamplingParams{MaxTokens: 12, Temperature: &temp, TopP: &topP, Seed: &seed, IgnoreEOS: true, Logprobs: 2}}
			g, err := c.Generate(ctx, req)
			require.NoError(t, err)
			require.Len(t, g.OutputIDs, 12)
			require.Len(t, g.LogProbs, 12)
			assert.Equal(t, "length", g.FinishReason)
			for i, lp := range g.LogProbs {
				assert.True(t, lp <= 0 && !math.IsInf(float64(lp), 0), "logprob %d = %v", i, lp)
			}
			_, _, err = g.TopK(2)
			require.NoError(t, err)
			if mode == engine.ModeGenerate {
				assert.Equal(t, engine.ShapeTokenIDs, g.Shape)
				require.Len(t, g.TopPTokenOffsets, 13)
				assert.Equal(t, len(prompt), g.PromptTokens)
			}
			g2, err := c.Generate(ctx, req) // same seed, same tokens
			require.NoError(t, err)
			assert.Equal(t, g.OutputIDs, g2.OutputIDs)
			assert.Equal(t, g.LogProbs, g2.LogProbs)
			out, err := c.Detokenize(ctx, g.OutputIDs)
			require.NoError(t, err)
			assert.NotEmpty(t, out)
		})
	}
}

// The fixture conversations of the scripted engine's Qwen3 template
// (enginetest.ChatTemplate, its goldens in internal/agent/enginetest/testdata)
// rendered by the real Qwen3 template through transformers (kiln_gpu.serve's
// /tokenize, then /detokenize) and by the scripted engine: byte-identical
// (docs/serve.md §7).
func TestServePyTemplateMatchesScriptedEngine(t *testing.T) {
	base := startServePy(t)
	ctx := context.Background()
	const tools = `[{"type":"function","function":{"name":"read_file","description":"Read a file & show <it>","parameters":{"type":"object","properties":{"path":{"type":"string"},"limit":{"type":"integer"}},"required":["path"]}}},{"function":{"name":"bash","parameters":{"type":"object","properties":{"cmd":{"type":"string"}}}}}]`
	cases := []struct {
		name, messages, tools string
		opts                  enginetest.RenderOptions
		kwargs                string
	}{
		{"simple", `[{"role":"system","content":"You are terse."},{"role":"user","content":"Hi"}]`, "", enginetest.RenderOptions{AddGenerationPrompt: true}, ""},
		{"no_thinking", `[{"role":"user","content":[{"type":"text","text":"a"},{"type":"text","text":"b"}]}]`, "", enginetest.RenderOptions{AddGenerationPrompt: true, Kwargs: map[string]any{"enable_thinking": false}}, `{"enable_thinking":false}`},
		{"reasoning_dropped_before_last_query", `[{"role":"user","content":"q1"},{"role":"assistant","content":"a1","reasoning_content":"r1"},{"role":"user","content":"q2"},{"role":"assistant","content":"a2","reasoning_content":"\nr2\n"}]`, "", enginetest.RenderOptions{}, ""},
		{"think_in_content", `[{"role":"user","content":"q"},{"role":"assistant","content":"<think>\nplan\n</think>\n\nanswer"}]`, "", enginetest.RenderOptions{}, ""},
		{"tools_parallel_calls_results", `[{"role":"system","content":"sys"},{"role":"user","content":"Read it"},{"role":"assistant","content":"","reasoning_content":"need files","tool_calls":[{"id":"c1","type":"function","function":{"name":"read_file","arguments":"{\"path\": \"a.go\", \"limit\": 1.0}"}},{"type":"function","function":{"name":"bash","arguments":{"cmd":"ls <dir> && echo é"}}}]},{"role":"tool","content":"package a"},{"role":"tool","content":"a.go"},{"role":"assistant","content":"Done.","reasoning":"all read"}]`, tools, enginetest.RenderOptions{}, ""},
		{"tools_generation_prompt", `[{"role":"user","content":"Read it"},{"role":"assistant","content":"Reading.","tool_calls":[{"type":"function","function":{"name":"read_file","arguments":{"path":"a.go","limit":5,"opts":{"x":[1,true,null]},"flag":true}}}]},{"role":"assistant","content":"","tool_calls":[]},{"role":"tool","content":"package a"}]`, tools, enginetest.RenderOptions{AddGenerationPrompt: true}, ""},
		{"continue_final", `[{"role":"user","content":"q"},{"role":"assistant","content":"partial ans"}]`, "", enginetest.RenderOptions{ContinueFinalMessage: true}, ""},
	}
	c, err := engine.New(engine.Options{BaseURL: base, Model: "tiny"})
	require.NoError(t, err)
	for _, tc := range cases {
		t.Run(tc.name, func(t *testing.T) {
			want, err := enginetest.ChatTemplate{}.Render([]byte(tc.messages), []byte(tc.tools), tc.opts)
			require.NoError(t, err)
			var msgs, tl []json.RawMessage
			require.NoError(t, json.Unmarshal([]byte(tc.messages), &msgs))
			if tc.tools != "" {
				require.NoError(t, json.Unmarshal([]byte(tc.tools), &tl))
			}
			req := engine.ChatRequest{Messages: msgs, Tools: tl, AddGenerationPrompt: tc.opts.AddGenerationPrompt,
				ContinueFinalMessage: tc.opts.ContinueFinalMessage}
			if tc.kwargs != "" {
				req.ChatTemplateKwargs = json.RawMessage(tc.kwargs)
			}
			ids, err := c.TokenizeChat(ctx, req)
			require.NoError(t, err)
			got, err := c.Detokenize(ctx, ids)
			require.NoError(t, err)
			assert.Equal(t, want, got)
		})
	}
}
