//go:build unix

package engine_test

import (
	"context"
	"encoding/json"
	"fmt"
	"io"
	"net/http"
	"net/http/httptest"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/kilnrl/kiln/internal/agent/engine"
)

// benchReply is a newest-shape (C) generate reply of n sampled tokens,
// each with its sampled-token top entry, as vLLM writes it.
func benchReply(n int) []byte {
	var sb strings.Builder
	sb.WriteString(`{"request_id":"generate-tokens-r1","output_mode":"tokens","model":"m","created":1700000000,"choices":[{"index":0,"finish_reason":"stop","stop_reason":null,"token_ids":[`)
	ids := make([]int, n)
	for i := range ids {
		ids[i] = (i * 7919) % 151643
		if i > 0 {
			sb.WriteByte(',')
		}
		fmt.Fprint(&sb, ids[i])
	}
	sb.WriteString(`],"logprobs":{"content":[`)
	for i, id := range ids {
		if i > 0 {
			sb.WriteByte(',')
		}
		lp := -float64(i%17)*0.0731234567891 - 0.000012338161468505859
		fmt.Fprintf(&sb, `{"token_id":%d,"logprob":%v,"rank":1,"top_logprobs":[{"token_id":%d,"logprob":%v,"rank":1}]}`, id, lp, id, lp)
	}
	fmt.Fprintf(&sb, `]},"routed_experts":null,"sampling_mask":null}],"usage":{"prompt_tokens":4000,"total_tokens":%d,"completion_tokens":%d,"prompt_tokens_details":null},"prompt_token_ids":null}`, 4000+n, n)
	return []byte(sb.String())
}

// cpuTime is the process's user+system CPU time so far.
func cpuTime(b *testing.B) time.Duration {
	var ru syscall.Rusage
	if err := syscall.Getrusage(syscall.RUSAGE_SELF, &ru); err != nil {
		b.Fatal(err)
	}
	return time.Duration(ru.Utime.Nano() + ru.Stime.Nano())
}

// benchServer answers every route with a canned body; the handler only
// reads the request and writes the reply, so the process's CPU is mostly
// the client's.
func benchServer(b *testing.B, routes map[string][]byte) *httptest.Server {
	srv := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		_, _ = io.Copy(io.Discard, r.Body)
		body, ok := routes[r.URL.Path]
		if !ok {
			http.NotFound(w, r)
			return
		}
		w.Header().Set("Content-Type", "application/json")
		_, _ = w.Write(body)
	}))
	b.Cleanup(srv.Close)
	return srv
}

// BenchmarkGenerateCall is one Client.Generate over loopback: a 4,000-id
// prompt, a 148-token reply. cpu-µs/op is the whole process's CPU (client
// and the trivial server) per call.
func BenchmarkGenerateCall(b *testing.B) {
	srv := benchServer(b, map[string][]byte{"/inference/v1/generate": benchReply(148)})
	c, err := engine.New(engine.Options{BaseURL: srv.URL, Mode: engine.ModeGenerate, ContextLength: 65536})
	if err != nil {
		b.Fatal(err)
	}
	prompt := make([]int32, 4000)
	for i := range prompt {
		prompt[i] = int32((i * 104729) % 151643)
	}
	one := 1.0
	req := engine.GenerateRequest{PromptIDs: prompt, SessionID: "s1", Sampling: engine.SamplingParams{MaxTokens: 4096, Temperature: &one}}
	ctx := context.Background()
	b.ReportAllocs()
	start := cpuTime(b)
	for b.Loop() {
		g, err := c.Generate(ctx, req)
		if err != nil || len(g.OutputIDs) != 148 {
			b.Fatal(err)
		}
	}
	b.ReportMetric(float64((cpuTime(b)-start).Microseconds())/float64(b.N), "cpu-µs/op")
}

// BenchmarkTurnCalls is an adapter turn's engine calls over loopback, one
// session's Memo across them: two chat renders (4,000 ids each), a
// generation over the first, a decode of the output.
func BenchmarkTurnCalls(b *testing.B) {
	ids := make([]int32, 4000)
	for i := range ids {
		ids[i] = int32((i * 104729) % 151643)
	}
	tokens, _ := json.Marshal(ids)
	srv := benchServer(b, map[string][]byte{
		"/inference/v1/generate": benchReply(148),
		"/tokenize":              []byte(fmt.Sprintf(`{"count":4000,"max_model_len":65536,"tokens":%s,"token_strs":null}`, tokens)),
		"/detokenize":            []byte(`{"prompt":"Inspect the tree first.\n</think>\n\n<tool_call>\n{\"name\":\"lookup\"}\n</tool_call>"}`),
	})
	c, err := engine.New(engine.Options{BaseURL: srv.URL, Mode: engine.ModeGenerate, ContextLength: 65536})
	if err != nil {
		b.Fatal(err)
	}
	msgs := []json.RawMessage{json.RawMessage(`{"role":"system","content":"You are a coding agent."}`),
		json.RawMessage(`{"role":"user","content":"` + strings.Repeat("Fix the build. ", 400) + `"}`)}
	var memo engine.Memo
	one := 1.0
	ctx := context.Background()
	b.ReportAllocs()
	start := cpuTime(b)
	for b.Loop() {
		prompt, err := c.TokenizeChat(ctx, engine.ChatRequest{Messages: msgs, AddGenerationPrompt: true, Memo: &memo})
		if err != nil {
			b.Fatal(err)
		}
		if _, err := c.TokenizeChat(ctx, engine.ChatRequest{Messages: msgs, Memo: &memo}); err != nil {
			b.Fatal(err)
		}
		g, err := c.Generate(ctx, engine.GenerateRequest{PromptIDs: prompt, Memo: &memo, SessionID: "s1",
			Sampling: engine.SamplingParams{MaxTokens: 4096, Temperature: &one}})
		if err != nil {
			b.Fatal(err)
		}
		if _, err := c.Detokenize(ctx, g.OutputIDs); err != nil {
			b.Fatal(err)
		}
	}
	b.ReportMetric(float64((cpuTime(b)-start).Microseconds())/float64(b.N), "cpu-µs/op")
}
