// Package testenv holds the repository's rule for tests that need a tool,
// a privilege or a file the machine may lack: skip with the reason (and an
// install hint) on a developer's machine, fail under CI=true, where
// scripts/install-test-deps.sh has installed everything and a skip would
// hide a broken setup.
package testenv

import (
	"bytes"
	"fmt"
	"os"
	"sync"
	"testing"
)

// CI reports whether the tests run under CI: the environment variable CI is
// "true" (.ci/run sets it unless the CI system already has).
func CI() bool { return os.Getenv("CI") == "true" }

// SkipOrFail skips the test with the formatted message, or fails it with
// t.Fatal when CI=true. Either way the test stops here.
func SkipOrFail(t testing.TB, format string, args ...any) {
	t.Helper()
	msg := fmt.Sprintf(format, args...)
	if CI() {
		t.Fatal(msg + " (CI=true: required)")
	}
	t.Skip(msg)
}

// Buffer is a bytes.Buffer that a process's output goroutine (or a
// logger on other goroutines) may write while the test reads it.
type Buffer struct {
	mu sync.Mutex
	b  bytes.Buffer
}

func (s *Buffer) Write(p []byte) (int, error) {
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.b.Write(p)
}

func (s *Buffer) String() string {
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.b.String()
}
