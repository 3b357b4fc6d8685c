package rollout

import (
	"context"
	"encoding/json"
	"errors"
	"io"
	"net/http"
	"net/http/httptest"
	"strings"
	"testing"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/kilnrl/kiln/formats/dataset"
	"github.com/kilnrl/kiln/internal/agent/engine"
	"github.com/kilnrl/kiln/internal/agent/enginetest"
	"github.com/kilnrl/kiln/internal/stagecmd"
	"github.com/kilnrl/kiln/internal/stagecmd/stagetest"
)

// noGenerate is the script of a renderer engine: a replay must never ask it
// to generate, so any generation fails the test.
func noGenerate(t testing.TB) enginetest.Script {
	return func(r enginetest.Request) enginetest.Output {
		t.Errorf("the renderer was asked to generate (session %q turn %d, %s)", r.SessionID, r.Turn, r.Endpoint)
		return enginetest.Output{Err: errors.New("a replay's renderer never generates")}
	}
}

// startReplayEngine serves replayTurns() (rollouts 7 and 8; turn 0 of
// rollout 8 holds a top-p sampling mask) with an enginetest renderer that
// fails the test if asked to generate.
func startReplayEngine(t *testing.T) (*replayEngine, string) {
	t.Helper()
	turns := replayTurns()
	turns[2].TopPTokenIDs, turns[2].TopPTokenOffsets = []int32{6, 9}, []int32{0, 2}
	book, err := newReplayBook(turns)
	require.NoError(t, err)
	renderer := startEngine(t, noGenerate(t))
	e, err := newReplayEngine(book, "rec/turns@v1", renderer, stagecmd.NewLogger(io.Discard, false))
	require.NoError(t, err)
	url, err := e.start()
	require.NoError(t, err)
	t.Cleanup(e.close)
	return e, url
}

// TestReplayEngine: the real engine client probes the replay engine and
// reads the recorded turns back exactly, on both generation routes; a
// changed prompt, a call past the recording and an unknown session get a
// 4xx naming why, and the first failure of a session is kept.
func TestReplayEngine(t *testing.T) {
	ctx := context.Background()
	for _, mode := range []engine.Mode{engine.ModeGenerate, engine.ModeCompletions} {
		t.Run(mode.String(), func(t *testing.T) {
			e, url := startReplayEngine(t)
			cl, err := engine.New(engine.Options{BaseURL: url, Mode: mode})
			require.NoError(t, err)
			caps, err := cl.Probe(ctx)
			require.NoError(t, err)
			assert.Equal(t, 1<<16, caps.MaxModelLen) // the renderer's /v1/models
			gen := func(sid string, prompt []int32) (engine.Generation, error) {
				return cl.Generate(ctx, engine.GenerateRequest{PromptIDs: prompt, SessionID: sid, Sampling: engine.SamplingParams{MaxTokens: 100}})
			}

			e.open("kiln-a", 7)
			g, err := gen("kiln-a", []int32{1, 2, 3})
			require.NoError(t, err)
			assert.Equal(t, []int32{10, 11}, g.OutputIDs)
			assert.Equal(t, []float32{-0.1, -0.2}, g.LogProbs) // the recorded float32s, bit for bit
			assert.Equal(t, "stop", g.FinishReason)
			g, err = gen("kiln-a", []int32{1, 2, 3, 10, 11, 4})
			require.NoError(t, err)
			assert.Equal(t, []int32{12}, g.OutputIDs)
			assert.Empty(t, e.failure("kiln-a"))

			// One call more than the recording holds.
			_, err = gen("kiln-a", []int32{1, 2, 3, 10, 11, 4, 12, 5})
			var he *engine.HTTPError
			require.True(t, errors.As(err, &he), "%v", err)
			assert.Equal(t, http.StatusBadRequest, he.Status)
			const past = "replay: rollout 7 turn 2 was never recorded: the recording has 2 turns of this rollout"
			assert.Contains(t, err.Error(), past)
			assert.Equal(t, past, e.failure("kiln-a"))
			// The session stays failed, even for a prompt that would match.
			_, err = gen("kiln-a", []int32{1, 2, 3})
			assert.ErrorContains(t, err, past)

			// A changed prompt.
			e.open("kiln-b", 7)
			_, err = gen("kiln-b", []int32{1, 2, 4})
			const changed = "replay: rollout 7 turn 0: prompt token 2 is 4, the recorded one 3"
			assert.ErrorContains(t, err, changed)
			assert.Equal(t, changed, e.failure("kiln-b"))
			e.drop("kiln-b")
			assert.Empty(t, e.failure("kiln-b"))

			// A session the stage did not open, or none at all.
			_, err = gen("kiln-nobody", []int32{1, 2, 3})
			assert.ErrorContains(t, err, `replay: unknown session "kiln-nobody"`)
			_, err = gen("", []int32{1, 2, 3})
			assert.ErrorContains(t, err, "without x-session-id")

			// max_tokens below the recorded output.
			e.open("kiln-c", 7)
			_, err = cl.Generate(ctx, engine.GenerateRequest{PromptIDs: []int32{1, 2, 3}, SessionID: "kiln-c", Sampling: engine.SamplingParams{MaxTokens: 1}})
			assert.ErrorContains(t, err, "replay: rollout 7 turn 0: max_tokens 1 is below the recorded output's 2 tokens")

			// Rendering and decoding are the renderer's.
			ids, err := cl.TokenizeChat(ctx, engine.ChatRequest{Messages: []json.RawMessage{json.RawMessage(`{"role":"user","content":"hi"}`)}, AddGenerationPrompt: true})
			require.NoError(t, err)
			assert.NotEmpty(t, ids)
			text, err := cl.Detokenize(ctx, ids)
			require.NoError(t, err)
			assert.Contains(t, text, "hi")
		})
	}
}

