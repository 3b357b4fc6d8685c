package rollout

import (
	"bytes"
	"context"
	"encoding/json"
	"fmt"
	"net"
	"net/http"
	"net/http/httptest"
	"strings"
	"testing"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/kilnrl/kiln/formats/dataset"
	"github.com/kilnrl/kiln/formats/records"
	"github.com/kilnrl/kiln/formats/store"
	"github.com/kilnrl/kiln/internal/agent/adapter"
	"github.com/kilnrl/kiln/internal/agent/engine"
	"github.com/kilnrl/kiln/internal/agent/enginetest"
	"github.com/kilnrl/kiln/internal/stagecmd"
)

// The standalone adapter serves clients, and on shutdown commits their
// sessions as turns and trajectories.
func TestAdapterRecordsSessions(t *testing.T) {
	eng := httptest.NewServer(enginetest.New(enginetest.Options{Script: enginetest.Sequence("hello there", "second answer")}))
	defer eng.Close()
	cl, err := engine.New(engine.Options{BaseURL: eng.URL, Mode: engine.ModeGenerate})
	require.NoError(t, err)
	_, err = cl.Probe(context.Background())
	require.NoError(t, err)
	dir := t.TempDir()
	require.NoError(t, enginetest.WriteTokenizerFiles(dir))
	special, err := engine.LoadSpecialTokens(dir)
	require.NoError(t, err)
	srv := adapter.New(adapter.Options{Engine: cl, Special: special, ToolParser: "qwen3_coder"})

	ln, err := net.Listen("tcp", "127.0.0.1:0")
	require.NoError(t, err)
	storeDir := t.TempDir()
	st, err := store.NewLocal(storeDir)
	require.NoError(t, err)
	var stdout, stderr bytes.Buffer
	env := &stagecmd.Env{Stdout: &stdout, Stderr: &stderr, Log: stagecmd.NewLogger(&stderr, false)}
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan error, 1)
	go func() { done <- serveAndRecord(ctx, ln, srv, recording{st: st, env: env, out: "rec/demo"}) }()

	url := "http://" + ln.Addr().String() + "/v1/messages"
	ask := func(session string, msgs string) map[string]any {
		body := fmt.Sprintf(`{"model":"m","max_tokens":64,"messages":%s}`, msgs)
		req, _ := http.NewRequest("POST", url, strings.NewReader(body))
		req.Header.Set("x-api-key", session)
		req.Header.Set("content-type", "application/json")
		resp, err := http.DefaultClient.Do(req)
		require.NoError(t, err)
		defer resp.Body.Close()
		var out map[string]any
		require.NoError(t, json.NewDecoder(resp.Body).Decode(&out))
		require.Equal(t, 200, resp.StatusCode, "%v", out)
		return out
	}
	first := ask("sess-a", `[{"role":"user","content":"hi"}]`)
	text := first["content"].([]any)[0].(map[string]any)["text"].(string)
	assert.Equal(t, "hello there", text)
	ask("sess-a", fmt.Sprintf(`[{"role":"user","content":"hi"},{"role":"assistant","content":%q},{"role":"user","content":"more"}]`, text))
	ask("sess-b", `[{"role":"user","content":"other"}]`)

	cancel()
	require.NoError(t, <-done, stderr.String())
	lines := strings.Split(strings.TrimSpace(stdout.String()), "\n")
	require.Len(t, lines, 2, stdout.String())
	assert.True(t, strings.HasPrefix(lines[0], "rec/demo/turns@"), lines[0])
	assert.True(t, strings.HasPrefix(lines[1], "rec/demo/trajectories@"), lines[1])

	turnsV, err := dataset.OpenString(context.Background(), st, lines[0])
	require.NoError(t, err)
	assert.Equal(t, int64(3), turnsV.Rows)
	trajV, err := dataset.OpenString(context.Background(), st, lines[1])
	require.NoError(t, err)
	assert.Equal(t, []dataset.Ref{turnsV.Ref()}, trajV.Inputs, "trajectories record the turns they came from")
	var segs []records.Trajectory
	require.NoError(t, trajV.EachShard(context.Background(), func(_ int, data []byte) error {
		return records.EachTrajectory(data, func(tr *records.Trajectory) error { segs = append(segs, *tr); return nil })
	}))
	require.Len(t, segs, 2, "one segment per session: session a's turn 2 extends turn 1 exactly")
	assert.Equal(t, int64(0), segs[0].RolloutID)
	assert.Equal(t, int64(1), segs[1].RolloutID)
	trained := 0
	for _, m := range segs[0].LossMask {
		trained += int(m)
	}
	assert.Greater(t, trained, 2)
}

// Each adapter flag lands in adapter.Options; each bad value is refused
// naming the flag.
func TestAdapterOptions(t *testing.T) {
	f64 := func(v float64) *float64 { return &v }
	i := func(v int) *int { return &v }
	base := adapterFlags{reasoningParser: "qwen3", toolParser: "qwen3_coder"}
	o, err := adapterOptions(base)
	require.NoError(t, err)
	assert.Nil(t, o.Sampling.Temperature)
	assert.Nil(t, o.ChatTemplateKwargs)
	assert.Negative(t, o.KeepAlive, "--keepalive 0: none")

	good := base
	good.maxTurnTokens, good.maxTokens, good.maxTurnsPerSession = 8192, 2048, 50
	good.temperature, good.topP, good.topK = f64(0.7), f64(0.95), i(20)
	good.chatTemplateKwargs = ` {"enable_thinking": true} `
	good.keepAlive = 20 * time.Second
	o, err = adapterOptions(good)
	require.NoError(t, err)
	assert.Equal(t, 8192, o.MaxTurnTokens)
	assert.Equal(t, 50, o.MaxTurnsPerSession)
	assert.Equal(t, 2048, o.Sampling.MaxTokens)
	assert.Equal(t, 0.7, *o.Sampling.Temperature)
	assert.Equal(t, 0.95, *o.Sampling.TopP)
	assert.Equal(t, 20, *o.Sampling.TopK)
	assert.JSONEq(t, `{"enable_thinking": true}`, string(o.ChatTemplateKwargs))
	assert.Equal(t, 20*time.Second, o.KeepAlive)

	for _, tc := range []struct {
		edit func(*adapterFlags)
		want string
	}{
		{func(f *adapterFlags) { f.maxTurnTokens = -1 }, "--max-turn-tokens -1"},
		{func(f *adapterFlags) { f.maxTokens = -5 }, "--max-tokens -5"},
		{func(f *adapterFlags) { f.maxTurnsPerSession = -2 }, "--max-turns-per-session -2"},
		{func(f *adapterFlags) { f.temperature = f64(2.5) }, "--temperature 2.5"},
		{func(f *adapterFlags) { f.topP = f64(0) }, "--top-p 0"},
		{func(f *adapterFlags) { f.topK = i(-3) }, "--top-k -3"},
		{func(f *adapterFlags) { f.chatTemplateKwargs = `[1]` }, `--chat-template-kwargs "[1]"`},
		{func(f *adapterFlags) { f.chatTemplateKwargs = `null` }, `--chat-template-kwargs "null"`},
		{func(f *adapterFlags) { f.reasoningParser = "deepseek" }, `--reasoning-parser "deepseek"`},
		{func(f *adapterFlags) { f.toolParser = "llama" }, `--tool-parser "llama"`},
		{func(f *adapterFlags) { f.keepAlive = -time.Second }, `--keepalive -1s`},
	} {
		f := base
		tc.edit(&f)
		_, err := adapterOptions(f)
		require.Error(t, err, tc.want)
		assert.Contains(t, err.Error(), tc.want)
	}
}
