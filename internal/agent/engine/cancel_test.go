package engine

import (
	"context"
	"errors"
	"fmt"
	"io"
	"net/http"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
)

// Cancellation by context: a call whose context ends is aborted (the engine
// sees its connection close) and fails with the context's error, and its
// connection is never reused; calls that finish leave their connection for
// the next.
func TestCancellation(t *testing.T) {
	// blocking answers "/slow" only when its request context ends (the
	// client closed the connection), telling closed; other paths at once.
	type server struct {
		conns    *atomic.Int64
		requests atomic.Int64
		entered  chan struct{}
		closed   chan struct{}
		url      string
	}
	start := func(t *testing.T) *server {
		s := &server{entered: make(chan struct{}, 8), closed: make(chan struct{}, 8)}
		srv, conns := countingServer(t, func(w http.ResponseWriter, r *http.Request) {
			_, _ = io.ReadAll(r.Body)
			s.requests.Add(1)
			if r.URL.Path == "/slow" {
				s.entered <- struct{}{}
				select {
				case <-r.Context().Done():
					s.closed <- struct{}{}
				case <-time.After(5 * time.Second):
				}
			}
			fmt.Fprint(w, `{}`)
		})
		s.conns, s.url = conns, srv.URL
		return s
	}
	call := func(ctx context.Context, c *Client, path string) error {
		_, err := c.do(ctx, http.MethodPost, path, []byte(`{}`), nil)
		return err
	}
	// started starts a server and a client, and a context the test ends
	// with cancel.
	started := func(t *testing.T) (s *server, c *Client, ctx context.Context, cancel context.CancelFunc) {
		s = start(t)
		c = engineClient(t, s.url)
		ctx, cancel = context.WithCancel(context.Background())
		t.Cleanup(cancel)
		return s, c, ctx, cancel
	}
	waitClosed := func(t *testing.T, s *server) {
		t.Helper()
		select {
		case <-s.closed:
		case <-time.After(2 * time.Second):
			t.Fatal("the engine never saw the connection close")
		}
	}

	t.Run("calls one after another share a connection", func(t *testing.T) {
		s, c, ctx, _ := started(t)
		for range 5 {
			require.NoError(t, call(ctx, c, "/fast"))
		}
		assert.EqualValues(t, 1, s.conns.Load())
	})

	t.Run("the context ending aborts the call in flight", func(t *testing.T) {
		s, c, ctx, cancel := started(t)
		require.NoError(t, call(ctx, c, "/fast"))
		errc := make(chan error, 1)
		go func() { errc <- call(ctx, c, "/slow") }()
		<-s.entered
		cancel()
		waitClosed(t, s)
		err := <-errc
		assert.True(t, errors.Is(err, context.Canceled), "%v", err)
		// The aborted call's connection is gone; the next call dials.
		require.NoError(t, call(context.Background(), c, "/fast"))
		assert.EqualValues(t, 2, s.conns.Load())
	})

	t.Run("a call after the context ended sends nothing", func(t *testing.T) {
		s, c, ctx, cancel := started(t)
		require.NoError(t, call(ctx, c, "/fast")) // leaves an idle connection
		cancel()
		err := call(ctx, c, "/fast")
		assert.True(t, errors.Is(err, context.Canceled), "%v", err)
		time.Sleep(50 * time.Millisecond)
		assert.EqualValues(t, 1, s.requests.Load(), "the engine got a request after its context ended")
	})

	t.Run("concurrent calls under one context are all aborted", func(t *testing.T) {
		s, c, ctx, cancel := started(t)
		const n = 3
		var wg sync.WaitGroup
		errs := make([]error, n)
		for i := range n {
			wg.Go(func() { errs[i] = call(ctx, c, "/slow") })
		}
		for range n {
			<-s.entered
		}
		cancel()
		for range n {
			waitClosed(t, s)
		}
		wg.Wait()
		for i, err := range errs {
			assert.True(t, errors.Is(err, context.Canceled), "call %d: %v", i, err)
		}
	})

	t.Run("a derived context that ends on its own aborts its call", func(t *testing.T) {
		s, c, ctx, _ := started(t)
		short, cancel := context.WithTimeout(ctx, 100*time.Millisecond)
		defer cancel()
		err := call(short, c, "/slow")
		assert.True(t, errors.Is(err, context.DeadlineExceeded), "%v", err)
		waitClosed(t, s)
	})

	t.Run("a context that ends after its call leaves the connection alone", func(t *testing.T) {
		s := start(t)
		c := engineClient(t, s.url)
		ctx, cancel := context.WithCancel(context.Background())
		require.NoError(t, call(ctx, c, "/fast"))
		cancel()
		require.NoError(t, call(context.Background(), c, "/fast"))
		assert.EqualValues(t, 1, s.conns.Load(), "the idle connection was closed")
	})
}
