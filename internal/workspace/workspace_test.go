package workspace_test

import (
	"context"
	"strings"
	"testing"

	"github.com/kilnrl/kiln/internal/sandbox"
	"github.com/kilnrl/kiln/internal/sandbox/sandboxtest"
	"github.com/kilnrl/kiln/internal/workspace"
)

// helper is the kiln-sandbox-helper binary built for this test run.
var helper string

func TestMain(m *testing.M) { sandboxtest.Main(m, &helper) }

const (
	agentRepo  = "/work/agent repo" // the space exercises quoting
	graderRepo = "/work/grader repo"
)

// run runs a shell command that must succeed and returns its stdout.
func run(t *testing.T, sb sandbox.Sandbox, user, shell string) string {
	t.Helper()
	res, err := sb.Exec(context.Background(), sandbox.Cmd{Shell: shell, User: user, Check: true})
	if err != nil {
		t.Fatal(err)
	}
	return string(res.Stdout)
}

// imageRepo builds the docs/data-and-grading.md §4.5 starting point: a committed source.py, then the
// image-shipped state (an unstaged edit and an untracked file), owned by the
// agent; and a copy of it all as the fresh grader.
func imageRepo(t *testing.T, sb sandbox.Sandbox) {
	t.Helper()
	run(t, sb, sandbox.Root, `set -e
mkdir -p '`+agentRepo+`' && cd '`+agentRepo+`'
git init -q && git config user.name tester && git config user.email tester@example.invalid
printf 'result = 0\n' > source.py && git add source.py && git commit -qm init
printf '# image setup\nresult = 0\n' > source.py
printf '{"image_dependency": true}\n' > package-lock.json`)
	if err := workspace.EnsureAgentUser(context.Background(), sb, agentRepo); err != nil {
		t.Fatal(err)
	}
	run(t, sb, sandbox.Root, `cp -a '`+agentRepo+`' '`+graderRepo+`'`)
}

// gitState is the real index bytes and HEAD of the agent repo.
func gitState(t *testing.T, sb sandbox.Sandbox) string {
	t.Helper()
	return run(t, sb, sandbox.Agent, `cd '`+agentRepo+`' && sha256sum .git/index && cat .git/HEAD && git rev-parse HEAD`)
}

// apply is the grader's apply_diff (docs/data-and-grading.md §5.2), as agent.
func apply(t *testing.T, sb sandbox.Sandbox, patch string) {
	t.Helper()
	ctx := context.Background()
	if err := sb.WriteFile(ctx, "/tmp/__cagent_patch__.diff", []byte(patch), 0o644, sandbox.Agent); err != nil {
		t.Fatal(err)
	}
	p := "/tmp/__cagent_patch__.diff"
	res, err := sb.Exec(ctx, sandbox.Cmd{User: sandbox.Agent, Shell: `cd '` + graderRepo + `' && (git apply --whitespace=nowarn ` + p +
		`) || (git apply --3way --whitespace=nowarn ` + p + `) || (patch -p1 --no-backup-if-mismatch < ` + p + `)`})
	if err != nil || res.ExitCode != 0 {
		t.Fatalf("apply: %+v %v\n%s", res, err, patch)
	}
}

