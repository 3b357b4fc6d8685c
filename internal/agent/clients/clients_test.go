package clients

import (
	"fmt"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/kilnrl/kiln/formats/records"
	"github.com/kilnrl/kiln/internal/agent/adapter"
	"github.com/kilnrl/kiln/internal/agent/enginetest"
)

// The scripted turn 1 of both CLIs: some text, then one shell tool call in
// the qwen3_coder format the adapter parses. The blank lines between text
// and call are not what the chat template renders (it joins them with one
// "\n"), so a canonical re-render of turn 1 differs from the sampled ids:
// only prefix reuse makes turn 2 begin with turn 1's prompt+output.
func toolCallText(tool, param, command string, reasoning bool) string {
	think := ""
	if reasoning {
		think = "<think>\nThe user wants old replaced by new; sed does it.\n</think>\n\n"
	}
	return think + "Editing the file.\n\n\n<tool_call>\n<function=" + tool + ">\n<parameter=" + param + ">\n" +
		command + "\n</parameter>\n</function>\n</tool_call>"
}

const (
	editCommand     = "sed -i 's/old/new/' file.txt"
	overflowCommand = "sed -i 's/old/new/' file.txt && seq 1 2000"
	finalText       = "Done: file.txt now says new value."
	taskPrompt      = taskMarker + ": in file.txt replace the word old with new, using the shell."
	// overflowSlack is what turn 1 may grow by between the edit run (where
	// its prompt length is measured) and the overflow run (temp paths).
	overflowSlack = 300
)

// cli describes how one CLI is run against the adapter.
type cli struct {
	name      string // binary in node_modules/.bin
	tool      string // its shell tool
	param     string // the tool's command parameter
	turnPath  string // the adapter route it uses
	setup     func(t *testing.T, home, adapterURL, session string) []string
	args      []string
	eventsKey string // a string its stdout shows when a tool ran
	// keepAlive begins the adapter's keep-alive frame in its protocol.
	keepAlive string
	// timeout makes the CLI set up in home give up on a model call after d
	// of silence (its own setting for that), returning environment to add.
	timeout func(t *testing.T, home string, d time.Duration) []string
}

var claudeCode = cli{
	name: "claude", tool: "Bash", param: "command", turnPath: "/v1/messages",
	// docs/adapter.md §7.3, docs/clients-wire.md.
	args: []string{"-p", taskPrompt, "--permission-mode", "bypassPermissions",
		"--output-format", "stream-json", "--verbose", "--max-turns", "6",
		"--tools", "Bash,Read,Edit", "--disable-slash-commands"},
	setup: func(t *testing.T, home, url, session string) []string {
		cfg := []byte(`{"hasCompletedOnboarding":true,"bypassPermissionsModeAccepted":true}`)
		require.NoError(t, os.MkdirAll(filepath.Join(home, ".claude"), 0o755))
		require.NoError(t, os.WriteFile(filepath.Join(home, ".claude.json"), cfg, 0o644))
		require.NoError(t, os.WriteFile(filepath.Join(home, ".claude", "settings.json"), cfg, 0o644))
		return append(baseEnv(home),
			"ANTHROPIC_BASE_URL="+url,
			"ANTHROPIC_AUTH_TOKEN="+session,
			"ANTHROPIC_MODEL=kiln-actor",
			"ANTHROPIC_SMALL_FAST_MODEL=kiln-actor",
			"ANTHROPIC_DEFAULT_HAIKU_MODEL=kiln-actor",
			"CLAUDE_CODE_DISABLE_NONESSENTIAL_TRAFFIC=1",
			"CLAUDE_CODE_DISABLE_EXPERIMENTAL_BETAS=1",
			"CLAUDE_CODE_ATTRIBUTION_HEADER=0",
			"DISABLE_AUTOUPDATER=1",
			"DISABLE_TELEMETRY=1",
			"DISABLE_ERROR_REPORTING=1",
			"IS_SANDBOX=1", // bypass mode as root
		)
	},
	eventsKey: `"tool_result"`,
	keepAlive: "event: ping\n",
	// The request timeout runs until the response head (600 s by default),
	// then the SDK retries from scratch, up to ten times.
	timeout: func(t *testing.T, home string, d time.Duration) []string {
		return []string{fmt.Sprintf("API_TIMEOUT_MS=%d", d.Milliseconds())}
	},
}

