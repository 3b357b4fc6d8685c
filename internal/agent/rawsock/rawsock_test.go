package rawsock_test

import (
	"bytes"
	"errors"
	"io"
	"math/rand/v2"
	"net"
	"os"
	"runtime"
	"testing"
	"time"

	"github.com/kilnrl/kiln/internal/agent/rawsock"
)

// pair returns the two ends of a loopback TCP connection.
func pair(t *testing.T) (a, b net.Conn) {
	t.Helper()
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	defer ln.Close()
	acc := make(chan net.Conn, 1)
	go func() {
		c, err := ln.Accept()
		if err != nil {
			t.Error(err)
		}
		acc <- c
	}()
	a, err = net.Dial("tcp", ln.Addr().String())
	if err != nil {
		t.Fatal(err)
	}
	b = <-acc
	if b == nil {
		t.FailNow()
	}
	t.Cleanup(func() { a.Close(); b.Close() })
	return a, b
}

func raw(t *testing.T, c net.Conn) *rawsock.Conn {
	t.Helper()
	r := rawsock.New(c)
	if !r.Raw() && runtime.GOOS == "linux" && runtime.GOARCH != "386" {
		t.Fatal("rawsock.New: no raw path for a TCP connection on Linux")
	}
	return r
}

func randomBytes(r *rand.Rand, n int) []byte {
	b := make([]byte, n)
	for i := range b {
		b[i] = byte(r.Uint32())
	}
	return b
}

// Every byte written arrives, in order, through raw writes and raw reads,
// including writes that fill the socket's buffer mid-buffer (the EAGAIN
// path and the partial-iovec bookkeeping) and lists longer than IOV_MAX.
func TestWriteBuffersRead(t *testing.T) {
	rng := rand.New(rand.NewPCG(1, 2))
	sizes := func(ns ...int) [][]byte {
		var bufs [][]byte
		for _, n := range ns {
			bufs = append(bufs, randomBytes(rng, n))
		}
		return bufs
	}
	many := func(count, max int) [][]byte {
		bufs := make([][]byte, count)
		for i := range bufs {
			bufs[i] = randomBytes(rng, rng.IntN(max+1))
		}
		return bufs
	}
	cases := []struct {
		name string
		bufs [][]byte
	}{
		{"none", nil},
		{"empty buffers", sizes(0, 0, 0)},
		{"one byte", sizes(1)},
		{"head and body", sizes(180, 23_000)},
		{"empty among others", sizes(0, 5, 0, 7, 0)},
		{"past IOV_MAX", many(3000, 40)},
		{"larger than the socket buffer", sizes(6 << 20)},
		{"large buffers, split mid-buffer", sizes(3<<20+17, 5, 2<<20+3, 1<<20)},
		{"many large", many(1500, 8<<10)},
	}
	for _, tc := range cases {
		t.Run(tc.name, func(t *testing.T) {
			a, b := pair(t)
			w, r := raw(t, a), raw(t, b)
			got := make(chan []byte, 1)
			go func() {
				// Small reads, slower than the writer, so the writer's
				// socket fills up.
				var all []byte
				buf := make([]byte, 4093)
				for {
					n, err := r.Read(buf)
					all = append(all, buf[:n]...)
					if err == io.EOF {
						break
					}
					if err != nil {
						t.Error(err)
						break
					}
				}
				got <- all
			}()
			if err := w.WriteBuffers(tc.bufs); err != nil {
				t.Fatal(err)
			}
			a.Close()
			if want := bytes.Join(tc.bufs, nil); !bytes.Equal(<-got, want) {
				t.Fatalf("the reader got other bytes than the %d written", len(want))
			}
		})
	}
}

func TestReadZeroLength(t *testing.T) {
	a, _ := pair(t)
	if n, err := raw(t, a).Read(nil); n != 0 || err != nil {
		t.Fatalf("Read(nil) = %d, %v; want 0, nil without waiting", n, err)
	}
}

