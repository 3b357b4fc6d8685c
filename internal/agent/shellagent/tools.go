package shellagent

import (
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io/fs"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"syscall"
	"time"
)

// toolSchemas are the two functions offered to the model, in the order the
// model sees them. Their shapes are the contract of docs in doc.go.
func toolSchemas() []any {
	str := func(desc string) map[string]any { return map[string]any{"type": "string", "description": desc} }
	return []any{
		map[string]any{"type": "function", "function": map[string]any{
			"name":        "bash",
			"description": "Run a shell command (/bin/sh -c) in the working directory and return its combined stdout and stderr and its exit code. Each call is a fresh shell: cd and variables do not persist. Commands are killed when they run too long; do not start interactive programs.",
			"parameters": map[string]any{"type": "object", "properties": map[string]any{
				"command": str("The shell command to run."),
			}, "required": []any{"command"}},
		}},
		map[string]any{"type": "function", "function": map[string]any{
			"name":        "edit",
			"description": "Edit a file: replace the one occurrence of old_str with new_str (old_str must occur exactly once). With an empty old_str, create the file with new_str as its content (it must not exist yet). Paths are relative to the working directory.",
			"parameters": map[string]any{"type": "object", "properties": map[string]any{
				"path":    str("The file to edit or create."),
				"old_str": str("The exact text to replace (empty to create the file)."),
				"new_str": str("The replacement text (the new file's content when creating)."),
			}, "required": []any{"path", "old_str", "new_str"}},
		}},
	}
}

// toolResult is what one tool call gave: the text sent back to the model and
// what the transcript records beside it.
type toolResult struct {
	Output    string `json:"output"`
	ExitCode  *int   `json:"exit_code,omitempty"` // bash only, absent when killed
	TimedOut  bool   `json:"timed_out,omitempty"`
	Truncated bool   `json:"truncated,omitempty"`
	Error     string `json:"error,omitempty"` // the call itself failed (bad name, arguments, edit)
}

// tools runs tool calls for one run.
type tools struct {
	workdir        string
	commandTimeout time.Duration
	maxOutput      int
	env            []string // the commands' environment; nil: this process's
}

// commandEnv is environ without kiln-agent's own KILN_AGENT_* variables:
// they are for the agent (its API key, its session), not for the task's
// commands.
func commandEnv(environ []string) []string {
	out := make([]string, 0, len(environ))
	for _, kv := range environ {
		if !strings.HasPrefix(kv, "KILN_AGENT_") {
			out = append(out, kv)
		}
	}
	return out
}

// call runs one tool call. It never fails: every problem (unknown tool, bad
// arguments, a failed edit, a command that cannot start) is an error result
// for the model to read.
func (t *tools) call(ctx context.Context, name string, args json.RawMessage) toolResult {
	fields, err := decodeArgs(args)
	if err != nil {
		return errResult("%s: invalid arguments: %v; arguments must be a JSON object", name, err)
	}
	switch name {
	case "bash":
		cmd, ok := fields["command"].(string)
		if !ok || strings.TrimSpace(cmd) == "" {
			return errResult("bash: the argument \"command\" (a non-empty string) is required")
		}
		return t.bash(ctx, cmd)
	case "edit":
		var s [3]string
		for i, k := range []string{"path", "old_str", "new_str"} {
			v, ok := fields[k].(string)
			if !ok {
				return errResult("edit: the argument %q (a string) is required", k)
			}
			s[i] = v
		}
		return t.edit(s[0], s[1], s[2])
	}
	return errResult("unknown tool %q; the tools are bash and edit", name)
}

func errResult(format string, a ...any) toolResult {
	msg := fmt.Sprintf(format, a...)
	return toolResult{Output: "error: " + msg, Error: msg}
}

// decodeArgs reads a call's arguments: a JSON string holding an object (the
// OpenAI wire form), or an object given directly.
func decodeArgs(raw json.RawMessage) (map[string]any, error) {
	raw = bytes.TrimSpace(raw)
	if len(raw) > 0 && raw[0] == '"' {
		var s string
		if err := json.Unmarshal(raw, &s); err != nil {
			return nil, err
		}
		raw = []byte(strings.TrimSpace(s))
		if len(raw) == 0 {
			return map[string]any{}, nil
		}
	}
	if len(raw) == 0 || string(raw) == "null" {
		return map[string]any{}, nil
	}
	var m map[string]any
	if err := json.Unmarshal(raw, &m); err != nil {
		return nil, err
	}
	if m == nil {
		return map[string]any{}, nil
	}
	return m, nil
}

