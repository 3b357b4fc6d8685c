package rollout

import (
	"context"
	"io"
	"net"
	"net/http"
	"net/http/httptest"
	"path/filepath"
	"sync/atomic"
	"syscall"
	"testing"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/kilnrl/kiln/internal/agent/adapter"
	"github.com/kilnrl/kiln/internal/stagecmd"
	"github.com/kilnrl/kiln/internal/testenv"
)

func TestEndpointShare(t *testing.T) {
	cases := []struct {
		limit  uint64
		jobs   int
		share  int
		enough bool
	}{
		{1 << 20, 64, endpointMaxConns, true}, // a generous limit: the cap
		{1024, 3, endpointMaxConns, true},
		{1024, 8, (1024 - reservedFDs - 8*reservedPerRun) / 8, true},
		{1024, 20, endpointMinConns, false}, // too low: the minimum, and a warning
		{200, 1, endpointMinConns, false},   // below the reserve
		{4096, 0, endpointMaxConns, true},
	}
	for _, c := range cases {
		share, enough := endpointShare(c.limit, c.jobs)
		assert.Equal(t, c.share, share, "limit %d, jobs %d", c.limit, c.jobs)
		assert.Equal(t, c.enough, enough, "limit %d, jobs %d", c.limit, c.jobs)
		if enough {
			assert.LessOrEqual(t, uint64(reservedFDs+max(c.jobs, 1)*(reservedPerRun+share)), c.limit, "the shares leave the reserve")
		}
	}
}

// TestEndpointListener: a sandbox's endpoint holds at most its share of
// connections; the first one past it is closed at once and reported, once;
// a closed connection frees its slot.
func TestEndpointListener(t *testing.T) {
	sock := filepath.Join(t.TempDir(), "endpoint.sock")
	inner, err := net.Listen("unix", sock)
	require.NoError(t, err)
	var floods atomic.Int32
	ln := &endpointListener{Listener: inner, max: 2, flood: func(max int) {
		assert.Equal(t, 2, max)
		floods.Add(1)
	}}
	defer ln.Close()
	accepted := make(chan net.Conn, 10)
	go func() {
		for {
			c, err := ln.Accept()
			if err != nil {
				return
			}
			accepted <- c
		}
	}()
	dial := func() net.Conn {
		c, err := net.Dial("unix", sock)
		require.NoError(t, err)
		t.Cleanup(func() { c.Close() })
		return c
	}
	dial()
	dial()
	a, b := <-accepted, <-accepted
	for range 2 {
		over := dial()
		_ = over.SetReadDeadline(time.Now().Add(5 * time.Second))
		_, err := over.Read(make([]byte, 1))
		assert.ErrorIs(t, err, io.EOF, "a connection past the share is closed")
	}
	assert.Equal(t, int32(1), floods.Load(), "the flood is reported once")
	require.NoError(t, a.Close())
	_ = a.Close() // closing twice frees one slot
	dial()
	select {
	case c := <-accepted:
		c.Close()
	case <-time.After(5 * time.Second):
		t.Fatal("a closed connection's slot was not given back")
	}
	b.Close()
}

// TestRaiseNoFile: the stage raises its open-files limit to the hard one.
func TestRaiseNoFile(t *testing.T) {
	var lim syscall.Rlimit
	require.NoError(t, syscall.Getrlimit(syscall.RLIMIT_NOFILE, &lim))
	t.Cleanup(func() { _ = syscall.Setrlimit(syscall.RLIMIT_NOFILE, &lim) })
	low := lim
	low.Cur = min(lim.Max, 256)
	require.NoError(t, syscall.Setrlimit(syscall.RLIMIT_NOFILE, &low))
	got, err := raiseNoFile()
	require.NoError(t, err)
	assert.Equal(t, lim.Max, got)
	var now syscall.Rlimit
	require.NoError(t, syscall.Getrlimit(syscall.RLIMIT_NOFILE, &now))
	assert.Equal(t, lim.Max, now.Cur)
}

// TestHealthCheckOutOfDescriptors: a health check that fails because
// kiln-rollout itself has no descriptor left (EMFILE) says so and leaves
// the engine in service: it is not the engine failing.
func TestHealthCheckOutOfDescriptors(t *testing.T) {
	var checks atomic.Int32
	srv := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		checks.Add(1)
		w.Header().Set("Connection", "close") // every check needs a new descriptor
	}))
	defer srv.Close()
	var lim syscall.Rlimit
	require.NoError(t, syscall.Getrlimit(syscall.RLIMIT_NOFILE, &lim))
	t.Cleanup(func() { _ = syscall.Setrlimit(syscall.RLIMIT_NOFILE, &lim) })

	rt := &runRuntime{front: newFront([]*adapter.Server{nil}), engines: []string{srv.URL}}
	var logs testenv.Buffer
	env := &stagecmd.Env{Stdout: io.Discard, Stderr: io.Discard, Log: stagecmd.NewLogger(&logs, false)}
	ctx, cancel := context.WithCancelCause(context.Background())
	defer cancel(nil)
	// No descriptor is left for a new connection (the health check's):
	// the limit is below what is open already.
	starved := lim
	starved.Cur = 3
	require.NoError(t, syscall.Setrlimit(syscall.RLIMIT_NOFILE, &starved))
	stop := rt.watchHealth(ctx, env, RunOptions{HealthInterval: 20 * time.Millisecond}, cancel)
	time.Sleep(300 * time.Millisecond)
	require.NoError(t, syscall.Setrlimit(syscall.RLIMIT_NOFILE, &lim))
	stop()
	assert.NoError(t, context.Cause(ctx), "the stage goes on")
	rt.front.mu.Lock()
	down := len(rt.front.down)
	rt.front.mu.Unlock()
	assert.Zero(t, down, "no engine was taken out of service")
	assert.Contains(t, logs.String(), "kiln-rollout is out of file descriptors", "checks answered: %d", checks.Load())
}
