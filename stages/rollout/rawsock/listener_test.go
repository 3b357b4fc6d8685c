package rawsock_test

import (
	"bytes"
	"context"
	"io"
	"log"
	"net"
	"net/http"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/kilnrl/kiln/stages/rollout/rawsock"
)

// An http.Server on a rawsock.Listener serves as on the plain listener:
// kept-alive requests with bodies of every size in both directions, a
// handler's context ended by the client hanging up (net/http's background
// read), Shutdown of idle connections — and logs no error of its own.
func TestListenerServesHTTP(t *testing.T) {
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	var logged bytes.Buffer
	var logMu sync.Mutex
	hung := make(chan error, 1)
	mux := http.NewServeMux()
	mux.HandleFunc("/echo", func(w http.ResponseWriter, r *http.Request) {
		b, err := io.ReadAll(r.Body)
		if err != nil {
			http.Error(w, err.Error(), http.StatusBadRequest)
			return
		}
		w.Write(b)
	})
	mux.HandleFunc("/wait", func(w http.ResponseWriter, r *http.Request) {
		io.ReadAll(r.Body)
		select {
		case <-r.Context().Done():
			hung <- r.Context().Err()
		case <-time.After(5 * time.Second):
			hung <- nil
		}
	})
	srv := &http.Server{Handler: mux, ErrorLog: log.New(lockedWriter{&logMu, &logged}, "", 0)}
	raw := rawsock.Listener(ln)
	go srv.Serve(raw)

	client := &http.Client{Transport: &http.Transport{MaxIdleConnsPerHost: 1}}
	url := "http://" + ln.Addr().String()
	for _, n := range []int{0, 1, 4 << 10, 300 << 10, 9 << 20} {
		body := bytes.Repeat([]byte("0123456789abcdef"), n/16+1)[:n]
		resp, err := client.Post(url+"/echo", "application/octet-stream", bytes.NewReader(body))
		if err != nil {
			t.Fatalf("POST %d bytes: %v", n, err)
		}
		got, err := io.ReadAll(resp.Body)
		resp.Body.Close()
		if err != nil || !bytes.Equal(got, body) {
			t.Fatalf("POST %d bytes: got %d bytes back (%v)", n, len(got), err)
		}
	}

	// A client that hangs up ends the handler's context.
	c, err := net.Dial("tcp", ln.Addr().String())
	if err != nil {
		t.Fatal(err)
	}
	io.WriteString(c, "POST /wait HTTP/1.1\r\nHost: x\r\nContent-Length: 2\r\n\r\nhi")
	time.Sleep(50 * time.Millisecond)
	c.Close()
	if err := <-hung; err != context.Canceled {
		t.Fatalf("the handler's context after the client hung up: %v, want context.Canceled", err)
	}

	ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
	defer cancel()
	client.CloseIdleConnections()
	if err := srv.Shutdown(ctx); err != nil {
		t.Fatalf("Shutdown: %v", err)
	}
	logMu.Lock()
	defer logMu.Unlock()
	if logged.Len() > 0 {
		t.Fatalf("the server logged: %s", logged.String())
	}
}

// The accepted connections keep *net.TCPConn's other methods (net/http
// half-closes with CloseWrite before closing after an error reply).
func TestListenerConn(t *testing.T) {
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	raw := rawsock.Listener(ln)
	defer raw.Close()
	go func() {
		if c, err := net.Dial("tcp", ln.Addr().String()); err == nil {
			io.WriteString(c, "ping")
			io.Copy(io.Discard, c)
			c.Close()
		}
	}()
	c, err := raw.Accept()
	if err != nil {
		t.Fatal(err)
	}
	defer c.Close()
	if _, ok := c.(interface{ CloseWrite() error }); !ok {
		t.Fatalf("accepted %T: no CloseWrite", c)
	}
	buf := make([]byte, 4)
	if _, err := io.ReadFull(c, buf); err != nil || string(buf) != "ping" {
		t.Fatalf("read %q, %v", buf, err)
	}
	if c.LocalAddr().String() != ln.Addr().String() {
		t.Fatalf("LocalAddr %v, want %v", c.LocalAddr(), ln.Addr())
	}
	if !strings.HasPrefix(c.RemoteAddr().String(), "127.0.0.1:") {
		t.Fatalf("RemoteAddr %v", c.RemoteAddr())
	}
}

type lockedWriter struct {
	mu *sync.Mutex
	w  io.Writer
}

func (l lockedWriter) Write(p []byte) (int, error) {
	l.mu.Lock()
	defer l.mu.Unlock()
	return l.w.Write(p)
}
