package engine

import (
	"net"
	"testing"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
)

func TestProbe(t *testing.T) {
	models := reply{body: golden(t, "models.json")}
	version := reply{body: golden(t, "version.json")}
	genA := reply{body: golden(t, "generate_a.json")}
	genC := reply{body: golden(t, "generate_c.json")}
	comp := reply{body: golden(t, "completions.json")}
	no501 := reply{status: 501, body: golden(t, "error_no_generate_task_501.json")}
	for _, tc := range []struct {
		name      string
		routes    map[string]reply
		opts      Options
		route     Route
		shape     Shape
		ctxLen    int
		errWant   []string
		unavail   bool
		wantCalls map[string]int
	}{
		{name: "generate shape A, context learned", opts: Options{}, route: RouteGenerate, shape: ShapeDisagg, ctxLen: 40960,
			routes:    map[string]reply{"GET /version": version, "GET /v1/models": models, "POST /inference/v1/generate": genA},
			wantCalls: map[string]int{"/v1/completions": 0}},
		{name: "generate shape C, context from options", opts: Options{Mode: ModeGenerate, ContextLength: 4096, Model: "qwen3"}, route: RouteGenerate, shape: ShapeTokenIDs, ctxLen: 4096,
			routes: map[string]reply{"GET /version": version, "GET /v1/models": models, "POST /inference/v1/generate": genC}},
		{name: "auto falls back to completions on 404", opts: Options{}, route: RouteCompletions, ctxLen: 40960,
			routes: map[string]reply{"GET /version": version, "GET /v1/models": models, "POST /v1/completions": comp}},
		{name: "completions mode never probes generate", opts: Options{Mode: ModeCompletions}, route: RouteCompletions, ctxLen: 40960,
			routes:    map[string]reply{"GET /v1/models": models, "POST /v1/completions": comp, "POST /inference/v1/generate": genA},
			wantCalls: map[string]int{"/inference/v1/generate": 0}},
		{name: "generate mode, route missing", opts: Options{Mode: ModeGenerate}, unavail: true,
			routes: map[string]reply{"GET /version": version, "GET /v1/models": models, "POST /v1/completions": comp},
			errWant: []string{"vLLM 0.30.1", "POST /inference/v1/generate", "HTTP 404", "not registered", "--enable-scale-out", "--tokens-only",
				"VLLM_ENABLE_SCALE_OUT_ENDPOINTS=1", "--fallback completions"}},
		{name: "generate mode, model without generate task", opts: Options{Mode: ModeGenerate}, unavail: true,
			routes:  map[string]reply{"GET /v1/models": models, "POST /inference/v1/generate": no501},
			errWant: []string{"HTTP 501", "no generate task"}},
		{name: "auto, both missing", opts: Options{}, unavail: true,
			routes:  map[string]reply{"GET /v1/models": models},
			errWant: []string{"POST /v1/completions", "token-in route failed too", "--enable-scale-out"}},
		{name: "unknown model", opts: Options{Model: "llama"}, routes: map[string]reply{"GET /v1/models": models},
			errWant: []string{`does not serve model "llama"`, "qwen3, qwen3-lora"}},
		{name: "api key needed", opts: Options{}, routes: map[string]reply{"GET /v1/models": {status: 401, body: []byte(`{"error": "Unauthorized"}`)}},
			errWant: []string{"HTTP 401", "--api-key"}},
		{name: "probe reply invalid", opts: Options{Mode: ModeGenerate}, routes: map[string]reply{"GET /v1/models": models,
			"POST /inference/v1/generate": {body: []byte(`{"choices":[{"token_ids":[1],"logprobs":null}]}`)}},
			errWant: []string{"missing-logprobs"}},
	} {
		t.Run(tc.name, func(t *testing.T) {
			f := newFake(t, tc.routes)
			c := newClient(t, f.URL, tc.opts)
			caps, err := c.Probe(bg)
			if tc.errWant != nil {
				require.Error(t, err)
				for _, w := range tc.errWant {
					assert.Contains(t, err.Error(), w)
				}
				var ue *UnavailableError
				assert.Equal(t, tc.unavail, errorsAs(err, &ue))
				return
			}
			require.NoError(t, err)
			assert.Equal(t, tc.route, caps.Route)
			assert.Equal(t, tc.shape, caps.GenerateShape)
			assert.Equal(t, tc.ctxLen, caps.ContextLength)
			assert.Equal(t, tc.ctxLen, c.ContextLength())
			assert.Equal(t, []string{"qwen3"}, caps.Models)
			assert.Equal(t, []string{"qwen3-lora"}, caps.LoRAs)
			assert.Equal(t, "/models/Qwen3-8B", caps.Root)
			assert.Equal(t, 40960, caps.MaxModelLen)
			assert.Equal(t, caps, c.Capabilities())
			for p, n := range tc.wantCalls {
				assert.Equal(t, n, f.count(p), p)
			}
			if tc.route == RouteGenerate {
				got := f.last(t, "/inference/v1/generate")
				assert.Contains(t, string(got.Body), `"token_ids":[0],"sampling_params":{"max_tokens":1,"temperature":0,`)
			}
		})
	}
}

func TestAutoGenerateProbesOnce(t *testing.T) {
	f := newFake(t, map[string]reply{"GET /v1/models": {body: golden(t, "models.json")}, "POST /inference/v1/generate": {body: golden(t, "generate_a.json")}})
	c := newClient(t, f.URL, Options{})
	for range 2 {
		g, err := c.Generate(bg, GenerateRequest{PromptIDs: []int32{1, 2}, Sampling: SamplingParams{MaxTokens: 1 << 20}})
		require.NoError(t, err)
		assert.Equal(t, 40960-2, g.MaxTokens, "clamped to the learned max_model_len")
	}
	assert.Equal(t, 1, f.count("/v1/models"))
	assert.Equal(t, 3, f.count("/inference/v1/generate"), "one probe + two generations")
}

func TestProbeConnectionRefused(t *testing.T) {
	l, err := net.Listen("tcp", "127.0.0.1:0")
	require.NoError(t, err)
	addr := l.Addr().String()
	require.NoError(t, l.Close())
	c := newClient(t, "http://"+addr, Options{})
	_, err = c.Probe(bg)
	require.Error(t, err)
	assert.Contains(t, err.Error(), "no server at http://"+addr)
	assert.Contains(t, err.Error(), "connection refused")
}
