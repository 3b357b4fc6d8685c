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
// Only Linux has the raw path; elsewhere New reports false and callers use
// the net.Conn itself.
package rawsock

import (
	"io"
	"net"
	"os"
	"syscall"
)

// Conn is one connected socket's raw reads and writes. Like net.Conn, it
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
	rc  syscall.RawConn
	one [1][]byte // Write's buffer list
	sys
}

// New wraps nc. ok is false when nc has no socket to make raw calls on, or
// on systems without the raw path: then use nc itself.
func New(nc net.Conn) (c *Conn, ok bool) {
	if !supported {
		return nil, false
	}
	sc, ok := nc.(syscall.Conn)
	if !ok {
		return nil, false
	}
	rc, err := sc.SyscallConn()
	if err != nil {
		return nil, false
	}
	c = &Conn{nc: nc, rc: rc}
	c.sys.init()
	return c, true
}

// Read is io.Reader's: it waits until the socket has bytes (or is closed)
// and reads what is there, at most len(p).
func (c *Conn) Read(p []byte) (int, error) {
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
// for nothing.
func (c *Conn) PeerOpen() bool {
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