// A Read waiting for bytes ends when another goroutine closes the
// connection, and at the read deadline.
func TestReadWaitEnds(t *testing.T) {
	t.Run("close", func(t *testing.T) {
		a, _ := pair(t)
		r := raw(t, a)
		time.AfterFunc(50*time.Millisecond, func() { a.Close() })
		_, err := r.Read(make([]byte, 10))
		if !errors.Is(err, net.ErrClosed) {
			t.Fatalf("Read after Close: %v, want net.ErrClosed", err)
		}
		readOpError(t, err)
	})
	t.Run("deadline", func(t *testing.T) {
		a, _ := pair(t)
		r := raw(t, a)
		a.SetReadDeadline(time.Now().Add(50 * time.Millisecond))
		_, err := r.Read(make([]byte, 10))
		if !errors.Is(err, os.ErrDeadlineExceeded) {
			t.Fatalf("Read past the deadline: %v, want os.ErrDeadlineExceeded", err)
		}
		if ne, ok := readOpError(t, err).(net.Error); !ok || !ne.Timeout() {
			t.Fatalf("Read past the deadline: %v is not a net.Error that times out", err)
		}
	})
	t.Run("peer close", func(t *testing.T) {
		a, b := pair(t)
		r := raw(t, a)
		time.AfterFunc(50*time.Millisecond, func() { b.Write([]byte("xy")); b.Close() })
		all, err := io.ReadAll(r)
		if err != nil || string(all) != "xy" {
			t.Fatalf("ReadAll = %q, %v; want \"xy\" and the end of the stream", all, err)
		}
	})
}

// readOpError checks that err is reported as net.Conn's Read reports it
// (net/http tells a connection's ordinary end by the operation "read").
func readOpError(t *testing.T, err error) error {
	t.Helper()
	var op *net.OpError
	if !errors.As(err, &op) || op.Op != "read" || op.Net != "tcp" || op.Addr == nil {
		t.Fatalf("Read: %#v, want a *net.OpError for read on tcp", err)
	}
	return err
}

// A write to a connection the peer reset fails with the system's error,
// as a *net.OpError like net.Conn's.
func TestWriteError(t *testing.T) {
	a, b := pair(t)
	w := raw(t, a)
	b.(*net.TCPConn).SetLinger(0) // close with a reset
	b.Close()
	chunk := [][]byte{make([]byte, 64<<10)}
	deadline := time.Now().Add(5 * time.Second)
	for {
		err := w.WriteBuffers(chunk)
		if err != nil {
			var op *net.OpError
			if !errors.As(err, &op) || (op.Op != "write" && op.Op != "writev") {
				t.Fatalf("WriteBuffers: %v (%T), want a *net.OpError for write", err, err)
			}
			return
		}
		if time.Now().After(deadline) {
			t.Fatal("writes to a reset connection kept succeeding")
		}
		time.Sleep(time.Millisecond)
	}
}

func TestPeerOpen(t *testing.T) {
	settle := func(cond func() bool) bool {
		for deadline := time.Now().Add(2 * time.Second); time.Now().Before(deadline); time.Sleep(5 * time.Millisecond) {
			if cond() {
				return true
			}
		}
		return false
	}
	t.Run("idle", func(t *testing.T) {
		a, _ := pair(t)
		if !raw(t, a).PeerOpen() {
			t.Fatal("PeerOpen = false for an open, idle connection")
		}
	})
	t.Run("unsolicited bytes", func(t *testing.T) {
		a, b := pair(t)
		r := raw(t, a)
		b.Write([]byte("?"))
		if !settle(func() bool { return !r.PeerOpen() }) {
			t.Fatal("PeerOpen = true with bytes nobody asked for waiting")
		}
		buf := make([]byte, 1)
		if n, err := r.Read(buf); n != 1 || buf[0] != '?' || err != nil {
			t.Fatalf("the peek consumed the byte: Read = %d, %v", n, err)
		}
	})
	t.Run("peer closed", func(t *testing.T) {
		a, b := pair(t)
		r := raw(t, a)
		b.Close()
		if !settle(func() bool { return !r.PeerOpen() }) {
			t.Fatal("PeerOpen = true after the peer closed")
		}
	})
	t.Run("closed here", func(t *testing.T) {
		a, _ := pair(t)
		r := raw(t, a)
		a.Close()
		if r.PeerOpen() {
			t.Fatal("PeerOpen = true on a closed connection")
		}
	})
}

// A connection without a socket gets the net.Conn's own calls, through
// the same methods.
func TestWithoutSocket(t *testing.T) {
	a, b := net.Pipe()
	defer a.Close()
	defer b.Close()
	w, r := rawsock.New(a), rawsock.New(b)
	if w.Raw() {
		t.Fatal("New(net.Pipe()).Raw() = true; a pipe has no socket")
	}
	if !w.PeerOpen() {
		t.Fatal("PeerOpen = false for a connection without a socket")
	}
	go func() {
		w.WriteBuffers([][]byte{[]byte("head "), nil, []byte("body")})
		a.Close()
	}()
	got, err := io.ReadAll(r)
	if err != nil || string(got) != "head body" {
		t.Fatalf("read %q, %v; want \"head body\"", got, err)
	}
}
