package harness

import (
	"strings"
	"testing"
	"time"

	"github.com/stretchr/testify/assert"

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
	for _, name := range []string{"claude-code", "claude_code", "codex"} {
		_, err := New(name, Options{})
		assert.ErrorContains(t, err, "not built yet", name)
	}
	_, err := New("aider", Options{})
	assert.ErrorContains(t, err, "unknown harness")
}