// TestCapture is docs/data-and-grading.md §6 case 23: one run per edit state.
func TestCapture(t *testing.T) {
	for _, state := range []string{"unstaged", "staged", "committed"} {
		t.Run(state, func(t *testing.T) {
			ctx := context.Background()
			sb := sandboxtest.Boot(t, helper, sandbox.Options{})
			imageRepo(t, sb)

			before := gitState(t, sb)
			baseline, err := workspace.Snapshot(ctx, sb, agentRepo)
			if err != nil {
				t.Fatal(err)
			}
			if after := gitState(t, sb); after != before {
				t.Fatalf("snapshot touched the index or HEAD:\n%s\n%s", before, after)
			}
			if patch, err := workspace.Diff(ctx, sb, agentRepo, baseline); err != nil || patch != "" {
				t.Fatalf("baseline diff: %q %v", patch, err)
			}

			// The agent's edits.
			if err := sb.WriteFile(ctx, agentRepo+"/source.py", []byte("# image setup\nresult = 42\n"), 0o644, sandbox.Agent); err != nil {
				t.Fatal(err)
			}
			if err := sb.WriteFile(ctx, agentRepo+"/new.bin", []byte("\x00new binary content\xff"), 0o644, sandbox.Agent); err != nil {
				t.Fatal(err)
			}
			switch state {
			case "staged":
				run(t, sb, sandbox.Agent, `cd '`+agentRepo+`' && git add source.py new.bin`)
			case "committed":
				run(t, sb, sandbox.Agent, `cd '`+agentRepo+`' && git add source.py new.bin && git commit -qm agent`)
			}
			run(t, sb, sandbox.Agent, `cd '`+agentRepo+`' && echo task > PROBLEM_STATEMENT.md && mkdir -p .harness && echo log > .harness/log`)

			before = gitState(t, sb)
			patch, err := workspace.Diff(ctx, sb, agentRepo, baseline)
			if err != nil {
				t.Fatal(err)
			}
			if after := gitState(t, sb); after != before {
				t.Fatalf("diff touched the index or HEAD:\n%s\n%s", before, after)
			}
			for _, absent := range []string{"package-lock.json", "PROBLEM_STATEMENT", ".harness"} {
				if strings.Contains(patch, absent) {
					t.Errorf("patch mentions %s:\n%s", absent, patch)
				}
			}
			// new.bin as a binary literal first, then the one source.py hunk.
			wantHunk := "@@ -1,2 +1,2 @@\n # image setup\n-result = 0\n+result = 42\n"
			bin, src := strings.Index(patch, "diff --git a/new.bin b/new.bin\nnew file mode 100644"), strings.Index(patch, "diff --git a/source.py b/source.py")
			if !strings.Contains(patch, "GIT binary patch\nliteral 20\n") || bin < 0 || src < bin || !strings.HasSuffix(patch, wantHunk) {
				t.Fatalf("patch:\n%s", patch)
			}

			apply(t, sb, patch)
			run(t, sb, sandbox.Agent, `cmp '`+agentRepo+`/source.py' '`+graderRepo+`/source.py' && cmp '`+agentRepo+`/new.bin' '`+graderRepo+`/new.bin'`)
			if got := run(t, sb, sandbox.Agent, `cat '`+graderRepo+`/package-lock.json'`); got != "{\"image_dependency\": true}\n" {
				t.Fatalf("grader package-lock.json: %q", got)
			}
		})
	}
}

// TestCoverage is docs/data-and-grading.md §6 case 24 plus the rest of what a patch must carry.
func TestCoverage(t *testing.T) {
	ctx := context.Background()
	sb := sandboxtest.Boot(t, helper, sandbox.Options{})
	imageRepo(t, sb)
	run(t, sb, sandbox.Root, `cd '`+agentRepo+`' && printf 'a\n' > gone.txt && printf '#!/bin/sh\n' > tool.sh && printf 'x\n' > keep.txt && git add . && git -c user.name=t -c user.email=t@e commit -qm more && chown -R agent:agent .`)
	tests := []struct {
		name    string
		edit    string // shell, as agent, in the repo
		want    []string
		notWant []string
	}{
		{"deleted", "rm gone.txt", []string{"diff --git a/gone.txt b/gone.txt\ndeleted file mode 100644"}, nil},
		{"mode change", "chmod +x tool.sh", []string{"old mode 100644\nnew mode 100755"}, nil},
		{"info/exclude", "echo secret.log >> .git/info/exclude && echo s > secret.log", nil, []string{"secret.log"}},
		{"gitignore", "printf 'build/\\n' > .gitignore && mkdir build && echo o > build/out", []string{"+build/"}, []string{"build/out"}},
		{"new file", "mkdir -p pkg && printf 'y\\n' > pkg/new.py", []string{"diff --git a/pkg/new.py b/pkg/new.py\nnew file mode 100644"}, nil},
		{"symlink", "ln -s keep.txt link", []string{"new file mode 120000"}, nil},
		{"rename", "git mv keep.txt kept.txt", []string{"rename from keep.txt\nrename to kept.txt"}, nil},
		{"nothing", "true", nil, []string{"diff --git"}},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			baseline, err := workspace.Snapshot(ctx, sb, agentRepo)
			if err != nil {
				t.Fatal(err)
			}
			run(t, sb, sandbox.Agent, `cd '`+agentRepo+`' && `+tc.edit)
			patch, err := workspace.Diff(ctx, sb, agentRepo, baseline)
			if err != nil {
				t.Fatal(err)
			}
			for _, w := range tc.want {
				if !strings.Contains(patch, w) {
					t.Errorf("patch lacks %q:\n%s", w, patch)
				}
			}
			for _, w := range tc.notWant {
				if strings.Contains(patch, w) {
					t.Errorf("patch has %q:\n%s", w, patch)
				}
			}
			if tc.name == "nothing" && patch != "" {
				t.Errorf("patch %q", patch)
			}
		})
	}

	t.Run("not a repository", func(t *testing.T) {
		run(t, sb, sandbox.Root, "mkdir -p /work/plain && chown agent:agent /work/plain")
		if _, err := workspace.Snapshot(ctx, sb, "/work/plain"); err == nil {
			t.Fatal("snapshot of a plain directory succeeded")
		}
	})
	t.Run("unborn HEAD", func(t *testing.T) {
		run(t, sb, sandbox.Agent, "mkdir -p /tmp/unborn && cd /tmp/unborn && git init -q")
		if _, err := workspace.Snapshot(ctx, sb, "/tmp/unborn"); err == nil {
			t.Fatal("snapshot with an unborn HEAD succeeded")
		}
	})
	t.Run("bad baseline", func(t *testing.T) {
		if _, err := workspace.Diff(ctx, sb, agentRepo, "HEAD; rm -rf /"); err == nil {
			t.Fatal("accepted")
		}
	})
}

