package sandbox_test

import (
	"bufio"
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"log/slog"
	"net"
	"os"
	"path/filepath"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/kilnrl/kiln/internal/sandbox"
	"github.com/kilnrl/kiln/internal/sandbox/sandboxtest"
)

func TestExec(t *testing.T) {
	sb := sandboxtest.Boot(t, helper, sandbox.Options{MemoryBytes: 512 << 20, PidsMax: 256, OutputLimit: 1000, Env: []string{"IMAGE_VAR=image", "OVERRIDE=image"}})
	ctx := context.Background()
	tests := []struct {
		name   string
		cmd    sandbox.Cmd
		code   int
		stdout string
		stderr string
	}{
		{"shell", sandbox.Cmd{Shell: "echo out; echo err >&2; exit 3"}, 3, "out\n", "err\n"},
		{"argv", sandbox.Cmd{Argv: []string{"printf", "%s|", "a b", "c"}}, 0, "a b|c|", ""},
		{"root", sandbox.Cmd{Shell: "id -un; echo $HOME"}, 0, "root\n/root\n", ""},
		{"agent", sandbox.Cmd{Shell: "id -un; id -u; echo $HOME; echo $USER", User: sandbox.Agent}, 0, "agent\n1000\n/home/agent\nagent\n", ""},
		{"env", sandbox.Cmd{Shell: "echo $IMAGE_VAR $OVERRIDE $CMD_VAR", Env: []string{"OVERRIDE=cmd", "CMD_VAR=x"}}, 0, "image cmd x\n", ""},
		{"dir", sandbox.Cmd{Shell: "pwd", Dir: "/usr/bin"}, 0, "/usr/bin\n", ""},
		{"default dir", sandbox.Cmd{Shell: "pwd"}, 0, "/\n", ""},
		{"stdin", sandbox.Cmd{Argv: []string{"cat"}, Stdin: []byte("in\x00put")}, 0, "in\x00put", ""},
		{"not found", sandbox.Cmd{Argv: []string{"no-such-command"}}, 127, "", "kiln-sandbox: no-such-command: command not found\n"},
		{"signal", sandbox.Cmd{Shell: "kill -9 $$"}, 137, "", ""},
		{"tmp writable by agent", sandbox.Cmd{Shell: "echo x > /tmp/agent-file && cat /tmp/agent-file", User: sandbox.Agent}, 0, "x\n", ""},
		{"hostname", sandbox.Cmd{Argv: []string{"cat", "/proc/sys/kernel/hostname"}}, 0, "sandbox\n", ""},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			res, err := sb.Exec(ctx, tc.cmd)
			if err != nil {
				t.Fatal(err)
			}
			if res.ExitCode != tc.code || string(res.Stdout) != tc.stdout || string(res.Stderr) != tc.stderr {
				t.Fatalf("got exit %d stdout %q stderr %q; want %d %q %q", res.ExitCode, res.Stdout, res.Stderr, tc.code, tc.stdout, tc.stderr)
			}
		})
	}

	t.Run("errors", func(t *testing.T) {
		for _, cmd := range []sandbox.Cmd{
			{Shell: "true", User: "nobody-such"},
			{Shell: "true", Dir: "/no/such/dir"},
			{},
			{Shell: "true", Argv: []string{"true"}},
		} {
			if _, err := sb.Exec(ctx, cmd); err == nil {
				t.Errorf("%+v: no error", cmd)
			}
		}
	})
	t.Run("check", func(t *testing.T) {
		res, err := sb.Exec(ctx, sandbox.Cmd{Shell: "echo bad >&2; false", Check: true})
		var ee *sandbox.ExitError
		if !errors.As(err, &ee) || !strings.HasPrefix(err.Error(), "bwrap exec failed (exit=1): echo bad >&2; false\nbad") || res.ExitCode != 1 {
			t.Fatalf("got %v, %+v", err, res)
		}
	})
	t.Run("state persists", func(t *testing.T) {
		if _, err := sb.Exec(ctx, sandbox.Cmd{Shell: "mkdir -p /opt/x && echo kept > /opt/x/f && useradd -m second", Check: true}); err != nil {
			t.Fatal(err)
		}
		res, err := sb.Exec(ctx, sandbox.Cmd{Shell: "cat /opt/x/f; id -un", User: "second", Check: true})
		if err != nil || string(res.Stdout) != "kept\nsecond\n" {
			t.Fatalf("got %q, %v", res.Stdout, err)
		}
	})
	t.Run("output cap", func(t *testing.T) {
		res, err := sb.Exec(ctx, sandbox.Cmd{Shell: "head -c 5000 /dev/zero; echo short >&2"})
		if err != nil {
			t.Fatal(err)
		}
		if len(res.Stdout) != 1000 || !res.StdoutTruncated || res.StdoutBytes != 5000 || res.StderrTruncated || string(res.Stderr) != "short\n" {
			t.Fatalf("got %d bytes truncated=%v total=%d, stderr %q truncated=%v", len(res.Stdout), res.StdoutTruncated, res.StdoutBytes, res.Stderr, res.StderrTruncated)
		}
	})
	t.Run("cpu time", func(t *testing.T) {
		// A busy loop in a child the shell waits for: its CPU counts; a
		// sleep uses next to none.
		busy, err := sb.Exec(ctx, sandbox.Cmd{Shell: `sh -c 'i=0; while [ $i -lt 200000 ]; do i=$((i+1)); done'`, Check: true})
		if err != nil {
			t.Fatal(err)
		}
		idle, err := sb.Exec(ctx, sandbox.Cmd{Shell: "sleep 0.3", Check: true})
		if err != nil {
			t.Fatal(err)
		}
		if busy.CPU < 20*time.Millisecond || busy.CPU > busy.Duration+10*time.Millisecond || idle.CPU > 50*time.Millisecond {
			t.Fatalf("busy: %s CPU in %s; sleep 0.3: %s CPU", busy.CPU, busy.Duration, idle.CPU)
		}
	})
	t.Run("timeout kills the tree", func(t *testing.T) {
		start := time.Now()
		// A background child holding stdout and a grandchild in a subshell.
		res, err := sb.Exec(ctx, sandbox.Cmd{Shell: "(sleep 301 &); sleep 302 & echo started; sleep 303", Timeout: time.Second})
		elapsed := time.Since(start)
		if err != nil {
			t.Fatal(err)
		}
		if res.ExitCode != sandbox.TimeoutExitCode || !res.TimedOut || string(res.Stdout) != "started\n" {
			t.Fatalf("got %+v", res)
		}
		if elapsed > 3*time.Second {
			t.Fatalf("timeout of 1s returned after %s", elapsed)
		}
		left, err := sb.Exec(ctx, sandbox.Cmd{Shell: "cat /proc/[0-9]*/cmdline | tr '\\0' ' ' | grep -o 'sleep 30[123]' || true"})
		if err != nil || len(left.Stdout) != 0 {
			t.Fatalf("processes left after timeout: %q %v", left.Stdout, err)
		}
	})
	t.Run("no hang on inherited output", func(t *testing.T) {
		for _, tc := range []struct {
			shell string
			code  int
		}{
			{"setsid sleep 304 & echo hi", 0},              // exits, a detached child keeps stdout
			{"setsid sleep 305 & echo hi; sleep 306", 124}, // times out, the detached child survives the kill
		} {
			start := time.Now()
			res, err := sb.Exec(ctx, sandbox.Cmd{Shell: tc.shell, Timeout: time.Second})
			if err != nil || res.ExitCode != tc.code || string(res.Stdout) != "hi\n" || time.Since(start) > 3*time.Second {
				t.Fatalf("%q: %+v %v after %s", tc.shell, res, err, time.Since(start))
			}
		}
	})
	t.Run("cancel", func(t *testing.T) {
		cctx, cancel := context.WithTimeout(ctx, 300*time.Millisecond)
		defer cancel()
		start := time.Now()
		if _, err := sb.Exec(cctx, sandbox.Cmd{Shell: "sleep 60"}); !errors.Is(err, context.DeadlineExceeded) || time.Since(start) > 3*time.Second {
			t.Fatalf("got %v after %s", err, time.Since(start))
		}
	})
	t.Run("concurrent", func(t *testing.T) {
		start := time.Now()
		errs := make(chan error, 8)
		for range 8 {
			go func() {
				res, err := sb.Exec(ctx, sandbox.Cmd{Shell: "sleep 0.5; echo ok", Check: true})
				if err == nil && string(res.Stdout) != "ok\n" {
					err = errors.New(string(res.Stdout))
				}
				errs <- err
			}()
		}
		for range 8 {
			if err := <-errs; err != nil {
				t.Fatal(err)
			}
		}
		if d := time.Since(start); d > 3*time.Second {
			t.Fatalf("8 concurrent 0.5 s commands took %s", d)
		}
	})
}

