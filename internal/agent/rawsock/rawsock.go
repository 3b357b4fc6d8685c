// Package rawsock reads and writes connected sockets through the Go
// runtime's network poller, as net.Conn does, but makes the read, writev and
// peek system calls raw (syscall.RawSyscall), without the scheduler's
// system-call bookkeeping.
//
// Why: the sockets the net package makes are non-blocking, so these calls
// never wait — they copy what fits and return EAGAIN, and the poller parks
// the goroutine until the socket is ready, as it does for net.Conn. The
// bookkeeping (runtime.entersyscall) exists for calls that may block, and
// on its way it wakes the runtime's monitor thread (sysmon) whenever the
// process had gone idle; sysmon then polls every 20 µs until the process is
// idle again. A process that waits on another server several times per
// unit of work — kiln's adapter makes four engine calls a turn — goes idle
// and wakes that often: on kiln's load benchmark, making the adapter's
// socket calls raw took a quarter or more off its CPU per turn
// (BENCHMARKS.md, "Adapter under load").
//
// Only Linux has the raw path; elsewhere, and for connections without a
// socket, a Conn makes the net.Conn's own calls, so callers have one path.
package rawsock

import (
	"io"
	"net"
	"os"
	"slices"
	"syscall"
)

// Conn is one connected socket's reads, writes and peeks, raw where the
// system allows (Raw). Like net.Conn, it
// allows one Read or PeerOpen and one Write or WriteBuffers at a time (a
// read and a write may overlap);
// closing the net.Conn it wraps, from any goroutine, ends a waiting call
// with an error, and the net.Conn's deadlines apply to the waits. Errors are
// *net.OpError as net.Conn's are, and a read at the end of the stream is
// io.EOF. The socket must stay non-blocking, as the net package leaves it:
// a raw call on a blocking socket would hold its thread and the runtime's
// processor until the peer moved.
type Conn struct {
	nc  net.Conn
	rc  syscall.RawConn // nil: nc has no socket
	raw bool            // rc's calls are raw
	one [1][]byte       // Write's buffer list
	sys
}

// New wraps nc.
func New(nc net.Conn) *Conn {
	c := &Conn{nc: nc}
	if sc, ok := nc.(syscall.Conn); ok {
		if rc, err := sc.SyscallConn(); err == nil {
			c.rc, c.raw = rc, supported
		}
	}
	c.sys.init()
	return c
}

// Raw reports whether c's calls are raw system calls; false: they are the
// net.Conn's own.
func (c *Conn) Raw() bool { return c.raw }

// Read is io.Reader's: it waits until the socket has bytes (or is closed)
// and reads what is there, at most len(p).
func (c *Conn) Read(p []byte) (int, error) {
	if !c.raw {
		return c.nc.Read(p)
	}
	if len(p) == 0 {
		return 0, nil
	}
	c.p = p
	err := c.rc.Read(c.readFn)
	c.p = nil
	switch {
	case err != nil:
		return 0, c.opError("read", err)
	case c.rerr != 0:
		return 0, c.opError("read", c.rerr)
	case c.rn == 0:
		return 0, io.EOF
	}
	return c.rn, nil
}

// WriteBuffers writes every byte of bufs, in order, with as few writev calls
// as the socket's buffer allows, waiting while it is full. On an error some
// of the bytes may have been written.
func (c *Conn) WriteBuffers(bufs [][]byte) error {
	if !c.raw {
		nb := net.Buffers(slices.Clone(bufs)) // WriteTo empties the list it is given
		_, err := nb.WriteTo(c.nc)
		return err
	}
	c.setIovecs(bufs)
	err := c.rc.Write(c.writeFn)
	c.clearIovecs() // keep no pointers into the caller's buffers
	switch {
	case err != nil:
		return c.opError("write", err)
	case c.werr != 0:
		return c.opError("write", c.werr)
	}
	return nil
}

// Write is io.Writer's: it writes all of p, waiting while the socket is
// full, or returns an error.
func (c *Conn) Write(p []byte) (int, error) {
	c.one[0] = p
	err := c.WriteBuffers(c.one[:])
	c.one[0] = nil
	if err != nil {
		return 0, err
	}
	return len(p), nil
}

// PeerOpen reports whether the socket can be used for a new request: a
// non-blocking peek finds nothing to read. A close by the peer (end of
// stream), an error, or bytes nobody asked for all make it false. It waits
// for nothing. A connection without a socket is taken as open.
func (c *Conn) PeerOpen() bool {
	if c.rc == nil {
		return true
	}
	c.open = false
	err := c.rc.Read(c.peekFn)
	return err == nil && c.open
}

// opError is err as net.Conn's Read and Write report it: the poller's
// errors (closed, deadline) come back from syscall.RawConn labelled
// "raw-read" and "raw-write", which is relabelled, since callers such as
// net/http tell a connection's ordinary end by the operation "read".
func (c *Conn) opError(op string, err error) error {
	if errno, ok := err.(syscall.Errno); ok {
		err = os.NewSyscallError(op, errno)
	}
	if oe, ok := err.(*net.OpError); ok {
		err = oe.Err
	}
	return &net.OpError{Op: op, Net: c.nc.LocalAddr().Network(), Source: c.nc.LocalAddr(), Addr: c.nc.RemoteAddr(), Err: err}
}