// TestLargePatch: a patch beyond the sandbox's output limit arrives whole.
func TestLargePatch(t *testing.T) {
	ctx := context.Background()
	sb := sandboxtest.Boot(t, helper, sandbox.Options{OutputLimit: 4096})
	imageRepo(t, sb)
	baseline, err := workspace.Snapshot(ctx, sb, agentRepo)
	if err != nil {
		t.Fatal(err)
	}
	run(t, sb, sandbox.Agent, `cd '`+agentRepo+`' && seq 1 20000 > big.txt`)
	patch, err := workspace.Diff(ctx, sb, agentRepo, baseline)
	if err != nil {
		t.Fatal(err)
	}
	if !strings.HasSuffix(patch, "+19999\n+20000\n") || strings.Count(patch, "\n+") != 20001 /* 20000 lines and +++ */ {
		t.Fatalf("patch of %d bytes is incomplete", len(patch))
	}
}

// TestPrepare: setup effects and the problem file are in the baseline; the
// problem file reaches the agent.
func TestPrepare(t *testing.T) {
	ctx := context.Background()
	sb := sandboxtest.Boot(t, helper, sandbox.Options{})
	imageRepo(t, sb)
	baseline, err := workspace.Prepare(ctx, sb, agentRepo, workspace.Setup{
		ProblemStatement: "Fix the widget.",
		BeforeRepoSetCmd: "echo before > before.txt",
		PreCommands:      workspace.PreCommandsBody([]any{"echo pre > pre.txt", "", "false", "echo never > never.txt"}),
	})
	if err != nil {
		t.Fatal(err)
	}
	if got := run(t, sb, sandbox.Agent, `cd '`+agentRepo+`' && cat PROBLEM_STATEMENT.md; echo; cat before.txt pre.txt; test -e never.txt || echo no-never; stat -c %U .`); got != "Fix the widget.\nbefore\npre\nno-never\nagent\n" {
		t.Fatalf("workspace after prepare: %q", got)
	}
	patch, err := workspace.Diff(ctx, sb, agentRepo, baseline)
	if err != nil || patch != "" {
		t.Fatalf("setup effects counted as edits: %q %v", patch, err)
	}
}

func TestPreCommandsBody(t *testing.T) {
	tests := []struct {
		in   any
		want string
	}{
		{`a\nb`, "a\nb"},
		{[]string{"a", "", "b"}, "a\nb"},
		{[]any{"a", "", "b"}, "a\nb"},
		{nil, ""},
		{42, ""},
	}
	for _, tc := range tests {
		if got := workspace.PreCommandsBody(tc.in); got != tc.want {
			t.Errorf("%#v: got %q want %q", tc.in, got, tc.want)
		}
	}
}

// TestLocalProvider: capture works through any provider (host git here).
func TestLocalProvider(t *testing.T) {
	ctx := context.Background()
	dir := t.TempDir() + "/agent repo"
	sb, err := sandbox.Boot(ctx, sandbox.Options{Provider: "local", Rootfs: t.TempDir()})
	if err != nil {
		t.Fatal(err)
	}
	defer sb.Close()
	run(t, sb, "", `set -e; mkdir -p '`+dir+`' && cd '`+dir+`' && git init -q && printf 'result = 0\n' > source.py && git add . && git -c user.name=t -c user.email=t@e commit -qm init && printf 'x\n' > image.txt`)
	baseline, err := workspace.Snapshot(ctx, sb, dir)
	if err != nil {
		t.Fatal(err)
	}
	run(t, sb, "", `cd '`+dir+`' && printf 'result = 42\n' > source.py`)
	patch, err := workspace.Diff(ctx, sb, dir, baseline)
	if err != nil || !strings.HasSuffix(patch, "-result = 0\n+result = 42\n") || strings.Contains(patch, "image.txt") {
		t.Fatalf("patch %q %v", patch, err)
	}
}