func TestFiles(t *testing.T) {
	sb := sandboxtest.Boot(t, helper, sandbox.Options{})
	ctx := context.Background()

	// Default limits (2 GiB, the reference's memory_mb 2048; docs/data-and-grading.md §3.3), read from the host side of the
	// cgroup the commands run in.
	res, err := sb.Exec(ctx, sandbox.Cmd{Shell: "grep -E ':(memory|pids):' /proc/self/cgroup", Check: true})
	if err != nil {
		t.Fatal(err)
	}
	limits := map[string]string{"memory": "memory.limit_in_bytes", "pids": "pids.max"}
	want := map[string]string{"memory": strconv.Itoa(sandbox.DefaultMemoryBytes), "pids": strconv.Itoa(sandbox.DefaultPidsMax)}
	for _, line := range strings.Split(strings.TrimSpace(string(res.Stdout)), "\n") {
		f := strings.SplitN(line, ":", 3)
		b, err := os.ReadFile(filepath.Join("/sys/fs/cgroup", f[1], f[2], limits[f[1]]))
		if err != nil || strings.TrimSpace(string(b)) != want[f[1]] || !strings.Contains(f[2], "kiln-"+sb.ID()) {
			t.Errorf("%s limit of %s: %q %v; want %s", f[1], f[2], b, err, want[f[1]])
		}
		delete(want, f[1])
	}
	if len(want) > 0 {
		t.Errorf("commands not in a %v cgroup: %s", want, res.Stdout)
	}
	if err := sb.WriteFile(ctx, "/home/agent/.claude/settings.json", []byte(`{"x":1}`), 0o600, sandbox.Agent); err != nil {
		t.Fatal(err)
	}
	res, err = sb.Exec(ctx, sandbox.Cmd{Shell: "stat -c '%U:%G %a' /home/agent/.claude /home/agent/.claude/settings.json", Check: true})
	if err != nil || string(res.Stdout) != "agent:agent 755\nagent:agent 600\n" {
		t.Fatalf("ownership: %q %v", res.Stdout, err)
	}
	bin := []byte{0, 1, 2, 255, '\n'}
	if err := sb.WriteFile(ctx, "/opt/new/dir/f.bin", bin, 0o755, ""); err != nil {
		t.Fatal(err)
	}
	got, err := sb.ReadFile(ctx, "/opt/new/dir/f.bin")
	if err != nil || !bytes.Equal(got, bin) {
		t.Fatalf("read back %q %v", got, err)
	}
	// The agent cannot write where it has no permission.
	if err := sb.WriteFile(ctx, "/etc/agent-was-here", []byte("x"), 0o644, sandbox.Agent); err == nil {
		t.Fatal("agent wrote into /etc")
	}
	if _, err := sb.ReadFile(ctx, "/no/such/file"); err == nil {
		t.Fatal("read of a missing file succeeded")
	}
	// Only regular files are read: a FIFO (which would block) and a device
	// (which would never end) are refused at once.
	if _, err := sb.Exec(ctx, sandbox.Cmd{Shell: "mkfifo /tmp/fifo", Check: true}); err != nil {
		t.Fatal(err)
	}
	for _, p := range []string{"/tmp/fifo", "/dev/zero", "/tmp"} {
		start := time.Now()
		if _, err := sb.ReadFile(ctx, p); err == nil || !strings.Contains(err.Error(), "not a regular file") || time.Since(start) > 5*time.Second {
			t.Errorf("read of %s: %v after %s, want \"not a regular file\" at once", p, err, time.Since(start))
		}
	}
	if err := sb.WriteFile(ctx, "relative", nil, 0o644, ""); err == nil {
		t.Fatal("relative path accepted")
	}
}

