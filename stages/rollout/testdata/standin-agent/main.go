// Command standin-agent is a minimal stand-in for kiln-agent (cmd/kiln-agent)
// used by the run stage's tests until that binary lands: the same command
// line, environment, tools and exit codes.
//
//	standin-agent --base-url URL --model NAME --task-file FILE [--workdir DIR]
//	    [--max-turns N] [--timeout DURATION] [--command-timeout DURATION] [--log FILE]
//
// Exit: 0 final answer, 1 model error, 2 usage, 3 max turns, 4 timeout.
package main

import (
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"flag"
	"fmt"
	"io"
	"net/http"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"time"
)

var tools = json.RawMessage(`[
 {"type":"function","function":{"name":"bash","description":"Run a bash command in the repository.","parameters":{"type":"object","properties":{"command":{"type":"string"}},"required":["command"]}}},
 {"type":"function","function":{"name":"edit","description":"Replace old_str, which must occur exactly once, with new_str in the file at path.","parameters":{"type":"object","properties":{"path":{"type":"string"},"old_str":{"type":"string"},"new_str":{"type":"string"}},"required":["path","old_str","new_str"]}}}
]`)

type call struct {
	ID       string `json:"id"`
	Type     string `json:"type"`
	Function struct {
		Name      string `json:"name"`
		Arguments string `json:"arguments"`
	} `json:"function"`
}

type message struct {
	Role       string  `json:"role"`
	Content    *string `json:"content"`
	ToolCalls  []call  `json:"tool_calls,omitempty"`
	ToolCallID string  `json:"tool_call_id,omitempty"`
}

func str(s string) *string { return &s }

func main() { os.Exit(run()) }

func run() int {
	fs := flag.NewFlagSet("standin-agent", flag.ContinueOnError)
	base := fs.String("base-url", "", "")
	model := fs.String("model", "", "")
	taskFile := fs.String("task-file", "", "")
	workdir := fs.String("workdir", ".", "")
	maxTurns := fs.Int("max-turns", 50, "")
	timeout := fs.Duration("timeout", time.Hour, "")
	cmdTimeout := fs.Duration("command-timeout", 2*time.Minute, "")
	logFile := fs.String("log", "", "")
	if err := fs.Parse(os.Args[1:]); err != nil || *base == "" || *model == "" || *taskFile == "" {
		fmt.Fprintln(os.Stderr, "usage: standin-agent --base-url URL --model NAME --task-file FILE ...")
		return 2
	}
	task, err := os.ReadFile(*taskFile)
	if err != nil {
		fmt.Fprintln(os.Stderr, err)
		return 2
	}
	var logw io.Writer = io.Discard
	if *logFile != "" {
		f, err := os.Create(*logFile)
		if err != nil {
			fmt.Fprintln(os.Stderr, err)
			return 2
		}
		defer f.Close()
		logw = f
	}
	logEvent := func(v map[string]any) { b, _ := json.Marshal(v); logw.Write(append(b, '\n')) }
	ctx, cancel := context.WithTimeout(context.Background(), *timeout)
	defer cancel()
	msgs := []message{
		{Role: "system", Content: str("You are a coding agent. Fix the issue in the repository with the bash and edit tools, then answer without a tool call.")},
		{Role: "user", Content: str(string(task))},
	}
	for turn := 0; turn < *maxTurns; turn++ {
		body, _ := json.Marshal(map[string]any{"model": *model, "messages": msgs, "tools": tools})
		req, _ := http.NewRequestWithContext(ctx, http.MethodPost, strings.TrimRight(*base, "/")+"/chat/completions", bytes.NewReader(body))
		req.Header.Set("Content-Type", "application/json")
		req.Header.Set("Authorization", "Bearer "+os.Getenv("KILN_AGENT_API_KEY"))
		if s := os.Getenv("KILN_AGENT_SESSION"); s != "" {
			req.Header.Set("x-session-id", s)
		}
		resp, err := http.DefaultClient.Do(req)
		if err != nil {
			if ctx.Err() != nil {
				return 4
			}
			fmt.Fprintln(os.Stderr, "model call:", err)
			return 1
		}
		data, _ := io.ReadAll(resp.Body)
		resp.Body.Close()
		logEvent(map[string]any{"turn": turn, "status": resp.StatusCode, "response": json.RawMessage(orNull(data))})
		if resp.StatusCode != http.StatusOK {
			fmt.Fprintf(os.Stderr, "model call: status %d: %s\n", resp.StatusCode, data)
			return 1
		}
		var out struct {
			Choices []struct {
				Message message `json:"message"`
			} `json:"choices"`
		}
		if err := json.Unmarshal(data, &out); err != nil || len(out.Choices) == 0 {
			fmt.Fprintln(os.Stderr, "model reply:", err)
			return 1
		}
		m := out.Choices[0].Message
		m.Role = "assistant"
		msgs = append(msgs, m)
		if len(m.ToolCalls) == 0 {
			return 0
		}
		for _, c := range m.ToolCalls {
			result := runTool(ctx, c, *workdir, *cmdTimeout)
			logEvent(map[string]any{"turn": turn, "tool": c.Function.Name, "arguments": c.Function.Arguments, "result": result})
			if ctx.Err() != nil {
				return 4
			}
			msgs = append(msgs, message{Role: "tool", ToolCallID: c.ID, Content: str(result)})
		}
	}
	return 3
}

func orNull(b []byte) []byte {
	if json.Valid(b) {
		return b
	}
	q, _ := json.Marshal(string(b))
	return q
}

func runTool(ctx context.Context, c call, workdir string, limit time.Duration) string {
	var args map[string]string
	if err := json.Unmarshal([]byte(c.Function.Arguments), &args); err != nil {
		return "error: arguments are not a JSON object of strings: " + err.Error()
	}
	switch c.Function.Name {
	case "bash":
		cctx, cancel := context.WithTimeout(ctx, limit)
		defer cancel()
		cmd := exec.CommandContext(cctx, "bash", "-c", args["command"])
		cmd.Dir = workdir
		out, err := cmd.CombinedOutput()
		code := 0
		var ee *exec.ExitError
		if errors.As(err, &ee) {
			code = ee.ExitCode()
		} else if err != nil {
			return "error: " + err.Error()
		}
		return fmt.Sprintf("exit %d\n%s", code, out)
	case "edit":
		p := args["path"]
		if !filepath.IsAbs(p) {
			p = filepath.Join(workdir, p)
		}
		data, err := os.ReadFile(p)
		if err != nil {
			return "error: " + err.Error()
		}
		if n := strings.Count(string(data), args["old_str"]); n != 1 {
			return fmt.Sprintf("error: old_str occurs %d times in %s, want exactly once", n, p)
		}
		fi, _ := os.Stat(p)
		if err := os.WriteFile(p, []byte(strings.Replace(string(data), args["old_str"], args["new_str"], 1)), fi.Mode().Perm()); err != nil {
			return "error: " + err.Error()
		}
		return "edited " + p
	}
	return "error: unknown tool " + c.Function.Name
}