var codex = cli{
	name: "codex", tool: "exec_command", param: "cmd", turnPath: "/v1/responses",
	// docs/adapter.md §7.4, docs/clients-wire.md.
	args: []string{"exec", "--skip-git-repo-check", "--dangerously-bypass-approvals-and-sandbox", "--json", taskPrompt},
	setup: func(t *testing.T, home, url, session string) []string {
		codexHome := filepath.Join(home, ".codex")
		require.NoError(t, os.MkdirAll(codexHome, 0o755))
		cfg := `model = "kiln-actor"
model_provider = "kiln"
web_search = "disabled"
model_reasoning_effort = "medium"
check_for_update_on_startup = false

[model_providers.kiln]
name = "kiln"
base_url = "` + url + `/v1"
env_key = "OPENAI_API_KEY"
wire_api = "responses"
requires_openai_auth = false
supports_websockets = false

[features]
multi_agent = false
goals = false

[analytics]
enabled = false
`
		require.NoError(t, os.WriteFile(filepath.Join(codexHome, "config.toml"), []byte(cfg), 0o644))
		return append(baseEnv(home),
			"CODEX_HOME="+codexHome,
			"OPENAI_API_KEY="+session,
			"OPENAI_BASE_URL="+url+"/v1",
		)
	},
	eventsKey: `"command_execution"`,
	keepAlive: "event: response.in_progress\n",
	// The stream idle timeout (300 s by default) runs between SSE events
	// once the response head has come; no retries, so that one fails the run.
	timeout: func(t *testing.T, home string, d time.Duration) []string {
		path := filepath.Join(home, ".codex", "config.toml")
		cfg, err := os.ReadFile(path)
		require.NoError(t, err)
		provider := "[model_providers.kiln]\n"
		require.Contains(t, string(cfg), provider)
		cfg = []byte(strings.Replace(string(cfg), provider, provider+fmt.Sprintf(
			"stream_idle_timeout_ms = %d\nstream_max_retries = 0\nrequest_max_retries = 0\n", d.Milliseconds()), 1))
		require.NoError(t, os.WriteFile(path, cfg, 0o644))
		return nil
	},
	// Codex gets the reasoning back through kiln's reasoning item handle
	// (protocol.reasoningHandle), which it echoes verbatim, so the Qwen3
	// template renders turn 1 as sampled and turn 2 reuses its ids.
}

func TestClaudeCode(t *testing.T) { testCLI(t, claudeCode) }
func TestCodex(t *testing.T)      { testCLI(t, codex) }

// runEdit runs the CLI on the edit task against h (moreEnv, when not nil,
// adds to the CLI's environment and may change its configuration in
// home) and checks what every such run must show: the CLI exits 0, the
// file was edited by the CLI's own tool execution, the adapter failed
// wantFailed turn requests and recorded every turn it answered. It returns
// the recorded turns.
func runEdit(t *testing.T, c cli, bin string, h *harness, session string, moreEnv func(home string) []string, wantFailed int) []records.Turn {
	t.Helper()
	repo := tempRepo(t)
	home := t.TempDir()
	env := c.setup(t, home, h.url, session)
	if moreEnv != nil {
		env = append(env, moreEnv(home)...)
	}
	res, turns := runAndFinish(t, c, bin, h, repo, session, env)
	t.Logf("adapter recorded %d turn(s) for session %s", len(turns), session)

	require.False(t, res.TimedOut, "CLI timed out")
	assert.Equal(t, 0, res.ExitCode, "CLI exit code")
	data, err := os.ReadFile(filepath.Join(repo, "file.txt"))
	require.NoError(t, err)
	assert.Equal(t, "new value\n", string(data), "file.txt after the run")
	assert.Contains(t, res.Stdout, c.eventsKey, "the CLI's output shows its tool ran")
	ok, failed := h.turnRequests(c.turnPath)
	assert.Equal(t, wantFailed, failed, "failed turn requests")
	assert.Equal(t, ok, len(turns), "recorded turns vs answered %s requests", c.turnPath)
	return turns
}

// runAndFinish runs the CLI in repo with env, logs what it and the
// adapter said, and finishes the session: its recorded turns.
func runAndFinish(t *testing.T, c cli, bin string, h *harness, repo, session string, env []string) (runResult, []records.Turn) {
	t.Helper()
	res := runCLI(t, bin, repo, env, c.args)
	h.logWire(t)
	t.Logf("stdout:\n%s", trunc(res.Stdout, 6000))
	t.Logf("stderr:\n%s", trunc(res.Stderr, 3000))
	turns, err := h.srv.Finish(session)
	require.NoError(t, err)
	return res, turns
}