func TestArtifacts(t *testing.T) {
	dir := filepath.Join(t.TempDir(), "artifacts", "sb1")
	sb := sandboxtest.Boot(t, helper, sandbox.Options{
		Artifacts:     sandbox.DirSink(dir),
		ArtifactFiles: []string{"/tmp/.eval.out", "/tmp/missing.log"},
	})
	ctx := context.Background()
	var rec sandbox.SandboxRecord
	b, err := os.ReadFile(filepath.Join(dir, "sandbox.json"))
	if err != nil || json.Unmarshal(b, &rec) != nil || rec.ID != sb.ID() || rec.Provider != "bwrap" || rec.PID == 0 {
		t.Fatalf("sandbox.json at boot: %s %v", b, err)
	}
	_, _ = sb.Exec(ctx, sandbox.Cmd{Shell: "echo graded > /tmp/.eval.out"})
	_, _ = sb.Exec(ctx, sandbox.Cmd{Shell: "echo out; echo err >&2; exit 1", User: sandbox.Agent, Check: true})
	if err := sb.Close(); err != nil {
		t.Fatal(err)
	}
	f, err := os.Open(filepath.Join(dir, "commands.jsonl"))
	if err != nil {
		t.Fatal(err)
	}
	defer f.Close()
	var recs []sandbox.CommandRecord
	sc := bufio.NewScanner(f)
	for sc.Scan() {
		var r sandbox.CommandRecord
		if err := json.Unmarshal(sc.Bytes(), &r); err != nil {
			t.Fatal(err)
		}
		recs = append(recs, r)
	}
	if len(recs) != 2 {
		t.Fatalf("%d records", len(recs))
	}
	r := recs[1]
	if r.Seq != 2 || r.Command != "echo out; echo err >&2; exit 1" || r.User != "agent" || r.ExitCode != 1 ||
		r.Stdout != "out\n" || r.Stderr != "err\n" || r.Started.IsZero() || r.DurationMs <= 0 {
		t.Fatalf("checked failing command record: %+v", r)
	}
	if b, err := os.ReadFile(filepath.Join(dir, "files", ".eval.out")); err != nil || string(b) != "graded\n" {
		t.Fatalf("files/.eval.out: %q %v", b, err)
	}
	if _, err := os.Stat(filepath.Join(dir, "files", "missing.log")); !os.IsNotExist(err) {
		t.Fatalf("missing file saved: %v", err)
	}

	t.Run("never overwritten", func(t *testing.T) {
		// The same location again: sandbox.json exists, so boot fails and
		// leaves nothing behind.
		state := t.TempDir()
		_, err := sandbox.Boot(ctx, sandbox.Options{Rootfs: sandboxtest.Require(t), HelperPath: helper, StateDir: state, Artifacts: sandbox.DirSink(dir)})
		if !errors.Is(err, os.ErrExist) {
			t.Fatalf("got %v", err)
		}
		assertNoLeak(t, state)
	})
	t.Run("unwritable location", func(t *testing.T) {
		file := filepath.Join(t.TempDir(), "file")
		if err := os.WriteFile(file, nil, 0o644); err != nil {
			t.Fatal(err)
		}
		state := t.TempDir()
		_, err := sandbox.Boot(ctx, sandbox.Options{Rootfs: sandboxtest.Require(t), HelperPath: helper, StateDir: state, Artifacts: sandbox.DirSink(file)})
		if err == nil {
			t.Fatal("boot succeeded")
		}
		assertNoLeak(t, state)
	})
	t.Run("a slow file does not hold close up", func(t *testing.T) {
		// A FIFO is skipped at once (not a regular file: reading it would
		// block); a file too big to move within ArtifactTimeout is cut off
		// by it: Close warns, skips the rest and still kills the sandbox.
		adir := filepath.Join(t.TempDir(), "a")
		var log bytes.Buffer
		state := t.TempDir()
		sb, err := sandbox.Boot(ctx, sandbox.Options{Rootfs: sandboxtest.Require(t), HelperPath: helper, StateDir: state,
			Artifacts: sandbox.DirSink(adir), ArtifactFiles: []string{"/tmp/fifo", "/tmp/ok", "/tmp/big", "/tmp/after"},
			ArtifactTimeout: 200 * time.Millisecond, Log: slog.New(slog.NewTextHandler(&log, &slog.HandlerOptions{Level: slog.LevelDebug}))})
		if err != nil {
			t.Fatal(err)
		}
		if _, err := sb.Exec(ctx, sandbox.Cmd{Shell: "mkfifo /tmp/fifo && echo x > /tmp/ok && truncate -s 240M /tmp/big && echo x > /tmp/after", Check: true}); err != nil {
			t.Fatal(err)
		}
		start := time.Now()
		if err := sb.Close(); err != nil {
			t.Fatalf("close: %v", err)
		}
		if d := time.Since(start); d > 30*time.Second {
			t.Fatalf("close took %s with a 200ms ArtifactTimeout", d)
		}
		assertNoLeak(t, state)
		if _, err := os.Stat(filepath.Join(adir, "commands.jsonl")); err != nil {
			t.Fatal(err)
		}
		if b, err := os.ReadFile(filepath.Join(adir, "files", "ok")); err != nil || string(b) != "x\n" {
			t.Errorf("files/ok: %q %v, want it saved", b, err)
		}
		for _, f := range []string{"fifo", "big", "after"} {
			if _, err := os.Stat(filepath.Join(adir, "files", f)); !os.IsNotExist(err) {
				t.Errorf("files/%s saved: %v", f, err)
			}
		}
		if !strings.Contains(log.String(), "not a regular file") {
			t.Errorf("no debug line on the FIFO: %s", log.String())
		}
		if !strings.Contains(log.String(), "ArtifactTimeout ran out") || !strings.Contains(log.String(), "/tmp/after") {
			t.Errorf("no warning naming the files left: %s", log.String())
		}
	})
	t.Run("close still kills when saving fails", func(t *testing.T) {
		adir := filepath.Join(t.TempDir(), "a")
		state := t.TempDir()
		sb, err := sandbox.Boot(ctx, sandbox.Options{Rootfs: sandboxtest.Require(t), HelperPath: helper, StateDir: state, Artifacts: sandbox.DirSink(adir)})
		if err != nil {
			t.Fatal(err)
		}
		if err := os.WriteFile(filepath.Join(adir, "commands.jsonl"), nil, 0o644); err != nil {
			t.Fatal(err)
		}
		if err := sb.Close(); !errors.Is(err, os.ErrExist) {
			t.Fatalf("close: %v", err)
		}
		assertNoLeak(t, state)
		if err2 := sb.Close(); err2 == nil || err2.Error() != sb.Close().Error() {
			t.Fatalf("second close: %v", err2)
		}
		if _, err := sb.Exec(ctx, sandbox.Cmd{Shell: "true"}); err == nil {
			t.Fatal("exec after close succeeded")
		}
	})
}

