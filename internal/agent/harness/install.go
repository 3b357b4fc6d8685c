package harness

import (
	"encoding/json"
	"fmt"
	"os"
	"path/filepath"
	"sort"
	"strings"
)

// Env variables that locate the pinned CLIs on the host (docs/rollout.md
// §3.3); the --claude-code and --codex flags of kiln-rollout win over them.
const (
	ClaudeCodeEnv = "KILN_AGENT_CLAUDE_CODE"
	CodexEnv      = "KILN_AGENT_CODEX"
)

// AgentsDir is where the CLIs' files appear inside the sandbox: on its
// /run tmpfs beside the shell agent, so the image needs nothing and the
// overlay is not written.
const AgentsDir = "/run/kiln/agents"

// cacheInstall is the npm install scripts/install-test-deps.sh made (the
// directory named by ~/.cache/kiln/npm-clis-current), "" if there is none.
func cacheInstall() string {
	home, err := os.UserHomeDir()
	if err != nil {
		return ""
	}
	cur, err := os.ReadFile(filepath.Join(home, ".cache", "kiln", "npm-clis-current"))
	if err != nil {
		return ""
	}
	return strings.TrimSpace(string(cur))
}

// locate returns the host path of a CLI: configured if set, else the env
// variable, else the cache install. what names the CLI in errors.
func locate(configured, envName, what string) (string, error) {
	p := configured
	if p == "" {
		p = os.Getenv(envName)
	}
	if p == "" {
		p = cacheInstall()
	}
	if p == "" {
		return "", fmt.Errorf("%s: no install given: set %s (or --%s) to its npm install directory or its native binary, or run scripts/install-test-deps.sh",
			what, envName, strings.ReplaceAll(strings.ToLower(what), " ", "-"))
	}
	abs, err := filepath.Abs(p)
	if err != nil {
		return "", fmt.Errorf("%s install %q: %w", what, p, err)
	}
	if _, err := os.Stat(abs); err != nil {
		return "", fmt.Errorf("%s install %q: %w; set %s to an unpacked install", what, p, err, envName)
	}
	return abs, nil
}

// findIn returns the first of candidates (relative to root) that is a
// regular executable file.
func findIn(root string, candidates ...string) string {
	for _, c := range candidates {
		p := filepath.Join(root, c)
		if fi, err := os.Stat(p); err == nil && fi.Mode().IsRegular() && fi.Mode()&0o111 != 0 {
			return p
		}
	}
	return ""
}

// Extra are extra arguments and environment for the agents' command
// lines (--agent-args, --agent-env): either for every harness or per
// harness name.
type Extra struct {
	// Args are appended to the agent's argv (before the prompt, for the
	// CLIs that take it last).
	Args map[string][]string
	// Env are KEY=VALUE added over the harness's own environment.
	Env map[string][]string
}

// allHarnesses is the Extra key that applies to every harness.
const allHarnesses = "*"

// For returns the extra args and env for harness name.
func (e Extra) For(name string) (args, env []string) {
	args = append(append(args, e.Args[allHarnesses]...), e.Args[name]...)
	env = append(append(env, e.Env[allHarnesses]...), e.Env[name]...)
	return args, env
}

// ParseExtra reads --agent-args and --agent-env. args is a JSON array of
// strings (every harness) or an object of harness name → array; env is a
// JSON object of NAME → string (every harness) or of harness name →
// object. Empty strings mean none.
func ParseExtra(args, env string) (Extra, error) {
	e := Extra{Args: map[string][]string{}, Env: map[string][]string{}}
	if strings.TrimSpace(args) != "" {
		var all []string
		if err := json.Unmarshal([]byte(args), &all); err == nil {
			e.Args[allHarnesses] = all
		} else {
			var per map[string][]string
			if err := json.Unmarshal([]byte(args), &per); err != nil {
				return Extra{}, fmt.Errorf("--agent-args %q: want a JSON array of strings, or an object of harness name to array: %w", args, err)
			}
			for k, v := range per {
				if err := known(k); err != nil {
					return Extra{}, fmt.Errorf("--agent-args: %w", err)
				}
				e.Args[Normalize(k)] = v
			}
		}
	}
	if strings.TrimSpace(env) != "" {
		var raw map[string]json.RawMessage
		if err := json.Unmarshal([]byte(env), &raw); err != nil {
			return Extra{}, fmt.Errorf("--agent-env %q: want a JSON object of NAME to string, or of harness name to such an object: %w", env, err)
		}
		keys := make([]string, 0, len(raw))
		for k := range raw {
			keys = append(keys, k)
		}
		sort.Strings(keys) // a stable order: the environment is part of the command
		for _, k := range keys {
			var s string
			if err := json.Unmarshal(raw[k], &s); err == nil {
				if k == "" || strings.Contains(k, "=") {
					return Extra{}, fmt.Errorf("--agent-env: bad variable name %q", k)
				}
				e.Env[allHarnesses] = append(e.Env[allHarnesses], k+"="+s)
				continue
			}
			var per map[string]string
			if err := json.Unmarshal(raw[k], &per); err != nil {
				return Extra{}, fmt.Errorf("--agent-env %q: the value of %q is neither a string nor an object of strings", env, k)
			}
			if err := known(k); err != nil {
				return Extra{}, fmt.Errorf("--agent-env: %w", err)
			}
			names := make([]string, 0, len(per))
			for n := range per {
				names = append(names, n)
			}
			sort.Strings(names)
			for _, n := range names {
				if n == "" || strings.Contains(n, "=") {
					return Extra{}, fmt.Errorf("--agent-env: bad variable name %q", n)
				}
				e.Env[Normalize(k)] = append(e.Env[Normalize(k)], n+"="+per[n])
			}
		}
	}
	return e, nil
}

// known checks that name is a harness name.
func known(name string) error {
	switch Normalize(name) {
	case ShellName, ClaudeCodeName, CodexName:
		return nil
	}
	return fmt.Errorf("unknown harness %q: want %s, %s or %s", name, ShellName, ClaudeCodeName, CodexName)
}

// promptWrapper runs "$@" with the task file's content as its last
// argument, stdin from /dev/null (Codex reads more input from an open
// stdin) and stdout (the CLI's JSON event stream) into the log file, whose
// directory it makes (RunSpec.LogFile). The prompt is read inside the
// sandbox, so the host never handles it and the argv of the CLI carries no
// secret. $1 is the task file, $2 the log.
const promptWrapper = `task="$1"; log="$2"; shift 2; prompt="$(cat "$task")" || exit 125; mkdir -p "${log%/*}" || exit 125; exec "$@" "$prompt" </dev/null >"$log"`

// wrap is the argv that runs cli with the prompt of r appended.
func wrap(r RunSpec, cli []string) []string {
	log := r.LogFile
	if log == "" {
		log = "/dev/null"
	}
	return append([]string{"/bin/sh", "-c", promptWrapper, "kiln-harness", r.TaskFile, log}, cli...)
}