// bash runs command with /bin/sh -c (an image may have no bash) in the
// workdir, stdin from /dev/null, stdout and stderr combined, in its own
// process group, with t.env. At the per-command timeout, or when the run's context ends,
// the whole group is killed; background processes of a command that exited
// on its own are left running (the agent may have started a server), and
// their hold on the output pipe is cut after waitDelay.
func (t *tools) bash(ctx context.Context, command string) toolResult {
	cctx, cancel := context.WithTimeout(ctx, t.commandTimeout)
	defer cancel()
	out := newCapWriter(t.maxOutput)
	cmd := exec.CommandContext(cctx, "/bin/sh", "-c", command)
	cmd.Dir = t.workdir
	cmd.Env = t.env
	cmd.Stdout, cmd.Stderr = out, out
	cmd.SysProcAttr = &syscall.SysProcAttr{Setpgid: true}
	cmd.Cancel = func() error { return syscall.Kill(-cmd.Process.Pid, syscall.SIGKILL) }
	cmd.WaitDelay = waitDelay
	err := cmd.Run()
	var res toolResult
	switch {
	case err != nil && cctx.Err() != nil && !exitedAlone(cmd):
		res.TimedOut = true
	case cmd.ProcessState != nil:
		code := cmd.ProcessState.ExitCode()
		if ws, ok := cmd.ProcessState.Sys().(syscall.WaitStatus); ok && ws.Signaled() {
			code = 128 + int(ws.Signal()) // as shells report it
		}
		res.ExitCode = &code
	default:
		return errResult("bash: cannot run /bin/sh: %v", err)
	}
	text, truncated := out.String()
	res.Truncated = truncated
	switch {
	case res.TimedOut && errors.Is(ctx.Err(), context.DeadlineExceeded):
		res.Output = withNote(text, "[killed: the run's time budget is spent]")
	case res.TimedOut && ctx.Err() != nil:
		res.Output = withNote(text, "[killed: the run was interrupted]")
	case res.TimedOut:
		res.Output = withNote(text, fmt.Sprintf("[killed: the command ran past its %s timeout]", t.commandTimeout))
	default:
		res.Output = withNote(text, fmt.Sprintf("[exit code %d]", *res.ExitCode))
	}
	return res
}

// withNote puts note on a line of its own after text.
func withNote(text, note string) string {
	if text != "" && !strings.HasSuffix(text, "\n") {
		text += "\n"
	}
	return text + note
}

// waitDelay is how long a finished or killed command's output pipe may stay
// open (held by a background process) before it is closed.
const waitDelay = time.Second

// exitedAlone tells whether the process exited by itself (not by our kill).
func exitedAlone(cmd *exec.Cmd) bool {
	ps := cmd.ProcessState
	if ps == nil {
		return false
	}
	ws, ok := ps.Sys().(syscall.WaitStatus)
	return ok && !(ws.Signaled() && ws.Signal() == syscall.SIGKILL)
}

// edit replaces the single occurrence of oldStr in path with newStr, or
// creates path with newStr when oldStr is empty and path does not exist.
func (t *tools) edit(path, oldStr, newStr string) toolResult {
	if path == "" {
		return errResult("edit: the argument \"path\" is empty")
	}
	full := path
	if !filepath.IsAbs(full) {
		full = filepath.Join(t.workdir, path)
	}
	if oldStr == "" {
		if _, err := os.Lstat(full); err == nil {
			return errResult("edit %s: the file exists; give old_str to edit it", path)
		} else if !errors.Is(err, fs.ErrNotExist) {
			return errResult("edit %s: %v", path, err)
		}
		if err := os.MkdirAll(filepath.Dir(full), 0o755); err != nil {
			return errResult("edit %s: %v", path, err)
		}
		if err := os.WriteFile(full, []byte(newStr), 0o644); err != nil {
			return errResult("edit %s: %v", path, err)
		}
		return toolResult{Output: fmt.Sprintf("created %s (%d bytes)", path, len(newStr))}
	}
	st, err := os.Stat(full)
	if err != nil {
		return errResult("edit %s: %v", path, err)
	}
	b, err := os.ReadFile(full)
	if err != nil {
		return errResult("edit %s: %v", path, err)
	}
	switch n := strings.Count(string(b), oldStr); n {
	case 0:
		return errResult("edit %s: old_str does not occur in the file", path)
	case 1:
	default:
		return errResult("edit %s: old_str occurs %d times; include more context to make it unique", path, n)
	}
	nb := strings.Replace(string(b), oldStr, newStr, 1)
	if err := os.WriteFile(full, []byte(nb), st.Mode().Perm()); err != nil {
		return errResult("edit %s: %v", path, err)
	}
	return toolResult{Output: fmt.Sprintf("edited %s: replaced 1 occurrence", path)}
}

// capWriter keeps at most limit bytes of what is written: the head and the
// tail, with the count of what fell between.
type capWriter struct {
	headCap, tailCap int
	head, tail       []byte
	total            int64
}

func newCapWriter(limit int) *capWriter {
	if limit < 2 {
		limit = 2
	}
	return &capWriter{headCap: limit - limit/2, tailCap: limit / 2}
}

func (w *capWriter) Write(p []byte) (int, error) {
	n := len(p)
	w.total += int64(n)
	if room := w.headCap - len(w.head); room > 0 {
		k := min(room, len(p))
		w.head = append(w.head, p[:k]...)
		p = p[k:]
	}
	w.tail = append(w.tail, p...)
	if len(w.tail) > 2*w.tailCap {
		w.tail = append(w.tail[:0], w.tail[len(w.tail)-w.tailCap:]...)
	}
	return n, nil
}

// String returns the kept output, with a note where bytes were dropped, and
// whether any were.
func (w *capWriter) String() (string, bool) {
	tail := w.tail
	if len(tail) > w.tailCap {
		tail = tail[len(tail)-w.tailCap:]
	}
	dropped := w.total - int64(len(w.head)) - int64(len(tail))
	if dropped <= 0 {
		return string(w.head) + string(tail), false
	}
	return fmt.Sprintf("%s\n[... %d bytes of output omitted: a tool result keeps at most %d bytes, its head and its tail ...]\n%s",
		w.head, dropped, w.headCap+w.tailCap, tail), true
}