// assertNoLeak checks that no sandbox state, mount or cgroup is left.
func assertNoLeak(t *testing.T, state string) {
	t.Helper()
	if ents, _ := os.ReadDir(state); len(ents) != 0 {
		t.Errorf("state left in %s: %v", state, ents)
	}
	if b, _ := os.ReadFile("/proc/self/mountinfo"); bytes.Contains(b, []byte(state)) {
		t.Errorf("mount left under %s", state)
	}
	// Sandboxes of other test packages may be alive meanwhile; theirs hold
	// init's spawner thread, a leaked cgroup holds nothing.
	empty := func() map[string]bool {
		out := map[string]bool{}
		m, _ := filepath.Glob("/sys/fs/cgroup/pids/kiln-*")
		for _, d := range m {
			if b, err := os.ReadFile(filepath.Join(d, "tasks")); err == nil && len(bytes.TrimSpace(b)) == 0 {
				out[d] = true
			}
		}
		return out
	}
	first := empty()
	time.Sleep(200 * time.Millisecond)
	for d := range empty() {
		if first[d] {
			t.Errorf("cgroup left: %s", d)
		}
	}
}

func TestProviders(t *testing.T) {
	ctx := context.Background()
	if _, err := sandbox.Boot(ctx, sandbox.Options{Provider: "misspelled"}); err == nil || !strings.Contains(err.Error(), `unknown sandbox provider "misspelled"; expected bwrap or local`) {
		t.Fatalf("got %v", err)
	}
	if _, err := sandbox.Boot(ctx, sandbox.Options{Provider: "bwrap", Rootfs: filepath.Join(t.TempDir(), "missing"), HelperPath: helper}); err == nil || !strings.Contains(err.Error(), "missing") {
		t.Fatalf("missing rootfs: %v", err)
	}

	t.Run("failed boots leave nothing", func(t *testing.T) {
		root := sandboxtest.Require(t)
		for _, tc := range []struct {
			name string
			opts sandbox.Options
			want string
		}{
			{"bwrap fails", sandbox.Options{Bwrap: "/bin/false"}, "did not start"},
			{"helper missing", sandbox.Options{HelperPath: "/nonexistent/kiln-sandbox-helper"}, "/nonexistent/kiln-sandbox-helper"},
		} {
			state := t.TempDir()
			tc.opts.Rootfs, tc.opts.StateDir = root, state
			if tc.opts.HelperPath == "" {
				tc.opts.HelperPath = helper
			}
			if _, err := sandbox.Boot(ctx, tc.opts); err == nil || !strings.Contains(err.Error(), tc.want) {
				t.Errorf("%s: got %v, want an error mentioning %q", tc.name, err, tc.want)
			}
			assertNoLeak(t, state)
		}
	})

	t.Run("local", func(t *testing.T) {
		var logs bytes.Buffer
		dir := t.TempDir()
		sb, err := sandbox.Boot(ctx, sandbox.Options{Provider: "local", Rootfs: dir, OutputLimit: 4, Log: slog.New(slog.NewTextHandler(&logs, nil))})
		if err != nil {
			t.Fatal(err)
		}
		defer sb.Close()
		if !strings.Contains(logs.String(), "level=WARN") || !strings.Contains(logs.String(), "no isolation") {
			t.Fatalf("no warning logged: %q", logs.String())
		}
		res, err := sb.Exec(ctx, sandbox.Cmd{Shell: "pwd; exit 2"})
		if err != nil || res.ExitCode != 2 || string(res.Stdout) != dir[:4] || !res.StdoutTruncated {
			t.Fatalf("got %+v %v", res, err)
		}
		start := time.Now()
		res, err = sb.Exec(ctx, sandbox.Cmd{Shell: "sleep 30", Timeout: 200 * time.Millisecond})
		if err != nil || res.ExitCode != 124 || time.Since(start) > 2*time.Second {
			t.Fatalf("timeout: %+v %v", res, err)
		}
		p := filepath.Join(dir, "a", "b")
		if err := sb.WriteFile(ctx, p, []byte("x"), 0o644, sandbox.Agent); err != nil {
			t.Fatal(err)
		}
		if b, err := sb.ReadFile(ctx, p); err != nil || string(b) != "x" {
			t.Fatalf("read %q %v", b, err)
		}
		// Kill: what a command left running in its session is killed.
		res, err = sb.Exec(ctx, sandbox.Cmd{Shell: "sleep 1000 >/dev/null 2>&1 & echo $!"})
		if err != nil {
			t.Fatal(err)
		}
		pid, err := strconv.Atoi(strings.TrimSpace(string(res.Stdout)))
		if err != nil {
			t.Fatalf("pid %q: %v", res.Stdout, err)
		}
		if err := sb.Kill(ctx, sandbox.Agent); err != nil {
			t.Fatal(err)
		}
		for deadline := time.Now().Add(5 * time.Second); ; time.Sleep(10 * time.Millisecond) {
			b, err := os.ReadFile(fmt.Sprintf("/proc/%d/stat", pid))
			if err != nil || strings.Contains(string(b), ") Z ") {
				break
			}
			if time.Now().After(deadline) {
				t.Fatalf("local Kill left pid %d running: %s", pid, b)
			}
		}
	})
}

