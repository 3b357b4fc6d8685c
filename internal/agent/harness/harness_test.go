package harness

import (
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/kilnrl/kiln/internal/sandbox"
)

// The shell harness binds kiln-agent read-only and passes the token only
// through the environment.
func TestShellHarnessCommand(t *testing.T) {
	h := &Shell{Binary: "/opt/kiln/bin/kiln-agent", MaxTurns: 7, CommandTimeout: time.Minute}
	spec := RunSpec{SessionID: "kiln-secret", BaseURL: "http://127.0.0.1:18080", Model: "m", Workdir: "/testbed",
		TaskFile: "/testbed/PROBLEM_STATEMENT.md", Budget: 20 * time.Minute, LogFile: "/testbed/.harness/agent.jsonl"}
	argv, env := h.Command(spec)
	assert.Equal(t, []string{ShellAgentPath, "--base-url", "http://127.0.0.1:18080/v1", "--model", "m",
		"--task-file", "/testbed/PROBLEM_STATEMENT.md", "--workdir", "/testbed", "--max-turns", "7", "--timeout", "20m0s",
		"--command-timeout", "1m0s", "--log", "/testbed/.harness/agent.jsonl"}, argv)
	assert.NotContains(t, strings.Join(argv, " "), "kiln-secret")
	assert.Equal(t, []string{"KILN_AGENT_API_KEY=kiln-secret", "KILN_AGENT_SESSION=kiln-secret"}, env)
	assert.Equal(t, []sandbox.Mount{{Source: "/opt/kiln/bin/kiln-agent", Target: ShellAgentPath}}, h.Mounts())
	_, err := New("aider", Options{})
	assert.ErrorContains(t, err, "unknown harness")
}

// fakeInstall lays out an npm install of both CLIs as npm makes it (the
// native builds are stand-in executables: only their paths matter here).
func fakeInstall(t *testing.T) string {
	t.Helper()
	root := t.TempDir()
	for _, p := range []string{
		"node_modules/@anthropic-ai/claude-code-linux-x64/claude",
		"node_modules/@openai/codex-linux-x64/vendor/x86_64-unknown-linux-musl/bin/codex",
		"node_modules/@openai/codex-linux-x64/vendor/x86_64-unknown-linux-musl/codex-path/rg",
	} {
		require.NoError(t, os.MkdirAll(filepath.Join(root, filepath.Dir(p)), 0o755))
		require.NoError(t, os.WriteFile(filepath.Join(root, p), []byte("#!/bin/sh\n"), 0o755))
	}
	return root
}

var testSpec = RunSpec{SessionID: "kiln-secret", BaseURL: "http://127.0.0.1:18080", Model: "kiln-policy", Workdir: "/testbed",
	TaskFile: "/testbed/PROBLEM_STATEMENT.md", Budget: 20 * time.Minute, LogFile: "/testbed/.harness/agent.jsonl"}

// envMap is KEY=VALUE as a map; a key set twice keeps the last value (as
// the sandbox's environment merge does).
func envMap(env []string) map[string]string {
	m := map[string]string{}
	for _, kv := range env {
		k, v, _ := strings.Cut(kv, "=")
		m[k] = v
	}
	return m
}

