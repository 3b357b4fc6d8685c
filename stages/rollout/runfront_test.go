package rollout

import (
	"fmt"
	"net/http"
	"net/http/httptest"
	"strings"
	"testing"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/kilnrl/kiln/formats/dataset"
	"github.com/kilnrl/kiln/internal/agent/adapter"
	"github.com/kilnrl/kiln/internal/agent/engine"
	"github.com/kilnrl/kiln/internal/agent/enginetest"
)

// newTestFront serves a front over n scripted engines; fail makes every
// engine's generation fail.
func newTestFront(t *testing.T, n int, fail bool) (*front, string, []*enginetest.Engine) {
	t.Helper()
	var adapters []*adapter.Server
	var engines []*enginetest.Engine
	for range n {
		script := enginetest.Sequence("hello", "again")
		if fail {
			script = func(enginetest.Request) enginetest.Output { return enginetest.Output{Err: fmt.Errorf("down")} }
		}
		eng := enginetest.New(enginetest.Options{Script: script})
		srv := httptest.NewServer(eng)
		t.Cleanup(srv.Close)
		cl, err := engine.New(engine.Options{BaseURL: srv.URL, Mode: engine.ModeGenerate})
		require.NoError(t, err)
		f := false
		adapters = append(adapters, adapter.New(adapter.Options{Engine: cl, ToolParser: "qwen3_coder", AutoOpen: &f}))
		engines = append(engines, eng)
	}
	fr := newFront(adapters)
	hs := httptest.NewServer(fr)
	t.Cleanup(hs.Close)
	return fr, hs.URL, engines
}

func chat(t *testing.T, url, token string) int {
	t.Helper()
	req, _ := http.NewRequest(http.MethodPost, url+"/v1/chat/completions", strings.NewReader(`{"messages":[{"role":"user","content":"hi"}]}`))
	req.Header.Set("Content-Type", "application/json")
	if token != "" {
		req.Header.Set("Authorization", "Bearer "+token)
	}
	resp, err := http.DefaultClient.Do(req)
	require.NoError(t, err)
	resp.Body.Close()
	return resp.StatusCode
}

// The front admits only open sessions' tokens (an unknown, missing or
// finished token is 401 and reaches no adapter), sends each session to the
// engine its id hashes to, and counts the server errors a session got,
// keeping the first one.
func TestFrontSessions(t *testing.T) {
	fr, url, engines := newTestFront(t, 3, false)
	ids := make([]string, 12)
	for i := range ids {
		ids[i] = newSessionID()
		_, err := fr.open(ids[i], adapter.SessionOptions{RolloutID: int64(i), Index: int64(i)}, nil)
		require.NoError(t, err)
	}
	cases := []struct {
		name, token string
		status      int
	}{
		{"open session", ids[0], http.StatusOK},
		{"unknown token", newSessionID(), http.StatusUnauthorized},
		{"no token", "", http.StatusUnauthorized},
		{"a prefix of a token", ids[1][:len(ids[1])-1], http.StatusUnauthorized},
	}
	for _, c := range cases {
		t.Run(c.name, func(t *testing.T) { assert.Equal(t, c.status, chat(t, url, c.token)) })
	}
	for _, id := range ids[1:] {
		require.Equal(t, http.StatusOK, chat(t, url, id))
	}
	// Every engine saw exactly the sessions that hash to it.
	for i, eng := range engines {
		for _, r := range eng.RequestsTo("/inference/v1/generate") {
			sid := r.SessionID
			assert.Equal(t, i, fr.engineFor(sid), "session %s on engine %d", sid, i)
		}
	}
	turns, err := fr.adapters[fr.engineFor(ids[0])].Finish(ids[0])
	require.NoError(t, err)
	assert.Len(t, turns, 1)
	assert.Zero(t, fr.close(ids[0]))
	assert.Equal(t, http.StatusUnauthorized, chat(t, url, ids[0]), "a finished session's token")

	// Server errors are counted per session.
	fr2, url2, _ := newTestFront(t, 1, true)
	id := newSessionID()
	_, err = fr2.open(id, adapter.SessionOptions{}, nil)
	require.NoError(t, err)
	assert.Equal(t, http.StatusInternalServerError, chat(t, url2, id))
	assert.Equal(t, http.StatusInternalServerError, chat(t, url2, id))
	errs := fr2.close(id)
	assert.Equal(t, 2, errs.n)
	// The first one's status and body, for the run's engine_error detail.
	assert.Regexp(t, `^500 \{"error":\{"message":".+`, errs.first)
	assert.LessOrEqual(t, len(errs.first), len("500 ")+maxErrorBody)
	_, _ = fr2.adapters[0].Finish(id)
}

// The version id covers what changes the runs and nothing that only says
// where they run.
func TestRunIdentity(t *testing.T) {
	base := RunOptions{Samples: 2, Agent: "shell", Budget: DefaultBudget, Temperature: 1, TopP: 1, TopK: -1}
	version := func(o RunOptions) string {
		v, err := (&dataset.Identity{Stage: "rollout-run", CodeVersion: runVersion, Args: o.identityArgs()}).Version()
		require.NoError(t, err)
		return v
	}
	same := []func(*RunOptions){
		func(o *RunOptions) { o.Engines = []string{"http://a", "http://b"} },
		func(o *RunOptions) { o.Jobs = 64 },
		func(o *RunOptions) { o.Agent = "Shell" },
		func(o *RunOptions) { o.SetupTimeout = time.Hour },
	}
	differ := []func(*RunOptions){
		func(o *RunOptions) { o.Samples = 4 },
		func(o *RunOptions) { o.Temperature = 0.7 },
		func(o *RunOptions) { o.TopP = 0.9 },
		func(o *RunOptions) { o.TopK = 20 },
		func(o *RunOptions) { o.MaxTokens = 1024 },
		func(o *RunOptions) { o.MaxContextTokens = 32768 },
		func(o *RunOptions) { o.StopTokenIDs = []int32{7} },
		func(o *RunOptions) { o.ChatTemplateKwargs = `{"reasoning_effort":"medium"}` },
		func(o *RunOptions) { o.WeightsVersion = "step-2" },
		func(o *RunOptions) { o.Budget = time.Minute },
		func(o *RunOptions) { o.Agent = "codex" },
		func(o *RunOptions) { o.Split = "train" },
		func(o *RunOptions) { o.MaxTurns = 10 },
	}
	want := version(base)
	for i, f := range same {
		o := base
		f(&o)
		assert.Equal(t, want, version(o), "same %d", i)
	}
	for i, f := range differ {
		o := base
		f(&o)
		assert.NotEqual(t, want, version(o), "differ %d", i)
	}
}