func TestBootLimiter(t *testing.T) {
	lim := sandbox.NewLimiter(1)
	ctx := context.Background()
	sbs := make(chan sandbox.Sandbox, 3)
	errs := make(chan error, 3)
	for range 3 {
		go func() {
			sb, err := sandbox.Boot(ctx, sandbox.Options{Rootfs: sandboxtest.Require(t), HelperPath: helper, BootLimiter: lim})
			errs <- err
			sbs <- sb
		}()
	}
	for range 3 {
		if err := <-errs; err != nil {
			t.Fatal(err)
		}
		sb := <-sbs
		if _, err := sb.Exec(ctx, sandbox.Cmd{Shell: "true", Check: true}); err != nil {
			t.Fatal(err)
		}
		if err := sb.Close(); err != nil {
			t.Fatal(err)
		}
	}
	// While the only slot is held elsewhere, a boot waits for it.
	if err := lim.Acquire(ctx); err != nil {
		t.Fatal(err)
	}
	cctx, cancel := context.WithTimeout(ctx, 200*time.Millisecond)
	defer cancel()
	if _, err := sandbox.Boot(cctx, sandbox.Options{Rootfs: sandboxtest.Require(t), HelperPath: helper, BootLimiter: lim}); !errors.Is(err, context.DeadlineExceeded) {
		t.Fatalf("boot with the slot held: %v", err)
	}
	lim.Release()
	sb, err := sandbox.Boot(ctx, sandbox.Options{Rootfs: sandboxtest.Require(t), HelperPath: helper, BootLimiter: lim})
	if err != nil {
		t.Fatalf("boot after release: %v", err)
	}
	if err := sb.Close(); err != nil {
		t.Fatal(err)
	}
}