// TestReplayEngineSamplingMask: a call asking for the top-p sampling mask
// gets the recorded one; a recording without one is a failure of the
// session.
func TestReplayEngineSamplingMask(t *testing.T) {
	ctx := context.Background()
	e, url := startReplayEngine(t)
	cl, err := engine.New(engine.Options{BaseURL: url, Mode: engine.ModeGenerate})
	require.NoError(t, err)
	e.open("kiln-8", 8)
	g, err := cl.Generate(ctx, engine.GenerateRequest{PromptIDs: []int32{5}, SessionID: "kiln-8", ReturnSamplingMask: true, Sampling: engine.SamplingParams{MaxTokens: 10}})
	require.NoError(t, err)
	assert.Equal(t, []int32{6, 9}, g.TopPTokenIDs)
	assert.Equal(t, []int32{0, 2}, g.TopPTokenOffsets)

	e.open("kiln-7", 7)
	_, err = cl.Generate(ctx, engine.GenerateRequest{PromptIDs: []int32{1, 2, 3}, SessionID: "kiln-7", ReturnSamplingMask: true, Sampling: engine.SamplingParams{MaxTokens: 10}})
	assert.ErrorContains(t, err, "replay: rollout 7 turn 0: the call asks for the top-p sampling mask, which the recording does not hold")
}

// TestReplayEngineRoutes: GET goes to the renderer (health included);
// generation routes other than the two the client uses are refused, never
// forwarded.
func TestReplayEngineRoutes(t *testing.T) {
	_, url := startReplayEngine(t)
	for _, tt := range []struct {
		method, path string
		want         int
		body         string
	}{
		{http.MethodGet, "/health", http.StatusOK, ""},
		{http.MethodGet, "/version", http.StatusOK, "0.32.0"},
		{http.MethodPost, "/v1/chat/completions", http.StatusNotFound, "is not served"},
		{http.MethodPost, "/v1/responses", http.StatusNotFound, "is not served"},
	} {
		req, err := http.NewRequest(tt.method, url+tt.path, strings.NewReader(`{"messages":[{"role":"user","content":"hi"}],"max_tokens":4}`))
		require.NoError(t, err)
		resp, err := http.DefaultClient.Do(req)
		require.NoError(t, err)
		body, _ := io.ReadAll(resp.Body)
		resp.Body.Close()
		assert.Equal(t, tt.want, resp.StatusCode, "%s %s: %s", tt.method, tt.path, body)
		assert.Contains(t, string(body), tt.body, "%s %s", tt.method, tt.path)
	}
}

