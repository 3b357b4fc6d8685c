package sandbox_test

import (
	"context"
	"crypto/sha256"
	"encoding/hex"
	"fmt"
	"io/fs"
	"net"
	"os"
	"os/exec"
	"path/filepath"
	"strconv"
	"strings"
	"syscall"
	"testing"
	"time"

	"golang.org/x/sys/unix"

	"github.com/kilnrl/kiln/internal/sandbox"
	"github.com/kilnrl/kiln/internal/sandbox/sandboxtest"
)

// treeHash hashes every path, type, mode, owner, size, mtime and ctime under
// root: any write, chmod, chown, create or delete changes it.
func treeHash(t *testing.T, root string) string {
	t.Helper()
	h := sha256.New()
	err := filepath.WalkDir(root, func(p string, d fs.DirEntry, err error) error {
		if err != nil {
			return err
		}
		fi, err := d.Info()
		if err != nil {
			return err
		}
		st := fi.Sys().(*syscall.Stat_t)
		fmt.Fprintf(h, "%s %o %d:%d %d %d.%d %d.%d\n", p, fi.Mode(), st.Uid, st.Gid, fi.Size(), st.Mtim.Sec, st.Mtim.Nsec, st.Ctim.Sec, st.Ctim.Nsec)
		return nil
	})
	if err != nil {
		t.Fatal(err)
	}
	return hex.EncodeToString(h.Sum(nil))
}

func fileHash(t *testing.T, p string) string {
	t.Helper()
	b, err := os.ReadFile(p)
	if err != nil {
		t.Fatal(err)
	}
	s := sha256.Sum256(b)
	return hex.EncodeToString(s[:])
}

