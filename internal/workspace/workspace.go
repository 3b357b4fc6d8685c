// Package workspace prepares an agent's workspace in a sandbox and captures
// the agent's edits as a patch (docs/data-and-grading.md §4).
//
// Capture is by tree snapshots: the workspace's files are written into a git
// tree through a temporary index before the agent runs (the baseline) and
// after it, and the patch is the binary diff of the two trees. So staged,
// unstaged and committed edits, new, deleted and binary files and mode
// changes are all captured alike; whatever the image shipped or the setup
// produced is in both trees and never counts as an edit; ignored files are
// not captured; and HEAD and the real index are never touched. Everything
// runs through Sandbox.Exec, so it works with any sandbox provider.
package workspace

import (
	"context"
	"errors"
	"fmt"
	"regexp"
	"strings"
	"time"

	"github.com/kilnrl/kiln/internal/sandbox"
)

// ProblemFile is the task text the agent reads, relative to the workdir; it
// and HarnessDir are excluded from snapshots and patches.
const (
	ProblemFile = "PROBLEM_STATEMENT.md"
	HarnessDir  = ".harness"
)

// pathspec excludes the problem file and the harness directory.
const pathspec = "-- . ':(exclude)" + ProblemFile + "' ':(exclude)" + HarnessDir + "/'"

// Setup is the task metadata prepare uses.
type Setup struct {
	// ProblemStatement is written to WORKDIR/PROBLEM_STATEMENT.md ("" too).
	ProblemStatement string
	// BeforeRepoSetCmd (swepro) runs as agent in WORKDIR, failures ignored.
	BeforeRepoSetCmd string
	// PreCommands is a script body (see PreCommandsBody) run as agent in
	// WORKDIR under set -e, failures ignored.
	PreCommands string
}

// PreCommandsBody turns a task's pre_commands value into a script body: a
// string has every literal two-character `\n` replaced by a newline; a list
// is joined with newlines after dropping empty items. Other values give "".
func PreCommandsBody(v any) string {
	switch v := v.(type) {
	case string:
		return strings.ReplaceAll(v, `\n`, "\n")
	case []string:
		var parts []string
		for _, s := range v {
			if s != "" {
				parts = append(parts, s)
			}
		}
		return strings.Join(parts, "\n")
	case []any:
		var parts []string
		for _, s := range v {
			if str, ok := s.(string); ok && str != "" {
				parts = append(parts, str)
			}
		}
		return strings.Join(parts, "\n")
	}
	return ""
}

// EnsureAgentUser makes the unprivileged agent user exist, gives it its home
// and workdir (recursively) and lets every user run git in any repository
// (docs/data-and-grading.md §3.2). It runs as root with a 60 s timeout; failure is an error.
func EnsureAgentUser(ctx context.Context, sb sandbox.Sandbox, workdir string) error {
	a := sandbox.Agent
	cmd := fmt.Sprintf("(id %s >/dev/null 2>&1 || useradd -m -s /bin/bash %s) && chown -R %s:%s /home/%s %s && git config --system --add safe.directory '*' && id %s",
		a, a, a, a, a, sandbox.ShellQuote(workdir), a)
	if _, err := sb.Exec(ctx, sandbox.Cmd{Shell: cmd, User: sandbox.Root, Timeout: 60 * time.Second, Check: true}); err != nil {
		return fmt.Errorf("set up the agent user for workdir %q: %w", workdir, err)
	}
	return nil
}

// Prepare readies workdir for the agent and returns the baseline tree id
// (docs/data-and-grading.md §4.1): agent user, setup commands, the problem file, then the
// snapshot, so that everything before the agent is part of the baseline.
func Prepare(ctx context.Context, sb sandbox.Sandbox, workdir string, s Setup) (string, error) {
	if err := EnsureAgentUser(ctx, sb, workdir); err != nil {
		return "", err
	}
	q := sandbox.ShellQuote(workdir)
	if s.BeforeRepoSetCmd != "" {
		const dir = "/workspace/swepro_setup"
		if _, err := sb.Exec(ctx, sandbox.Cmd{Shell: "mkdir -p " + dir + " && chown agent:agent " + dir, Timeout: 60 * time.Second, Check: true}); err != nil {
			return "", fmt.Errorf("prepare %q: %w", workdir, err)
		}
		script := "set -e\ncd " + q + "\n" + s.BeforeRepoSetCmd + "\n"
		if err := sb.WriteFile(ctx, dir+"/before.sh", []byte(script), 0o644, sandbox.Agent); err != nil {
			return "", fmt.Errorf("prepare %q: %w", workdir, err)
		}
		// Failure is ignored, as in the reference.
		if _, err := sb.Exec(ctx, sandbox.Cmd{Argv: []string{"bash", dir + "/before.sh"}, User: sandbox.Agent, Timeout: 600 * time.Second}); err != nil {
			return "", fmt.Errorf("prepare %q: before_repo_set_cmd: %w", workdir, err)
		}
	}
	if s.PreCommands != "" {
		const f = "/tmp/__cagent_pre__.sh"
		if err := sb.WriteFile(ctx, f, []byte("set -e\n"+s.PreCommands), 0o644, sandbox.Agent); err != nil {
			return "", fmt.Errorf("prepare %q: %w", workdir, err)
		}
		if _, err := sb.Exec(ctx, sandbox.Cmd{Shell: "chmod 755 " + f + " && cd " + q + " && bash " + f, User: sandbox.Agent, Timeout: 600 * time.Second}); err != nil {
			return "", fmt.Errorf("prepare %q: pre_commands: %w", workdir, err)
		}
	}
	if err := sb.WriteFile(ctx, strings.TrimSuffix(workdir, "/")+"/"+ProblemFile, []byte(s.ProblemStatement), 0o644, sandbox.Agent); err != nil {
		return "", fmt.Errorf("prepare %q: %w", workdir, err)
	}
	return Snapshot(ctx, sb, workdir)
}

