package engine

import (
	"context"
	"errors"
	"io"
	"net/http"
	"net/http/httptest"
	"os"
	"path/filepath"
	"sync"
	"testing"

	"github.com/stretchr/testify/require"
)

// golden reads testdata/name.
func golden(t *testing.T, name string) []byte {
	t.Helper()
	b, err := os.ReadFile(filepath.Join("testdata", name))
	require.NoError(t, err)
	return b
}

type seen struct {
	Method, Path string
	Header       http.Header
	Body         []byte
}

type reply struct {
	status int
	body   []byte
}

// fakeVLLM serves canned replies per "METHOD /path" and records requests.
type fakeVLLM struct {
	*httptest.Server
	mu     sync.Mutex
	routes map[string]reply
	reqs   []seen
}

func newFake(t *testing.T, routes map[string]reply) *fakeVLLM {
	t.Helper()
	f := &fakeVLLM{routes: routes}
	f.Server = httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		b, _ := io.ReadAll(r.Body)
		f.mu.Lock()
		f.reqs = append(f.reqs, seen{r.Method, r.URL.Path, r.Header.Clone(), b})
		rep, ok := f.routes[r.Method+" "+r.URL.Path]
		f.mu.Unlock()
		if !ok {
			w.Header().Set("Content-Type", "application/json")
			w.WriteHeader(http.StatusNotFound)
			_, _ = w.Write([]byte(`{"detail":"Not Found"}`))
			return
		}
		w.Header().Set("Content-Type", "application/json")
		if rep.status == 0 {
			rep.status = http.StatusOK
		}
		w.WriteHeader(rep.status)
		_, _ = w.Write(rep.body)
	}))
	t.Cleanup(f.Close)
	return f
}

func (f *fakeVLLM) last(t *testing.T, path string) seen {
	t.Helper()
	f.mu.Lock()
	defer f.mu.Unlock()
	for i := len(f.reqs) - 1; i >= 0; i-- {
		if f.reqs[i].Path == path {
			return f.reqs[i]
		}
	}
	t.Fatalf("no request to %s", path)
	return seen{}
}

func (f *fakeVLLM) count(path string) int {
	f.mu.Lock()
	defer f.mu.Unlock()
	n := 0
	for _, r := range f.reqs {
		if r.Path == path {
			n++
		}
	}
	return n
}

func newClient(t *testing.T, base string, o Options) *Client {
	t.Helper()
	o.BaseURL = base
	c, err := New(o)
	require.NoError(t, err)
	return c
}

func ptr[T any](v T) *T { return &v }

var bg = context.Background()

func errorsAs[T error](err error, target *T) bool { return errors.As(err, target) }