// docs/adapter.md §8 case 39: the Claude Code harness configuration
// (clients-wire.md §1): the native binary bound read-only, onboarding and
// bypass settings in the agent's home, print mode with the six code tools
// and max turns, the prompt read from the task file inside the sandbox,
// the adapter as base URL with the token as bearer (never on the command
// line), no telemetry or updates, the request timeout from the budget,
// extra args and env passed through.
func TestClaudeCodeHarness(t *testing.T) {
	root := fakeInstall(t)
	extra, err := ParseExtra(`{"claude-code":["--append-system-prompt","be brief"],"codex":["--nope"]}`,
		`{"MAX_THINKING_TOKENS":"2048","claude_code":{"CLAUDE_AUTOCOMPACT_PCT_OVERRIDE":"80"}}`)
	require.NoError(t, err)
	h, err := New("Claude_Code", Options{ClaudeCode: root, MaxTurns: 30, MaxOutputTokens: 4096, MaxContextTokens: 32768, Extra: extra})
	require.NoError(t, err)
	assert.Equal(t, ClaudeCodeName, h.Name())
	bin, _ := filepath.EvalSymlinks(filepath.Join(root, "node_modules/@anthropic-ai/claude-code-linux-x64/claude"))
	assert.Equal(t, []sandbox.Mount{{Source: bin, Target: ClaudeCodeBin}}, h.Mounts())

	files := h.Files(testSpec)
	require.Len(t, files, 2)
	for _, f := range files {
		assert.Contains(t, []string{"/home/agent/.claude.json", "/home/agent/.claude/settings.json"}, f.Path)
		assert.JSONEq(t, `{"hasCompletedOnboarding":true,"bypassPermissionsModeAccepted":true}`, string(f.Data))
		assert.Equal(t, sandbox.Agent, f.User)
	}

	argv, env := h.Command(testSpec)
	assert.Equal(t, []string{"/bin/sh", "-c", promptWrapper, "kiln-harness", testSpec.TaskFile, testSpec.LogFile,
		ClaudeCodeBin, "-p", "--permission-mode", "bypassPermissions", "--output-format", "stream-json", "--verbose",
		"--tools", "Bash,Read,Edit,Write,Glob,Grep", "--disable-slash-commands", "--max-turns", "30",
		"--append-system-prompt", "be brief"}, argv)
	assert.NotContains(t, strings.Join(argv, " "), "kiln-secret")
	e := envMap(env)
	for k, v := range map[string]string{
		"HOME": "/home/agent", "ANTHROPIC_BASE_URL": "http://127.0.0.1:18080", "ANTHROPIC_AUTH_TOKEN": "kiln-secret",
		"ANTHROPIC_MODEL": "kiln-policy", "ANTHROPIC_SMALL_FAST_MODEL": "kiln-policy",
		"CLAUDE_CODE_DISABLE_NONESSENTIAL_TRAFFIC": "1", "DISABLE_AUTOUPDATER": "1", "DISABLE_TELEMETRY": "1",
		"DISABLE_ERROR_REPORTING": "1", "API_TIMEOUT_MS": "1200000",
		"CLAUDE_CODE_MAX_OUTPUT_TOKENS": "4096", "CLAUDE_CODE_MAX_CONTEXT_TOKENS": "32768",
		"MAX_THINKING_TOKENS": "2048", "CLAUDE_AUTOCOMPACT_PCT_OVERRIDE": "80",
	} {
		assert.Equal(t, v, e[k], k)
	}
	_, hasKey := e["ANTHROPIC_API_KEY"]
	assert.False(t, hasKey, "the token goes as a bearer token, not x-api-key")

	// The binary itself is an install too; a directory without it is not.
	h, err = New("claude-code", Options{ClaudeCode: bin})
	require.NoError(t, err)
	assert.Equal(t, bin, h.Mounts()[0].Source)
	_, err = New("claude-code", Options{ClaudeCode: t.TempDir()})
	assert.ErrorContains(t, err, "no native claude binary")
	t.Setenv(ClaudeCodeEnv, filepath.Join(root, "missing"))
	_, err = New("claude-code", Options{})
	assert.ErrorContains(t, err, ClaudeCodeEnv)
}