func TestIsolation(t *testing.T) {
	root := sandboxtest.Require(t)
	ctx := context.Background()

	// The forwarded endpoint: a host TCP server on loopback.
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	defer ln.Close()
	go func() {
		for {
			c, err := ln.Accept()
			if err != nil {
				return
			}
			fmt.Fprintf(c, "hello from host\n")
			c.Close()
		}
	}()
	// A second host server that must stay unreachable.
	other, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	defer other.Close()

	// A host process the sandbox must not see or signal.
	sleeper := exec.Command("sleep", "300")
	if err := sleeper.Start(); err != nil {
		t.Fatal(err)
	}
	defer func() { _ = sleeper.Process.Kill(); _ = sleeper.Wait() }()
	hostPid := sleeper.Process.Pid

	lowerBefore := treeHash(t, root)
	hostFiles := []string{"/etc/passwd", "/etc/hostname", "/etc/hosts"}
	hostBefore := map[string]string{}
	for _, f := range hostFiles {
		if _, err := os.Stat(f); err == nil {
			hostBefore[f] = fileHash(t, f)
		}
	}
	marker := filepath.Join(t.TempDir(), "host-marker")
	if err := os.WriteFile(marker, []byte("host"), 0o600); err != nil {
		t.Fatal(err)
	}

	sb := sandboxtest.Boot(t, helper, sandbox.Options{MemoryBytes: 128 << 20, PidsMax: 64, Endpoint: ln.Addr().String()})
	if sb.Endpoint() != "127.0.0.1:18080" {
		t.Fatalf("endpoint %q", sb.Endpoint())
	}
	_, hostPort, _ := net.SplitHostPort(ln.Addr().String())
	_, otherPort, _ := net.SplitHostPort(other.Addr().String())
	connect := func(port string) string {
		return "exec 3<>/dev/tcp/127.0.0.1/" + port + " && head -n1 <&3"
	}

	tests := []struct {
		name string
		cmd  sandbox.Cmd
		ok   bool   // exit 0 expected
		out  string // stdout expected when ok
	}{
		{"root-only file unreadable by agent", sandbox.Cmd{Shell: "cat /etc/shadow", User: sandbox.Agent}, false, ""},
		{"root-only file readable by root", sandbox.Cmd{Shell: "test -r /etc/shadow && echo yes"}, true, "yes\n"},
		{"agent cannot write the image's files", sandbox.Cmd{Shell: "echo x >> /usr/bin/git", User: sandbox.Agent}, false, ""},
		{"agent cannot escalate with su", sandbox.Cmd{Shell: "su -c id root </dev/null", User: sandbox.Agent}, false, ""},
		{"host process invisible", sandbox.Cmd{Shell: "test -e /proc/" + strconv.Itoa(hostPid) + "/cmdline && cat /proc/" + strconv.Itoa(hostPid) + "/cmdline | grep -a 'sleep.300'", User: sandbox.Agent}, false, ""},
		{"host process unsignalable by root", sandbox.Cmd{Shell: "kill -9 " + strconv.Itoa(hostPid)}, false, ""},
		{"no host sleep in the process list", sandbox.Cmd{Shell: "cat /proc/[0-9]*/cmdline | tr '\\0' ' ' | grep -c 'slee[p] 300'"}, false, ""},
		{"only loopback", sandbox.Cmd{Shell: "tail -n +3 /proc/net/dev | cut -d: -f1 | tr -d ' '"}, true, "lo\n"},
		{"host port unreachable", sandbox.Cmd{Shell: connect(hostPort), User: sandbox.Agent, Timeout: 10 * time.Second}, false, ""},
		{"other host port unreachable", sandbox.Cmd{Shell: connect(otherPort), User: sandbox.Agent, Timeout: 10 * time.Second}, false, ""},
		{"outside address unreachable", sandbox.Cmd{Shell: "exec 3<>/dev/tcp/1.1.1.1/80", Timeout: 10 * time.Second}, false, ""},
		{"endpoint reachable", sandbox.Cmd{Shell: connect("18080"), User: sandbox.Agent, Timeout: 10 * time.Second}, true, "hello from host\n"},
		{"host files invisible", sandbox.Cmd{Shell: "cat " + marker}, false, ""},
		{"only the helper and the endpoint socket are shared", sandbox.Cmd{Shell: "ls /run/kiln"}, true, "endpoint.sock\nhelper\n"},
		{"shared files are read-only", sandbox.Cmd{Shell: "echo x >> /run/kiln/helper || echo x >> /run/kiln/endpoint.sock || rm /run/kiln/endpoint.sock"}, false, ""},
		{"no mounting", sandbox.Cmd{Shell: "mkdir -p /mnt/x && mount -t tmpfs none /mnt/x"}, false, ""},
		{"no device nodes", sandbox.Cmd{Shell: "mknod /tmp/vda b 253 0"}, false, ""},
		// The sandbox's root is the host's uid 0 (no user namespace): a
		// writable /proc/sys would let it set host-wide sysctls, and
		// kernel.core_pattern runs a program as host root. Writing back the
		// current value changes nothing even if it were allowed.
		{"host sysctls read-only to root", sandbox.Cmd{Shell: `v=$(cat /proc/sys/kernel/core_pattern) && echo "$v" > /proc/sys/kernel/core_pattern`}, false, ""},
		{"host page cache not droppable", sandbox.Cmd{Shell: "echo 1 > /proc/sys/vm/drop_caches"}, false, ""},
		// The seccomp filter (seccomp.go): in force for every command, and
		// each case below succeeds on this host without it.
		{"seccomp filter in force", sandbox.Cmd{Shell: "grep '^Seccomp:' /proc/self/status | tr -d ' \\t'"}, true, "Seccomp:2\n"},
		{"no user namespaces for root", sandbox.Cmd{Shell: "unshare -U true"}, false, ""},
		{"no user namespaces for the agent", sandbox.Cmd{Shell: "unshare -U true", User: sandbox.Agent}, false, ""},
		{"host root's keyring refused", sandbox.Cmd{Shell: syscallProbe(unix.SYS_KEYCTL, "0, -4, 0")}, true, "-1 1\n"},
		{"io_uring absent", sandbox.Cmd{Shell: syscallProbe(unix.SYS_IO_URING_SETUP, "1, ctypes.create_string_buffer(120)"), User: sandbox.Agent}, true, "-1 38\n"},
		{"root writes stay in the overlay", sandbox.Cmd{Shell: "echo evil >> /etc/passwd && echo evil > /etc/hostname && echo evil > /etc/hosts && rm -rf /usr/share/doc && touch /usr/bin/git && echo done"}, true, "done\n"},
		{"agent installs into its home", sandbox.Cmd{Shell: "mkdir -p ~/.local/bin && printf '#!/bin/sh\\necho tool\\n' > ~/.local/bin/tool && chmod +x ~/.local/bin/tool && ~/.local/bin/tool", User: sandbox.Agent}, true, "tool\n"},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			res, err := sb.Exec(ctx, tc.cmd)
			if err != nil {
				t.Fatal(err)
			}
			if (res.ExitCode == 0) != tc.ok || (tc.ok && string(res.Stdout) != tc.out) {
				t.Fatalf("exit %d stdout %q stderr %q; want ok=%v stdout %q", res.ExitCode, res.Stdout, res.Stderr, tc.ok, tc.out)
			}
		})
	}
	if err := sleeper.Process.Signal(syscall.Signal(0)); err != nil {
		t.Fatalf("host sleep was killed: %v", err)
	}

	t.Run("fork bomb hits the pids limit", func(t *testing.T) {
		start := time.Now()
		res, err := sb.Exec(ctx, sandbox.Cmd{Shell: "bomb() { bomb | bomb; }; bomb", User: sandbox.Agent, Timeout: 5 * time.Second})
		if err != nil {
			t.Fatal(err)
		}
		if !res.PidsLimited || res.ExitCode == 0 {
			t.Fatalf("pids limit not hit: %+v", res)
		}
		t.Logf("fork bomb: exit %d after %s", res.ExitCode, time.Since(start))
		// The sandbox recovers: the bomb is gone and new commands run.
		after, err := sb.Exec(ctx, sandbox.Cmd{Shell: "ls -d /proc/[0-9]* | wc -l", Check: true})
		if err != nil {
			t.Fatal(err)
		}
		if n, _ := strconv.Atoi(strings.TrimSpace(string(after.Stdout))); n > 5 {
			t.Fatalf("%d processes left after the fork bomb", n)
		}
	})
	t.Run("Kill empties the agent's processes, a fork bomb's too", func(t *testing.T) {
		// Left running in the background, as an agent may: a sleeper and a
		// fork bomb holding the sandbox at its pids limit, so no new
		// process (a kill shell) could start. Root's sleeper stays.
		if _, err := sb.Exec(ctx, sandbox.Cmd{Shell: "setsid sleep 1000 >/dev/null 2>&1 </dev/null &", Check: true}); err != nil {
			t.Fatal(err)
		}
		if _, err := sb.Exec(ctx, sandbox.Cmd{Shell: "setsid sleep 1000 >/dev/null 2>&1 </dev/null & " +
			"setsid bash -c 'bomb() { bomb | bomb & }; bomb' >/dev/null 2>&1 </dev/null &", User: sandbox.Agent, Check: true}); err != nil {
			t.Fatal(err)
		}
		time.Sleep(300 * time.Millisecond)
		if res, err := sb.Exec(ctx, sandbox.Cmd{Shell: "true", User: sandbox.Agent}); err == nil && !res.PidsLimited && res.ExitCode == 0 {
			t.Log("the fork bomb has not reached the pids limit yet")
		}
		start := time.Now()
		if err := sb.Kill(ctx, sandbox.Agent); err != nil {
			t.Fatal(err)
		}
		t.Logf("Kill took %s", time.Since(start))
		count := `n=0; r=0; for s in /proc/[0-9]*/status; do u=$(awk '/^Uid:/{print $2}' "$s" 2>/dev/null); st=$(awk '/^State:/{print $2}' "$s" 2>/dev/null); ` +
			`[ "$st" = Z ] && continue; [ "$u" = "$(id -u agent)" ] && n=$((n+1)); done; ` +
			`for c in /proc/[0-9]*/cmdline; do tr '\0' ' ' <"$c" 2>/dev/null | grep -q '^sleep 1000' && r=$((r+1)); done; echo $n $r`
		res, err := sb.Exec(ctx, sandbox.Cmd{Shell: count, Check: true})
		if err != nil {
			t.Fatal(err)
		}
		if got := strings.TrimSpace(string(res.Stdout)); got != "0 1" {
			t.Fatalf("agent processes and sleepers left after Kill: %q, want \"0 1\" (none of agent's, root's sleeper)", got)
		}
		if err := sb.Kill(ctx, sandbox.Root); err == nil || !strings.Contains(err.Error(), "refusing") {
			t.Fatalf("Kill of root: %v, want a refusal", err)
		}
		if err := sb.Kill(ctx, "nosuchuser"); err == nil || !strings.Contains(err.Error(), `"nosuchuser"`) {
			t.Fatalf("Kill of an unknown user: %v", err)
		}
	})
	t.Run("memory hog hits the memory limit", func(t *testing.T) {
		res, err := sb.Exec(ctx, sandbox.Cmd{Shell: "python3 -c \"x = 'a' * (512 << 20); print(len(x))\"", User: sandbox.Agent, Timeout: 60 * time.Second})
		if err != nil {
			t.Fatal(err)
		}
		if res.ExitCode == 0 || !res.OOMKilled {
			t.Fatalf("memory hog: %+v", res)
		}
		if res, err := sb.Exec(ctx, sandbox.Cmd{Shell: "echo alive", Check: true}); err != nil || string(res.Stdout) != "alive\n" {
			t.Fatalf("sandbox dead after OOM: %+v %v", res, err)
		}
	})

	if err := sb.Close(); err != nil {
		t.Fatal(err)
	}
	if got := treeHash(t, root); got != lowerBefore {
		t.Fatal("the image rootfs changed")
	}
	for f, h := range hostBefore {
		if fileHash(t, f) != h {
			t.Fatalf("host file %s changed", f)
		}
	}
}

// syscallProbe is a shell command that makes one raw system call from
// Python and prints its result and errno.
func syscallProbe(nr int, args string) string {
	return fmt.Sprintf(`python3 -c 'import ctypes; libc = ctypes.CDLL(None, use_errno=True); r = libc.syscall(%d, %s); print(r, ctypes.get_errno() if r < 0 else 0)'`, nr, args)
}
