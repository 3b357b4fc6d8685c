package sandbox_test

import (
	"context"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/kilnrl/kiln/internal/sandbox"
	"github.com/kilnrl/kiln/internal/sandbox/sandboxtest"
)

// recording records the shell text of every Exec.
type recording struct {
	sandbox.Sandbox
	mu    sync.Mutex
	execs []string
}

func (r *recording) Exec(ctx context.Context, cmd sandbox.Cmd) (sandbox.Result, error) {
	r.mu.Lock()
	r.execs = append(r.execs, cmd.Shell)
	r.mu.Unlock()
	return r.Sandbox.Exec(ctx, cmd)
}

func (r *recording) matching(subs ...string) []string {
	r.mu.Lock()
	defer r.mu.Unlock()
	var out []string
	for _, e := range r.execs {
		all := true
		for _, s := range subs {
			all = all && strings.Contains(e, s)
		}
		if all {
			out = append(out, e)
		}
	}
	return out
}

func TestExecAndWait(t *testing.T) {
	ctx := context.Background()
	sb := &recording{Sandbox: sandboxtest.Boot(t, helper, sandbox.Options{})}
	launches := func() string {
		res, err := sb.Sandbox.Exec(ctx, sandbox.Cmd{Shell: "cat /tmp/launches 2>/dev/null | wc -l"})
		if err != nil {
			t.Fatal(err)
		}
		return strings.TrimSpace(string(res.Stdout))
	}
	fast := 50 * time.Millisecond

	t.Run("same-tag re-run", func(t *testing.T) {
		// Fails on the first launch, succeeds on the second. (The launcher
		// writes the marker after the command, so a command that exits the
		// launcher's shell itself never finishes: hence the subshell.)
		script := `(echo launch >> /tmp/launches; n=$(wc -l < /tmp/launches); if [ "$n" = 1 ]; then printf '%s' 'attempt-1 failed'; exit 1; fi; printf '%s' 'attempt-2 ok')`
		for i, want := range []struct {
			code int
			out  string
		}{{1, "attempt-1 failed"}, {0, "attempt-2 ok"}} {
			code, out, err := sandbox.ExecAndWait(ctx, sb, sandbox.Wait{Shell: script, Budget: 30 * time.Second, Tag: "npm", WantOutput: true, PollInterval: fast})
			if err != nil || code != want.code || out != want.out {
				t.Fatalf("call %d: got (%d, %q, %v); want (%d, %q)", i+1, code, out, err, want.code, want.out)
			}
		}
		if n := launches(); n != "2" {
			t.Fatalf("%s launches", n)
		}
	})

	t.Run("replay dedupe", func(t *testing.T) {
		if _, err := sb.Sandbox.Exec(ctx, sandbox.Cmd{Shell: "rm -f /tmp/launches"}); err != nil {
			t.Fatal(err)
		}
		before := len(sb.matching("setsid"))
		code, _, err := sandbox.ExecAndWait(ctx, sb, sandbox.Wait{Shell: "echo launch >> /tmp/launches", Budget: 30 * time.Second, Tag: "job", User: sandbox.Agent, PollInterval: fast})
		if err != nil || code != 0 {
			t.Fatalf("got %d %v", code, err)
		}
		spawns := sb.matching("setsid")[before:]
		if len(spawns) != 1 {
			t.Fatalf("%d spawns", len(spawns))
		}
		if both := sb.matching("rm -", "setsid"); len(both) != 0 {
			t.Fatalf("cleanup inside the guarded spawn: %q", both)
		}
		// A transport replay of the same spawn does not launch again.
		if _, err := sb.Exec(ctx, sandbox.Cmd{Shell: spawns[0], User: sandbox.Agent, Check: true}); err != nil {
			t.Fatal(err)
		}
		time.Sleep(200 * time.Millisecond)
		if n := launches(); n != "1" {
			t.Fatalf("%s launches after a replay", n)
		}
	})

	t.Run("workdir and env", func(t *testing.T) {
		code, out, err := sandbox.ExecAndWait(ctx, sb, sandbox.Wait{Shell: `pwd; echo $HOME $X; id -un`, Budget: 30 * time.Second, Tag: "wd",
			User: sandbox.Agent, Env: []string{"X=passed"}, Workdir: "/tmp", OutFile: "/tmp/wd output.log", WantOutput: true, PollInterval: fast})
		if err != nil || code != 0 || out != "/tmp\n/home/agent passed\nagent\n" {
			t.Fatalf("got (%d, %q, %v)", code, out, err)
		}
	})

	t.Run("budget and output tail", func(t *testing.T) {
		start := time.Now()
		code, out, err := sandbox.ExecAndWait(ctx, sb, sandbox.Wait{Shell: "sleep 60", Budget: 300 * time.Millisecond, Tag: "slow", PollInterval: fast})
		if err != nil || code != sandbox.BudgetExceeded || time.Since(start) > 5*time.Second {
			t.Fatalf("budget: got (%d, %q, %v) after %s", code, out, err, time.Since(start))
		}
		code, out, err = sandbox.ExecAndWait(ctx, sb, sandbox.Wait{Shell: "echo lots of output", Budget: 30 * time.Second, Tag: "ok", PollInterval: fast})
		if err != nil || code != 0 || out != "" {
			t.Fatalf("exit 0: got (%d, %q, %v)", code, out, err)
		}
		code, out, err = sandbox.ExecAndWait(ctx, sb, sandbox.Wait{Shell: "head -c 2000 /dev/zero | tr '\\0' a; printf END; (exit 3)", Budget: 30 * time.Second, Tag: "fail", PollInterval: fast})
		if err != nil || code != 3 || len(out) != 512 || !strings.HasSuffix(out, "aaaEND") {
			t.Fatalf("exit 3: got (%d, %d bytes %q, %v)", code, len(out), out[max(0, len(out)-10):], err)
		}
		// A done marker that is not a number is an error.
		if _, _, err := sandbox.ExecAndWait(ctx, sb, sandbox.Wait{Shell: "echo garbage > /tmp/.bad.done; sleep 60", Budget: 30 * time.Second, Tag: "bad", PollInterval: fast}); err == nil || !strings.Contains(err.Error(), `"garbage"`) {
			t.Fatalf("bad marker: %v", err)
		}
	})
}