// docs/adapter.md §8 case 40: the Codex harness configuration
// (clients-wire.md §2): the static build's platform directory bound
// read-only (its rg on PATH), config.toml with the custom provider at the
// adapter (wire_api responses, the token by env_key), web search,
// multi-agent and goals off, no update check or analytics, the stream
// idle timeout from the budget; codex exec with approvals and its own
// sandbox bypassed; extra args and env passed through.
func TestCodexHarness(t *testing.T) {
	root := fakeInstall(t)
	extra, err := ParseExtra(`["--color","never"]`, `{"codex":{"RUST_LOG":"warn"}}`)
	require.NoError(t, err)
	h, err := New("codex", Options{Codex: root, MaxTurns: 30, MaxContextTokens: 32768, Extra: extra})
	require.NoError(t, err)
	assert.Equal(t, CodexName, h.Name())
	dir, _ := filepath.EvalSymlinks(filepath.Join(root, "node_modules/@openai/codex-linux-x64/vendor/x86_64-unknown-linux-musl"))
	assert.Equal(t, []sandbox.Mount{{Source: dir, Target: CodexDir}}, h.Mounts())

	files := h.Files(testSpec)
	require.Len(t, files, 1)
	assert.Equal(t, "/home/agent/.codex/config.toml", files[0].Path)
	assert.Equal(t, sandbox.Agent, files[0].User)
	assert.Equal(t, `model = "kiln-policy"
model_provider = "kiln"
web_search = "disabled"
model_reasoning_effort = "medium"
check_for_update_on_startup = false
model_context_window = 32768

[model_providers.kiln]
name = "kiln"
base_url = "http://127.0.0.1:18080/v1"
env_key = "OPENAI_API_KEY"
wire_api = "responses"
requires_openai_auth = false
supports_websockets = false
stream_idle_timeout_ms = 1200000

[features]
multi_agent = false
goals = false

[analytics]
enabled = false
`, string(files[0].Data))
	assert.NotContains(t, string(files[0].Data), "kiln-secret")

	argv, env := h.Command(testSpec)
	assert.Equal(t, []string{"/bin/sh", "-c", promptWrapper, "kiln-harness", testSpec.TaskFile, testSpec.LogFile,
		CodexDir + "/bin/codex", "exec", "--skip-git-repo-check", "--dangerously-bypass-approvals-and-sandbox", "--json",
		"--color", "never"}, argv)
	assert.NotContains(t, strings.Join(argv, " "), "kiln-secret")
	e := envMap(env)
	assert.Equal(t, "kiln-secret", e["OPENAI_API_KEY"])
	assert.Equal(t, "/home/agent/.codex", e["CODEX_HOME"])
	assert.Equal(t, "warn", e["RUST_LOG"])
	assert.True(t, strings.HasPrefix(e["PATH"], CodexDir+"/codex-path:"), e["PATH"])

	// A lone binary is bound at the same place.
	h, err = New("codex", Options{Codex: filepath.Join(dir, "bin", "codex")})
	require.NoError(t, err)
	assert.Equal(t, CodexDir+"/bin/codex", h.Mounts()[0].Target)
	_, err = New("codex", Options{Codex: t.TempDir()})
	assert.ErrorContains(t, err, "no native codex build")
}

// The prompt wrapper passes the task file's content as the CLI's last
// argument, its stdout into the log and stdin from /dev/null.
func TestPromptWrapper(t *testing.T) {
	dir := t.TempDir()
	task := filepath.Join(dir, "task.md")
	require.NoError(t, os.WriteFile(task, []byte("fix the bug\nin 'x' \"now\"\n"), 0o644))
	log := filepath.Join(dir, "log")
	argv := wrap(RunSpec{TaskFile: task, LogFile: log}, []string{"/bin/sh", "-c", `printf '%s|' "$@"; cat`, "cli", "-p"})
	out, err := exec.Command(argv[0], argv[1:]...).CombinedOutput()
	require.NoError(t, err, string(out))
	data, err := os.ReadFile(log)
	require.NoError(t, err)
	assert.Equal(t, "-p|fix the bug\nin 'x' \"now\"|", string(data))
}

func TestParseExtra(t *testing.T) {
	e, err := ParseExtra("", "")
	require.NoError(t, err)
	a, v := e.For(CodexName)
	assert.Empty(t, a)
	assert.Empty(t, v)
	e, err = ParseExtra(`["-a"]`, `{"B":"1","A":"2","shell":{"C":"3"}}`)
	require.NoError(t, err)
	a, v = e.For(ShellName)
	assert.Equal(t, []string{"-a"}, a)
	assert.Equal(t, []string{"A=2", "B=1", "C=3"}, v)
	for _, c := range []struct{ args, env, want string }{
		{`"x"`, "", "--agent-args"},
		{`{"aider":["x"]}`, "", "unknown harness"},
		{"", `[1]`, "--agent-env"},
		{"", `{"A":1}`, "neither a string"},
		{"", `{"A=B":"1"}`, "bad variable name"},
	} {
		_, err := ParseExtra(c.args, c.env)
		assert.ErrorContains(t, err, c.want, c)
	}
}
