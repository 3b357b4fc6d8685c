package harness

import (
	"fmt"
	"os"
	"path/filepath"
	"strings"

	"github.com/kilnrl/kiln/internal/sandbox"
)

// CodexDir is where Codex's platform directory (bin/codex and the rg of
// codex-path/) appears inside the sandbox.
const CodexDir = AgentsDir + "/codex"

// codexTriple is the platform directory of the npm package's static
// (musl) build.
const codexTriple = "x86_64-unknown-linux-musl"

// Codex runs the pinned Codex CLI (docs/rollout.md §3.3, clients-wire.md
// §2): its static native build bound read-only, a config.toml with a
// custom provider (the adapter, wire_api = "responses") and web search,
// multi-agent and goals off, the session token as its API key.
type Codex struct {
	// Dir is the host platform directory holding bin/codex (and
	// codex-path/), or "" when Binary is a lone binary.
	Dir string
	// Binary is the host path of the codex binary when Dir is "".
	Binary string
	// MaxOutputTokens and MaxContextTokens, when set, go in config.toml.
	MaxOutputTokens, MaxContextTokens int
	// Extra are --agent-args and --agent-env for this harness.
	Args, Env []string
}

// findCodex finds the native build in an install: the binary itself, its
// platform directory (bin/codex), the platform package, an npm install
// directory or node_modules.
func findCodex(configured string) (dir, bin string, err error) {
	p, err := locate(configured, CodexEnv, "Codex")
	if err != nil {
		return "", "", err
	}
	if fi, err := os.Stat(p); err == nil && fi.Mode().IsRegular() {
		return "", p, nil
	}
	for _, d := range []string{".", "vendor/" + codexTriple, "@openai/codex-linux-x64/vendor/" + codexTriple,
		"node_modules/@openai/codex-linux-x64/vendor/" + codexTriple} {
		if findIn(p, filepath.Join(d, "bin", "codex")) != "" {
			dir, err := filepath.EvalSymlinks(filepath.Join(p, d))
			return dir, "", err
		}
	}
	return "", "", fmt.Errorf("Codex install %q: no native codex build in it (looked for bin/codex and node_modules/@openai/codex-linux-x64/vendor/%s/bin/codex); set %s to an npm install of @openai/codex", p, codexTriple, CodexEnv)
}

// Name implements Harness.
func (c *Codex) Name() string { return CodexName }

// Mounts implements Harness.
func (c *Codex) Mounts() []sandbox.Mount {
	if c.Dir != "" {
		return []sandbox.Mount{{Source: c.Dir, Target: CodexDir}}
	}
	return []sandbox.Mount{{Source: c.Binary, Target: CodexDir + "/bin/codex"}}
}

// codexHome is CODEX_HOME inside the sandbox.
const codexHome = agentHome + "/.codex"

// Config is the config.toml for r (clients-wire.md §2.1). The provider's
// stream idle timeout is the budget: Codex gives up on a model call after
// that long without an SSE event (clients-wire.md §4); no update check,
// no analytics.
func (c *Codex) Config(r RunSpec) string {
	var b strings.Builder
	fmt.Fprintf(&b, "model = %q\nmodel_provider = \"kiln\"\nweb_search = \"disabled\"\nmodel_reasoning_effort = \"medium\"\n", r.Model)
	b.WriteString("check_for_update_on_startup = false\n")
	if c.MaxContextTokens > 0 {
		fmt.Fprintf(&b, "model_context_window = %d\n", c.MaxContextTokens)
	}
	if c.MaxOutputTokens > 0 {
		fmt.Fprintf(&b, "model_max_output_tokens = %d\n", c.MaxOutputTokens)
	}
	fmt.Fprintf(&b, "\n[model_providers.kiln]\nname = \"kiln\"\nbase_url = %q\nenv_key = \"OPENAI_API_KEY\"\n", r.BaseURL+"/v1")
	b.WriteString("wire_api = \"responses\"\nrequires_openai_auth = false\nsupports_websockets = false\n")
	if r.Budget > 0 {
		fmt.Fprintf(&b, "stream_idle_timeout_ms = %d\n", budgetMs(r.Budget))
	}
	b.WriteString("\n[features]\nmulti_agent = false\ngoals = false\n\n[analytics]\nenabled = false\n")
	return b.String()
}

// Files implements Harness.
func (c *Codex) Files(r RunSpec) []File {
	return []File{{Path: codexHome + "/config.toml", Data: []byte(c.Config(r)), Perm: 0o600, User: sandbox.Agent}}
}

// Command implements Harness: codex exec, the outer sandbox owning
// isolation (Codex's own is bypassed). The token is in the environment
// only; codex-path (its rg) is on PATH as the npm wrapper puts it.
func (c *Codex) Command(r RunSpec) (argv, env []string) {
	cli := append([]string{CodexDir + "/bin/codex", "exec", "--skip-git-repo-check",
		"--dangerously-bypass-approvals-and-sandbox", "--json"}, c.Args...)
	env = []string{
		"HOME=" + agentHome,
		"CODEX_HOME=" + codexHome,
		"OPENAI_API_KEY=" + r.SessionID,
		"PATH=" + CodexDir + "/codex-path:/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin",
		"NO_COLOR=1", "TERM=dumb",
	}
	return wrap(r, cli), append(env, c.Env...)
}
