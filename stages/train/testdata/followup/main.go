// followup is the client of TestOnPolicyIdentity's multi-turn case: a
// client that keeps the conversation going however the model answers. It
// takes kiln-agent's command line (the shell harness runs it in place of
// kiln-agent), asks the task over Anthropic Messages, then --max-turns − 1
// times echoes the assistant's content blocks exactly as received
// (thinking included) and adds a follow-up as a tool_result, so each prompt
// extends the last prompt and output: the adapter reuses the recorded
// tokens (docs/adapter.md §3) and assembly merges the turns into one
// segment with several sampled spans (docs/assembly.md). The random tiny
// model never calls a tool, so kiln-agent would stop after one turn.
//
// Why these choices (docs/adapter.md §3): Chat Completions does not carry
// the reasoning back, and Qwen3's chat template drops the reasoning of an
// assistant message once a user message follows it, so either would change
// the rendered history and end reuse; a tool result is not a user query to
// the template.
//
// Built static (CGO_ENABLED=0) by the test; not part of any release.
package main

import (
	"bytes"
	"encoding/json"
	"flag"
	"fmt"
	"io"
	"net/http"
	"os"
	"time"
)

func main() {
	fs := flag.NewFlagSet("followup", flag.ExitOnError)
	base := fs.String("base-url", "", "the API base, ending in /v1")
	model := fs.String("model", "", "")
	taskFile := fs.String("task-file", "", "")
	fs.String("workdir", "", "unused")
	turns := fs.Int("max-turns", 3, "model calls")
	fs.Duration("timeout", 0, "unused")
	fs.Duration("command-timeout", 0, "unused")
	fs.String("log", "", "unused")
	_ = fs.Parse(os.Args[1:])
	task, err := os.ReadFile(*taskFile)
	if err != nil {
		fail("task file: %v", err)
	}
	key := os.Getenv("KILN_AGENT_API_KEY")
	msgs := []any{map[string]any{"role": "user", "content": string(task)}}
	hc := &http.Client{Timeout: 5 * time.Minute}
	for turn := 0; turn < *turns; turn++ {
		if turn > 0 {
			msgs = append(msgs, map[string]any{"role": "user", "content": []any{map[string]any{
				"type": "tool_result", "tool_use_id": fmt.Sprintf("toolu_%d", turn), "content": fmt.Sprintf("Go on (%d).", turn)}}})
		}
		body, err := json.Marshal(map[string]any{"model": *model, "max_tokens": 4096, "messages": msgs,
			"system": "You are a helpful assistant."})
		if err != nil {
			fail("encode: %v", err)
		}
		req, err := http.NewRequest(http.MethodPost, *base+"/messages", bytes.NewReader(body))
		if err != nil {
			fail("request: %v", err)
		}
		req.Header.Set("Content-Type", "application/json")
		req.Header.Set("Authorization", "Bearer "+key)
		resp, err := hc.Do(req)
		if err != nil {
			fail("turn %d: %v", turn, err)
		}
		data, err := io.ReadAll(resp.Body)
		resp.Body.Close()
		if err != nil || resp.StatusCode != http.StatusOK {
			fail("turn %d: HTTP %d: %v %s", turn, resp.StatusCode, err, data)
		}
		var reply struct {
			Content    json.RawMessage `json:"content"`
			StopReason string          `json:"stop_reason"`
		}
		if err := json.Unmarshal(data, &reply); err != nil || len(reply.Content) == 0 {
			fail("turn %d: reply %s: %v", turn, data, err)
		}
		if reply.StopReason != "end_turn" {
			fail("turn %d: stop_reason %q, not end_turn: the adapter reuses only turns that ended (docs/adapter.md §3)", turn, reply.StopReason)
		}
		// the content blocks as received, thinking included
		msgs = append(msgs, map[string]any{"role": "assistant", "content": reply.Content})
	}
	fmt.Println("done")
}

func fail(format string, a ...any) {
	fmt.Fprintf(os.Stderr, "followup: "+format+"\n", a...)
	os.Exit(1)
}