var treeID = regexp.MustCompile(`^([0-9a-f]{40}|[0-9a-f]{64})$`)

// Snapshot writes the current content of workdir into a git tree and returns
// its id (docs/data-and-grading.md §4.2). It seeds a temporary index (GIT_INDEX_FILE) from HEAD
// and adds everything but the problem file and the harness directory, so
// HEAD and the real index stay byte-identical; only new objects are written.
// It runs as agent. Not a git repository, an unborn HEAD or any git failure
// is an error.
func Snapshot(ctx context.Context, sb sandbox.Sandbox, workdir string) (string, error) {
	script := strings.Join([]string{
		"set -e",
		"cd " + sandbox.ShellQuote(workdir),
		// git wants a non-existent index path: an empty file is an invalid index.
		`tmp=$(mktemp)`,
		`rm -f "$tmp"`,
		`trap 'rm -f "$tmp" "$tmp.lock"' EXIT`,
		`export GIT_INDEX_FILE="$tmp"`,
		"git read-tree HEAD",
		"git add -A " + pathspec,
		"git write-tree",
	}, "\n")
	res, err := sb.Exec(ctx, sandbox.Cmd{Shell: script, User: sandbox.Agent, Timeout: 120 * time.Second, Check: true})
	if err != nil {
		return "", fmt.Errorf("snapshot workspace %q: %w", workdir, err)
	}
	out := strings.TrimSpace(string(res.Stdout))
	if !treeID.MatchString(out) {
		return "", fmt.Errorf("snapshot workspace %q: Invalid repository snapshot: '%s'", workdir, out)
	}
	return out, nil
}

// Diff snapshots workdir again and returns the binary diff from baseline to
// it, verbatim ("" when nothing changed) (docs/data-and-grading.md §4.3). The flags are exactly
// the reference's (`git diff --binary`); renames follow git's defaults.
func Diff(ctx context.Context, sb sandbox.Sandbox, workdir, baseline string) (string, error) {
	if !treeID.MatchString(baseline) {
		return "", fmt.Errorf("diff workspace %q: baseline %q is not a tree id", workdir, baseline)
	}
	current, err := Snapshot(ctx, sb, workdir)
	if err != nil {
		return "", err
	}
	diff := "cd " + sandbox.ShellQuote(workdir) + " && git diff --binary " + baseline + " " + current + " " + pathspec
	res, err := sb.Exec(ctx, sandbox.Cmd{Shell: diff, User: sandbox.Agent, Timeout: 120 * time.Second, Check: true})
	if err != nil {
		return "", fmt.Errorf("diff workspace %q: %w", workdir, err)
	}
	if !res.StdoutTruncated {
		return string(res.Stdout), nil
	}
	// Larger than the sandbox's output limit: go through a file instead, so a
	// big patch is never silently cut.
	const f = "/tmp/.kiln-workspace.patch"
	if _, err := sb.Exec(ctx, sandbox.Cmd{Shell: diff + " > " + f, User: sandbox.Agent, Timeout: 120 * time.Second, Check: true}); err != nil {
		return "", fmt.Errorf("diff workspace %q: %w", workdir, err)
	}
	b, err := sb.ReadFile(ctx, f)
	_, rmErr := sb.Exec(ctx, sandbox.Cmd{Argv: []string{"rm", "-f", f}})
	if err = errors.Join(err, rmErr); err != nil {
		return "", fmt.Errorf("diff workspace %q: %w", workdir, err)
	}
	return string(b), nil
}
