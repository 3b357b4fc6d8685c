package harness

import (
	"fmt"
	"path/filepath"
	"strconv"
	"time"

	"github.com/kilnrl/kiln/internal/sandbox"
)

// ClaudeCodeBin is where Claude Code's native binary appears inside the
// sandbox.
const ClaudeCodeBin = AgentsDir + "/claude-code/claude"

// ClaudeCodeTools are the six code tools Claude Code is given
// (clients-wire.md §1.4: without --tools it declares twelve).
const ClaudeCodeTools = "Bash,Read,Edit,Write,Glob,Grep"

// agentHome is the agent user's home in every sandbox (workspace.Prepare
// makes it).
const agentHome = "/home/" + sandbox.Agent

// ClaudeCode runs the pinned Claude Code CLI (docs/rollout.md §3.3,
// clients-wire.md §1): its native binary bound read-only, onboarding and
// bypass-permission settings in the agent's home, the adapter as its
// Anthropic base URL with the session token as its bearer token.
type ClaudeCode struct {
	// Binary is the host path of the native claude binary.
	Binary string
	// MaxTurns is --max-turns (0: the CLI's default).
	MaxTurns int
	// MaxOutputTokens and MaxContextTokens, when set, are the CLI's own
	// limits (for an unknown model name it assumes a 1M-token window).
	MaxOutputTokens, MaxContextTokens int
	// Extra are --agent-args and --agent-env for this harness.
	Args, Env []string
}

// findClaudeCode finds the native binary in an install: the binary
// itself, an npm install directory (with node_modules), node_modules, or
// the platform package directory.
func findClaudeCode(configured string) (string, error) {
	p, err := locate(configured, ClaudeCodeEnv, "Claude Code")
	if err != nil {
		return "", err
	}
	if bin := findIn(p, ".", "claude",
		"@anthropic-ai/claude-code-linux-x64/claude", "node_modules/@anthropic-ai/claude-code-linux-x64/claude",
		"bin/claude.exe", "@anthropic-ai/claude-code/bin/claude.exe", "node_modules/@anthropic-ai/claude-code/bin/claude.exe"); bin != "" {
		return filepath.EvalSymlinks(bin)
	}
	return "", fmt.Errorf("Claude Code install %q: no native claude binary in it (looked for claude and node_modules/@anthropic-ai/claude-code-linux-x64/claude); set %s to an npm install of @anthropic-ai/claude-code", p, ClaudeCodeEnv)
}

// Name implements Harness.
func (c *ClaudeCode) Name() string { return ClaudeCodeName }

// Mounts implements Harness: the one native binary (it embeds its runtime).
func (c *ClaudeCode) Mounts() []sandbox.Mount {
	return []sandbox.Mount{{Source: c.Binary, Target: ClaudeCodeBin}}
}

// claudeSettings marks onboarding done and bypass mode accepted, so the
// CLI asks nothing (clients-wire.md §1.1).
const claudeSettings = `{"hasCompletedOnboarding":true,"bypassPermissionsModeAccepted":true}`

// Files implements Harness.
func (c *ClaudeCode) Files(RunSpec) []File {
	return []File{
		{Path: agentHome + "/.claude.json", Data: []byte(claudeSettings), Perm: 0o600, User: sandbox.Agent},
		{Path: agentHome + "/.claude/settings.json", Data: []byte(claudeSettings), Perm: 0o600, User: sandbox.Agent},
	}
}

// Command implements Harness. The token is in the environment only.
// API_TIMEOUT_MS is the budget: the CLI bounds a model call until the
// response head by it and then retries from scratch (clients-wire.md §4),
// and a retry within the budget would only repeat the sampling.
func (c *ClaudeCode) Command(r RunSpec) (argv, env []string) {
	cli := []string{ClaudeCodeBin, "-p", "--permission-mode", "bypassPermissions", "--output-format", "stream-json",
		"--verbose", "--tools", ClaudeCodeTools, "--disable-slash-commands"}
	if c.MaxTurns > 0 {
		cli = append(cli, "--max-turns", strconv.Itoa(c.MaxTurns))
	}
	cli = append(cli, c.Args...)
	env = []string{
		"HOME=" + agentHome,
		"ANTHROPIC_BASE_URL=" + r.BaseURL,
		"ANTHROPIC_AUTH_TOKEN=" + r.SessionID,
		"ANTHROPIC_MODEL=" + r.Model,
		"ANTHROPIC_SMALL_FAST_MODEL=" + r.Model,
		"ANTHROPIC_DEFAULT_HAIKU_MODEL=" + r.Model,
		"CLAUDE_CODE_DISABLE_NONESSENTIAL_TRAFFIC=1",
		"CLAUDE_CODE_DISABLE_EXPERIMENTAL_BETAS=1",
		"CLAUDE_CODE_ATTRIBUTION_HEADER=0",
		"DISABLE_AUTOUPDATER=1",
		"DISABLE_TELEMETRY=1",
		"DISABLE_ERROR_REPORTING=1",
		"NO_COLOR=1", "TERM=dumb",
	}
	if r.Budget > 0 {
		env = append(env, "API_TIMEOUT_MS="+strconv.FormatInt(budgetMs(r.Budget), 10))
	}
	if c.MaxOutputTokens > 0 {
		env = append(env, "CLAUDE_CODE_MAX_OUTPUT_TOKENS="+strconv.Itoa(c.MaxOutputTokens))
	}
	if c.MaxContextTokens > 0 {
		env = append(env, "CLAUDE_CODE_MAX_CONTEXT_TOKENS="+strconv.Itoa(c.MaxContextTokens))
	}
	return wrap(r, cli), append(env, c.Env...)
}

// budgetMs is a budget in milliseconds, at least one second.
func budgetMs(d time.Duration) int64 { return max(d.Milliseconds(), 1000) }
