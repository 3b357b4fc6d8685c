package sandbox

import (
	"context"
	"fmt"
	"strconv"
	"strings"
	"time"
)

// BudgetExceeded is ExecAndWait's exit code when the command did not finish
// within its budget.
const BudgetExceeded = -1

// Wait describes a detached long command for ExecAndWait (docs/data-and-grading.md §3.5).
type Wait struct {
	// Shell is the command (bash).
	Shell string
	// Budget is how long to wait for it.
	Budget time.Duration
	// Tag names the marker files /tmp/.TAG.{out,done,sh,spawned}. Two calls
	// with one tag must not overlap in a sandbox.
	Tag  string
	User string
	Env  []string
	// Workdir, if set, is where the command runs, with HOME=/home/USER.
	Workdir string
	// OutFile receives the command's combined output (/tmp/.TAG.out if "").
	OutFile string
	// WantOutput returns the whole output file; otherwise the output is ""
	// on exit 0 and the last 512 bytes of it on any other exit.
	WantOutput bool
	// PollInterval is the time between completion checks (5 s if 0).
	PollInterval time.Duration
}

// ExecAndWait runs a command detached from any one Exec (so a transport
// failure or an Exec timeout cannot kill it) and polls for its exit code:
//
//  1. write the launcher /tmp/.TAG.sh as User;
//  2. clean up the markers of an earlier same-tag run, as its own Exec;
//  3. spawn the launcher with setsid, guarded by mkdir of the lock directory
//     so that a replay of that same Exec cannot launch it twice;
//  4. poll for the done marker until the budget is spent.
//
// It returns the command's exit code, or BudgetExceeded (-1) when the budget
// ran out; the command is then left running until the sandbox closes. An
// error means the sandbox could not run the steps or the done marker was not
// an integer.
func ExecAndWait(ctx context.Context, sb Sandbox, w Wait) (int, string, error) {
	out := w.OutFile
	if out == "" {
		out = "/tmp/." + w.Tag + ".out"
	}
	done := "/tmp/." + w.Tag + ".done"
	launcher := "/tmp/." + w.Tag + ".sh"
	lock := "/tmp/." + w.Tag + ".spawned"
	user := w.User
	if user == "" {
		user = Root
	}
	poll := w.PollInterval
	if poll <= 0 {
		poll = 5 * time.Second
	}

	var body strings.Builder
	body.WriteString("#!/bin/bash\n")
	if w.Workdir != "" {
		fmt.Fprintf(&body, "cd %s\nexport HOME=/home/%s\n", ShellQuote(w.Workdir), user)
	}
	fmt.Fprintf(&body, "%s\necho $? > %s\n", w.Shell, ShellQuote(done))
	if err := sb.WriteFile(ctx, launcher, []byte(body.String()), 0o644, user); err != nil {
		return 0, "", fmt.Errorf("exec_and_wait %q: %w", w.Tag, err)
	}
	// The cleanup must never be part of the guarded spawn: a retry with the
	// same tag would otherwise read the previous run's marker.
	cleanup := fmt.Sprintf("rm -rf %s; rm -f %s %s", ShellQuote(lock), ShellQuote(out), ShellQuote(done))
	if _, err := sb.Exec(ctx, Cmd{Shell: cleanup, User: user, Timeout: 30 * time.Second, Check: true}); err != nil {
		return 0, "", fmt.Errorf("exec_and_wait %q: clean up: %w", w.Tag, err)
	}
	spawn := fmt.Sprintf("chmod +x %s; mkdir %s 2>/dev/null || exit 0; setsid bash %s < /dev/null > %s 2>&1 &",
		ShellQuote(launcher), ShellQuote(lock), ShellQuote(launcher), ShellQuote(out))
	if _, err := sb.Exec(ctx, Cmd{Shell: spawn, User: user, Env: w.Env, Timeout: 30 * time.Second, Check: true}); err != nil {
		return 0, "", fmt.Errorf("exec_and_wait %q: spawn: %w", w.Tag, err)
	}

	deadline := time.Now().Add(w.Budget)
	code := BudgetExceeded
	for {
		select {
		case <-ctx.Done():
			return 0, "", ctx.Err()
		case <-time.After(poll):
		}
		res, err := sb.Exec(ctx, Cmd{Shell: "test -f " + ShellQuote(done) + " && cat " + ShellQuote(done), User: user, Timeout: 15 * time.Second})
		if err != nil {
			return 0, "", fmt.Errorf("exec_and_wait %q: poll: %w", w.Tag, err)
		}
		if marker := strings.TrimSpace(string(res.Stdout)); res.ExitCode == 0 && marker != "" {
			n, err := strconv.Atoi(marker)
			if err != nil {
				return 0, "", fmt.Errorf("exec_and_wait %q: done marker %q is not an exit code", w.Tag, marker)
			}
			code = n
			break
		}
		if time.Now().After(deadline) {
			break
		}
	}

	switch {
	case w.WantOutput:
		b, err := sb.ReadFile(ctx, out)
		if err != nil {
			return code, "", fmt.Errorf("exec_and_wait %q: read output: %w", w.Tag, err)
		}
		return code, string(b), nil
	case code == 0:
		return code, "", nil
	}
	res, err := sb.Exec(ctx, Cmd{Shell: "tail -c 512 " + ShellQuote(out) + " 2>/dev/null", User: user, Timeout: 30 * time.Second})
	if err != nil {
		return code, "", fmt.Errorf("exec_and_wait %q: output tail: %w", w.Tag, err)
	}
	return code, string(res.Stdout), nil
}

// ShellQuote quotes s as one word for sh and bash.
func ShellQuote(s string) string {
	return "'" + strings.ReplaceAll(s, "'", `'"'"'`) + "'"
}