// TestMinimalImage: a rootfs with no shell and no libc works (the helper is
// static), and the agent user takes the first free uid.
func TestMinimalImage(t *testing.T) {
	sandboxtest.Require(t)
	root := t.TempDir()
	files := map[string]string{
		"etc/passwd": "root:x:0:0:root:/root:/bin/sh\ndebian:x:1000:1000::/home/debian:/bin/sh", // no final newline
		"etc/group":  "root:x:0:\ndebian:x:1000:\n",
	}
	for name, content := range files {
		p := filepath.Join(root, name)
		if err := os.MkdirAll(filepath.Dir(p), 0o755); err != nil {
			t.Fatal(err)
		}
		if err := os.WriteFile(p, []byte(content), 0o644); err != nil {
			t.Fatal(err)
		}
	}
	sb := sandboxtest.Boot(t, helper, sandbox.Options{Rootfs: root})
	ctx := context.Background()
	got, err := sb.ReadFile(ctx, "/etc/passwd")
	if err != nil {
		t.Fatal(err)
	}
	if want := files["etc/passwd"] + "\nagent:x:1001:1001::/home/agent:/bin/sh\n"; string(got) != want {
		t.Fatalf("passwd %q, want %q", got, want)
	}
	if err := sb.WriteFile(ctx, "/home/agent/f", []byte("x"), 0o600, sandbox.Agent); err != nil {
		t.Fatal(err)
	}
	res, err := sb.Exec(ctx, sandbox.Cmd{Shell: "true"})
	if err != nil || res.ExitCode != 127 {
		t.Fatalf("bash in an image without it: %+v %v", res, err)
	}
	// The image itself is untouched.
	if b, _ := os.ReadFile(filepath.Join(root, "etc/passwd")); string(b) != files["etc/passwd"] {
		t.Fatalf("image passwd changed: %q", b)
	}
}