// TestReplayOptions: replay:// is the only engine, has a renderer and names
// a pinned recording, and the recording is part of the version id.
func TestReplayOptions(t *testing.T) {
	for _, tt := range []struct {
		engines  []string
		renderer string
		want     string
	}{
		{[]string{"http://a"}, "", ""},
		{[]string{"replay://r/turns@v1"}, "http://r", ""},
		{[]string{"http://a"}, "http://r", "no --engine is replay://REF"},
		{[]string{"replay://r/turns@v1", "http://a"}, "http://r", "must be the only engine"},
		{[]string{"replay://r/turns@v1", "replay://s/turns@v1"}, "http://r", "must be the only engine"},
		{[]string{"replay://r/turns@v1"}, "", "needs --replay-renderer URL"},
		{[]string{"replay://r/turns"}, "http://r", "pin the recording, replay://NAME/turns@VERSION"},
	} {
		err := checkReplayOptions(tt.engines, tt.renderer)
		if tt.want == "" {
			assert.NoError(t, err, "%v", tt.engines)
			continue
		}
		assert.ErrorContains(t, err, tt.want, "%v", tt.engines)
	}
	o := RunOptions{Bundles: "b", Engines: []string{"replay://r/turns@v1"}, Samples: 1, Jobs: 1, Budget: 1, SetupTimeout: 1, Temperature: 1, TopP: 1, TopK: -1}
	err := o.check()
	var ue stagecmd.UsageError
	require.True(t, errors.As(err, &ue), "%v", err)

	version := func(engines ...string) string {
		o := RunOptions{Engines: engines, Samples: 1}
		v, err := (&dataset.Identity{Stage: "rollout-run", CodeVersion: runVersion, Args: o.identityArgs()}).Version()
		require.NoError(t, err)
		return v
	}
	assert.Equal(t, version("http://a"), version("http://b"))
	assert.NotEqual(t, version("http://a"), version("replay://r/turns@v1"))
	assert.NotEqual(t, version("replay://r/turns@v1"), version("replay://r/turns@v2"))
}

// TestReplayUsage: the replay flags' mistakes are usage errors (exit 2)
// named on stderr, before any input is read.
func TestReplayUsage(t *testing.T) {
	base := []string{"run", "--store", t.TempDir(), "--bundles", t.TempDir(), "--out", "rollout/usage"}
	for _, c := range []struct {
		name string
		args []string
		want string
	}{
		{"no renderer", []string{"--engine", "replay://r/turns@v1"}, "needs --replay-renderer URL"},
		{"renderer without replay", []string{"--engine", "http://127.0.0.1:1", "--replay-renderer", "http://127.0.0.1:2"}, "no --engine is replay://REF"},
		{"mixed", []string{"--engine", "replay://r/turns@v1,http://127.0.0.1:1", "--replay-renderer", "http://127.0.0.1:2"}, "must be the only engine"},
		{"unpinned", []string{"--engine", "replay://r/turns", "--replay-renderer", "http://127.0.0.1:2"}, "pin the recording"},
	} {
		t.Run(c.name, func(t *testing.T) {
			r := stagetest.Run(t, Commands, append(append([]string(nil), base...), c.args...)...)
			assert.Equal(t, 2, r.Code, r.Stderr)
			assert.Contains(t, r.Stderr, c.want)
		})
	}
}

// TestReplayEngineHealth: the stage's health check of a replay engine is
// its renderer's, so a dead renderer fails it (its runs abort
// engine_error, docs/rollout.md §7.2).
func TestReplayEngineHealth(t *testing.T) {
	book, err := newReplayBook(replayTurns())
	require.NoError(t, err)
	renderer := httptest.NewServer(enginetest.New(enginetest.Options{Script: noGenerate(t)}))
	e, err := newReplayEngine(book, "rec/turns@v1", renderer.URL, stagecmd.NewLogger(io.Discard, false))
	require.NoError(t, err)
	url, err := e.start()
	require.NoError(t, err)
	defer e.close()
	hc := &http.Client{Timeout: 5 * time.Second}
	assert.NoError(t, checkHealth(context.Background(), hc, url, ""))
	renderer.Close()
	assert.ErrorContains(t, checkHealth(context.Background(), hc, url, ""), "HTTP 502")

	_, err = newReplayEngine(book, "rec/turns@v1", "gpu1:8000", stagecmd.NewLogger(io.Discard, false))
	assert.ErrorContains(t, err, `--replay-renderer "gpu1:8000": want the base URL of an engine`)
}