func testCLI(t *testing.T, c cli) {
	bin := findCLI(t, c.name)
	var turn1Prompt int
	t.Run("edit", func(t *testing.T) {
		h := newHarness(t, taskScript(toolCallText(c.tool, c.param, editCommand, true), finalText, true), true)
		turns := runEdit(t, c, bin, h, "sess-"+c.name+"-edit", nil, 0)
		require.GreaterOrEqual(t, len(turns), 2)
		assert.Contains(t, turns[1].PromptMessages, `"role":"tool"`, "turn 2 carries the tool result")
		for i, tr := range turns {
			t.Logf("turn %d: prompt %d ids, output %d ids, finish %s, messages %dB", i, len(tr.PromptIDs), len(tr.OutputIDs), tr.FinishReason, len(tr.PromptMessages))
		}
		// 4. Turn 2 reuses turn 1's ids exactly.
		if !checkReuse(t, turns) {
			t.Logf("divergence:\n%s", divergence(h, turns))
			t.Logf("turn 1 response message: %s", *turns[0].ResponseMessage)
			if len(turns[1].PromptMessages) > 0 {
				t.Logf("turn 2 prompt messages (tail): %s", trunc(turns[1].PromptMessages[max(0, len(turns[1].PromptMessages)-3000):], 3000))
			}
		}
		turn1Prompt = len(turns[0].PromptIDs)
	})

	// A generation longer than the CLI's timeout for a silent model call
	// (scaled down: 6 s against 2.5 s, keep-alives every second) still
	// completes the run, each turn once: the adapter keeps Claude Code's
	// stream alive with ping events (its request timeout ends at the
	// response head) and Codex's with response.in_progress events (its idle
	// timeout starts at the head and only an event resets it: SSE comments
	// were seen to fail this).
	t.Run("slow generation", func(t *testing.T) {
		const latency, clientTimeout = 6 * time.Second, 2500 * time.Millisecond
		h := newHarness(t, taskScript(toolCallText(c.tool, c.param, editCommand, true), finalText, true), true,
			slowness{latency: latency, keepAlive: time.Second})
		turns := runEdit(t, c, bin, h, "sess-"+c.name+"-slow", func(home string) []string {
			return c.timeout(t, home, clientTimeout)
		}, 0)
		assert.Len(t, turns, 2, "each turn asked once")
		for _, r := range h.requests() {
			if r.Path == c.turnPath {
				assert.Contains(t, string(r.Resp), c.keepAlive, "the turn was kept alive")
			}
		}
	})

	// An engine failure after the keep-alives began ends the stream with the
	// protocol's error event; each CLI asks again and completes the run
	// (Claude Code retries on the error event, Codex reconnects when the
	// stream ends without response.completed), and the failed attempt is
	// not recorded.
	t.Run("failure after keep-alive", func(t *testing.T) {
		h := newHarness(t, taskScript(toolCallText(c.tool, c.param, editCommand, true), finalText, true), true,
			slowness{latency: 2500 * time.Millisecond, keepAlive: 500 * time.Millisecond})
		h.eng.InjectFault(enginetest.FaultServerError)
		turns := runEdit(t, c, bin, h, "sess-"+c.name+"-fault", nil, 1)
		assert.Len(t, turns, 2)
	})

	t.Run("overflow", func(t *testing.T) {
		if turn1Prompt == 0 {
			t.Skip("needs the turn-1 prompt length measured by the edit subtest")
		}
		call := toolCallText(c.tool, c.param, overflowCommand, true)
		h := newHarness(t, taskScript(call, finalText, true), true)
		repo := tempRepo(t)
		session := "sess-" + c.name + "-overflow"
		// Turn 1 (prompt + the scripted call) fits; turn 2, which adds the
		// ~9 kB output of seq, does not. Byte-level tokenizer: at most one id
		// a byte, plus the end token.
		limit := turn1Prompt + len(call) + 1 + overflowSlack
		require.NoError(t, h.srv.Open(session, adapter.SessionOptions{MaxContextTokens: limit}))
		env := c.setup(t, t.TempDir(), h.url, session)
		res, turns := runAndFinish(t, c, bin, h, repo, session, env)
		ok, failed := h.turnRequests(c.turnPath)
		t.Logf("context limit %d ids; turn requests: %d answered, %d refused; %d turn(s) recorded", limit, ok, failed, len(turns))
		for i, tr := range turns {
			t.Logf("turn %d: prompt %d ids, output %d ids, finish %s", i, len(tr.PromptIDs), len(tr.OutputIDs), tr.FinishReason)
		}
		other, compaction := 0, 0
		for _, r := range h.requests() {
			if r.Path != c.turnPath && r.Method == "POST" {
				other++
			}
			// Claude Code's compaction prompt and truncation marker; Codex's
			// local compaction prompt.
			b := string(r.Body)
			if strings.Contains(b, "CRITICAL: Respond with TEXT ONLY") || strings.Contains(b, "truncated for compaction retry") ||
				strings.Contains(strings.ToLower(b), "context checkpoint compaction") {
				compaction++
			}
		}
		data, _ := os.ReadFile(filepath.Join(repo, "file.txt"))
		behaviour := "stopped after the overflow, no compaction"
		switch {
		case compaction > 0 && ok > 1:
			behaviour = fmt.Sprintf("compacted and continued (%d compaction request(s))", compaction)
		case compaction > 0:
			behaviour = fmt.Sprintf("tried to compact (%d compaction request(s), all overflowed), then stopped", compaction)
		case ok > 1 || other > 0:
			behaviour = "continued with other requests"
		case failed > 1:
			behaviour = "retried the overflowing request, then stopped"
		}
		t.Logf("OVERFLOW BEHAVIOUR %s: exit %d, timed out %v, %s, elapsed %s, file now %q, stdout mentions overflow: %v",
			c.name, res.ExitCode, res.TimedOut, behaviour, res.Elapsed.Round(time.Millisecond), strings.TrimSpace(string(data)),
			strings.Contains(strings.ToLower(res.Stdout+res.Stderr), "too long") || strings.Contains(strings.ToLower(res.Stdout+res.Stderr), "context"))
		require.False(t, res.TimedOut, "the CLI must end within %s after a context overflow", cliTimeout)
		assert.GreaterOrEqual(t, failed, 1, "turn 2 should have overflowed")
	})
}
