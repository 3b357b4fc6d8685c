package sandboxinit

import (
	"os"
	"os/exec"
	"slices"
	"syscall"
	"testing"

	"golang.org/x/sys/unix"
)

func TestCappedBuffer(t *testing.T) {
	tests := []struct {
		limit     int
		writes    []string
		kept      string
		total     int64
		truncated bool
	}{
		{5, []string{"ab", "cd"}, "abcd", 4, false},
		{5, []string{"abc", "def"}, "abcde", 6, true},
		{5, []string{"abcde"}, "abcde", 5, false},
		{0, []string{"x"}, "", 1, true},
	}
	for _, tc := range tests {
		b := NewCappedBuffer(tc.limit)
		for _, w := range tc.writes {
			if n, err := b.Write([]byte(w)); n != len(w) || err != nil {
				t.Fatalf("write %q: %d %v", w, n, err)
			}
		}
		if string(b.Bytes()) != tc.kept || b.Total() != tc.total || b.Truncated() != tc.truncated {
			t.Errorf("%+v: kept %q total %d truncated %v", tc, b.Bytes(), b.Total(), b.Truncated())
		}
	}
}

func TestMergeEnv(t *testing.T) {
	got := mergeEnv([]string{"PATH=/bin", "HOME=/root"}, []string{"HOME=/home/a", "X=1", "PATH=/p"})
	if want := []string{"PATH=/p", "HOME=/home/a", "X=1"}; !slices.Equal(got, want) {
		t.Fatalf("got %q want %q", got, want)
	}
}

func TestSessionOf(t *testing.T) {
	// The test's own session may be led by a process outside this pid
	// namespace (CI runners), where the kernel reports session 0; compare
	// with what the kernel says rather than assuming a positive id.
	sid, pgid, ok := sessionOf(os.Getpid())
	wantSid, err := unix.Getsid(0)
	if err != nil {
		t.Fatal(err)
	}
	if !ok || sid != wantSid || pgid != syscall.Getpgrp() {
		t.Fatalf("own session: %d %d %v; kernel says session %d group %d", sid, pgid, ok, wantSid, syscall.Getpgrp())
	}

	// A child that leads its own session reports its pid for both, as the
	// commands init starts do.
	cmd := exec.Command("sleep", "10")
	cmd.SysProcAttr = &syscall.SysProcAttr{Setsid: true}
	if err := cmd.Start(); err != nil {
		t.Fatal(err)
	}
	defer func() { _ = cmd.Process.Kill(); _ = cmd.Wait() }()
	sid, pgid, ok = sessionOf(cmd.Process.Pid)
	if !ok || sid != cmd.Process.Pid || pgid != cmd.Process.Pid {
		t.Fatalf("session leader %d: session %d group %d ok %v", cmd.Process.Pid, sid, pgid, ok)
	}

	if _, _, ok := sessionOf(1 << 30); ok {
		t.Fatal("session of a missing pid")
	}
}