// TestServeEndpoint: with Options.ServeEndpoint the commands' connections
// to Endpoint() are served in this process from the unix socket, with no
// TCP port between; Close closes the listener, so the server returns; a
// sandbox given both ways out, or the local provider given this one, is
// refused.
func TestServeEndpoint(t *testing.T) {
	ctx := context.Background()
	served := make(chan string, 4)
	done := make(chan error, 1)
	serve := func(ln net.Listener) {
		served <- ln.Addr().Network()
		for {
			c, err := ln.Accept()
			if err != nil {
				done <- err
				return
			}
			fmt.Fprintf(c, "hello from this process\n")
			c.Close()
		}
	}
	sb := sandboxtest.Boot(t, helper, sandbox.Options{ServeEndpoint: serve})
	if got := <-served; got != "unix" {
		t.Fatalf("listener network %q, want unix", got)
	}
	if sb.Endpoint() != "127.0.0.1:18080" {
		t.Fatalf("endpoint %q", sb.Endpoint())
	}
	res, err := sb.Exec(ctx, sandbox.Cmd{Shell: "exec 3<>/dev/tcp/127.0.0.1/18080 && head -n1 <&3", User: sandbox.Agent, Timeout: 10 * time.Second, Check: true})
	if err != nil || string(res.Stdout) != "hello from this process\n" {
		t.Fatalf("through the endpoint: %q %v", res.Stdout, err)
	}
	if err := sb.Close(); err != nil {
		t.Fatal(err)
	}
	select {
	case err := <-done:
		if !errors.Is(err, net.ErrClosed) {
			t.Fatalf("Accept after Close: %v, want net.ErrClosed", err)
		}
	case <-time.After(10 * time.Second):
		t.Fatal("the server still accepts after Close")
	}

	both := sandbox.Options{Rootfs: sandboxtest.Require(t), HelperPath: helper, Endpoint: "127.0.0.1:1", ServeEndpoint: serve}
	if _, err := sandbox.Boot(ctx, both); err == nil || !strings.Contains(err.Error(), "not both") {
		t.Fatalf("both ways out: %v", err)
	}
	local := sandbox.Options{Provider: "local", Rootfs: t.TempDir(), ServeEndpoint: serve}
	if _, err := sandbox.Boot(ctx, local); err == nil || !strings.Contains(err.Error(), "ServeEndpoint") {
		t.Fatalf("local provider: %v", err)
	}
}
