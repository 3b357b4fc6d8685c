package shellagent

import (
	"bufio"
	"bytes"
	"context"
	"errors"
	"fmt"
	"io"
	"net/netip"
	"net/url"
	"os"
	"strconv"
	"strings"
	"syscall"
	"time"
)

// This file is a minimal HTTP/1.1 client (one POST per connection) over raw
// syscalls, so that the package never imports "net": with cgo enabled (the
// default wherever a C compiler is installed, and what `make build` gets)
// importing "net" links the binary against the host's libc, and kiln-agent
// has to run in any image's rootfs — the reason kiln-sandbox-helper avoids
// "net" too (package sandboxinit). What it supports is what the adapter
// needs: http:// only (no TLS: crypto/tls imports "net"), hosts that are IP
// literals, "localhost" or names in /etc/hosts (there is no DNS resolver;
// inside a sandbox the adapter is 127.0.0.1:PORT), a response body by
// Content-Length, chunked or to EOF.

// maxResponseBytes bounds a reply body read into memory.
const maxResponseBytes = 64 << 20

// transportError is a failure to reach the server or to read its reply: the
// kind of error that is retried.
type transportError struct{ err error }

func (e *transportError) Error() string { return e.err.Error() }
func (e *transportError) Unwrap() error { return e.err }

// httpPost sends body to u with the given headers (name, value pairs) and
// returns the status and the whole reply body. ctx cancels it at any point.
func httpPost(ctx context.Context, u *url.URL, headers [][2]string, body []byte) (int, []byte, error) {
	if u.Scheme != "http" {
		return 0, nil, fmt.Errorf("url %s: only http:// is supported", u.Redacted())
	}
	port := u.Port()
	if port == "" {
		port = "80"
	}
	addr, err := resolve(u.Hostname(), port)
	if err != nil {
		return 0, nil, err
	}
	f, err := dialTCP(ctx, addr)
	if err != nil {
		return 0, nil, &transportError{fmt.Errorf("connect %s: %w", addr, err)}
	}
	defer f.Close()
	// Cancellation: a deadline in the past fails every pending and later
	// read or write on f at once.
	stop := context.AfterFunc(ctx, func() { _ = f.SetDeadline(time.Unix(1, 0)) })
	defer stop()
	if dl, ok := ctx.Deadline(); ok {
		_ = f.SetDeadline(dl)
	}

	var req bytes.Buffer
	path := u.EscapedPath()
	if path == "" {
		path = "/"
	}
	if u.RawQuery != "" {
		path += "?" + u.RawQuery
	}
	fmt.Fprintf(&req, "POST %s HTTP/1.1\r\nHost: %s\r\nContent-Length: %d\r\nConnection: close\r\n", path, u.Host, len(body))
	for _, h := range headers {
		fmt.Fprintf(&req, "%s: %s\r\n", h[0], h[1])
	}
	req.WriteString("\r\n")
	req.Write(body)
	if _, err := f.Write(req.Bytes()); err != nil {
		return 0, nil, &transportError{ctxErr(ctx, fmt.Errorf("send to %s: %w", addr, err))}
	}
	status, data, err := readResponse(bufio.NewReader(f))
	if err != nil {
		return 0, nil, &transportError{ctxErr(ctx, fmt.Errorf("read reply from %s: %w", addr, err))}
	}
	return status, data, nil
}

// ctxErr prefers the context's error (so that a run's deadline reads as a
// deadline, not as a failed read) when the context is done.
func ctxErr(ctx context.Context, err error) error {
	if ctx.Err() != nil {
		return fmt.Errorf("%w (%w)", ctx.Err(), err)
	}
	return err
}

// resolve turns host and port into a socket address.
func resolve(host, port string) (netip.AddrPort, error) {
	p, err := strconv.ParseUint(port, 10, 16)
	if err != nil {
		return netip.AddrPort{}, fmt.Errorf("port %q: %w", port, err)
	}
	if ip, err := netip.ParseAddr(host); err == nil {
		return netip.AddrPortFrom(ip, uint16(p)), nil
	}
	if strings.EqualFold(host, "localhost") {
		return netip.AddrPortFrom(netip.AddrFrom4([4]byte{127, 0, 0, 1}), uint16(p)), nil
	}
	if ip, ok := lookupHosts("/etc/hosts", host); ok {
		return netip.AddrPortFrom(ip, uint16(p)), nil
	}
	return netip.AddrPort{}, fmt.Errorf("host %q: not an IP address, localhost or in /etc/hosts (kiln-agent has no DNS resolver)", host)
}

// lookupHosts finds host in a hosts(5) file.
func lookupHosts(file, host string) (netip.Addr, bool) {
	b, err := os.ReadFile(file)
	if err != nil {
		return netip.Addr{}, false
	}
	for _, line := range strings.Split(string(b), "\n") {
		if i := strings.IndexByte(line, '#'); i >= 0 {
			line = line[:i]
		}
		f := strings.Fields(line)
		if len(f) < 2 {
			continue
		}
		ip, err := netip.ParseAddr(f[0])
		if err != nil {
			continue
		}
		for _, name := range f[1:] {
			if strings.EqualFold(name, host) {
				return ip.Unmap(), true
			}
		}
	}
	return netip.Addr{}, false
}

// dialTCP connects a non-blocking socket to addr and returns it as a
// pollable *os.File, so that reads and writes honour deadlines.
func dialTCP(ctx context.Context, addr netip.AddrPort) (*os.File, error) {
	var (
		family int
		sa     syscall.Sockaddr
	)
	ip := addr.Addr().Unmap()
	if ip.Is4() {
		family, sa = syscall.AF_INET, &syscall.SockaddrInet4{Port: int(addr.Port()), Addr: ip.As4()}
	} else {
		family, sa = syscall.AF_INET6, &syscall.SockaddrInet6{Port: int(addr.Port()), Addr: ip.As16()}
	}
	fd, err := syscall.Socket(family, syscall.SOCK_STREAM|syscall.SOCK_NONBLOCK|syscall.SOCK_CLOEXEC, 0)
	if err != nil {
		return nil, fmt.Errorf("socket: %w", err)
	}
	err = syscall.Connect(fd, sa)
	for errors.Is(err, syscall.EINTR) {
		err = syscall.Connect(fd, sa)
	}
	pending := errors.Is(err, syscall.EINPROGRESS)
	if err != nil && !pending {
		syscall.Close(fd)
		return nil, err
	}
	f := os.NewFile(uintptr(fd), "tcp "+addr.String())
	if !pending {
		return f, nil
	}
	// Wait for the connection: writable, then SO_ERROR says how it went.
	stop := context.AfterFunc(ctx, func() { _ = f.SetWriteDeadline(time.Unix(1, 0)) })
	defer stop()
	if dl, ok := ctx.Deadline(); ok {
		_ = f.SetWriteDeadline(dl)
	}
	rc, err := f.SyscallConn()
	if err != nil {
		f.Close()
		return nil, err
	}
	// RawConn.Write resets the poller's readiness before its first call of
	// the function, so that call must check the socket itself: a connection
	// made before it is seen there, one made after it wakes the wait.
	var cerr error
	werr := rc.Write(func(fd uintptr) bool {
		if _, err := syscall.Getpeername(int(fd)); err == nil {
			return true
		} else if !errors.Is(err, syscall.ENOTCONN) {
			cerr = err
			return true
		}
		n, err := syscall.GetsockoptInt(int(fd), syscall.SOL_SOCKET, syscall.SO_ERROR)
		switch {
		case err != nil:
			cerr = err
		case n != 0:
			cerr = syscall.Errno(n)
		default:
			return false // still connecting
		}
		return true
	})
	if werr == nil {
		werr = cerr
	}
	if werr != nil {
		f.Close()
		return nil, ctxErr(ctx, werr)
	}
	_ = f.SetWriteDeadline(time.Time{})
	return f, nil
}

// readResponse reads one HTTP/1.x response (skipping 1xx ones) and returns
// its status and body.
func readResponse(r *bufio.Reader) (int, []byte, error) {
	for {
		line, err := readLine(r)
		if err != nil {
			return 0, nil, fmt.Errorf("status line: %w", err)
		}
		proto, rest, _ := strings.Cut(line, " ")
		code, _, _ := strings.Cut(rest, " ")
		status, err := strconv.Atoi(code)
		if !strings.HasPrefix(proto, "HTTP/1.") || err != nil || status < 100 || status > 999 {
			return 0, nil, fmt.Errorf("malformed status line %q", line)
		}
		length, chunked := int64(-1), false
		for {
			h, err := readLine(r)
			if err != nil {
				return 0, nil, fmt.Errorf("header: %w", err)
			}
			if h == "" {
				break
			}
			name, val, ok := strings.Cut(h, ":")
			if !ok {
				return 0, nil, fmt.Errorf("malformed header line %q", h)
			}
			val = strings.TrimSpace(val)
			switch strings.ToLower(strings.TrimSpace(name)) {
			case "content-length":
				if length, err = strconv.ParseInt(val, 10, 64); err != nil || length < 0 {
					return 0, nil, fmt.Errorf("bad Content-Length %q", val)
				}
			case "transfer-encoding":
				chunked = strings.EqualFold(val, "chunked")
			}
		}
		if status < 200 { // 1xx: another response follows
			continue
		}
		var body io.Reader
		switch {
		case chunked:
			body = &chunkedReader{r: r}
		case length >= 0:
			if length > maxResponseBytes {
				return 0, nil, fmt.Errorf("reply body of %d bytes is over %d", length, maxResponseBytes)
			}
			b := make([]byte, length)
			if _, err := io.ReadFull(r, b); err != nil {
				return 0, nil, fmt.Errorf("body: %w", err)
			}
			return status, b, nil
		default:
			body = r // Connection: close ends the body
		}
		b, err := io.ReadAll(io.LimitReader(body, maxResponseBytes+1))
		if err != nil {
			return 0, nil, fmt.Errorf("body: %w", err)
		}
		if len(b) > maxResponseBytes {
			return 0, nil, fmt.Errorf("reply body is over %d bytes", maxResponseBytes)
		}
		return status, b, nil
	}
}

// readLine reads a CRLF- (or LF-) terminated line without its terminator.
func readLine(r *bufio.Reader) (string, error) {
	line, err := r.ReadString('\n')
	if err != nil {
		if errors.Is(err, io.EOF) {
			err = io.ErrUnexpectedEOF
		}
		return "", err
	}
	if len(line) > 1<<20 {
		return "", errors.New("line too long")
	}
	return strings.TrimRight(line, "\r\n"), nil
}

// chunkedReader decodes a chunked transfer coding; trailers are skipped.
type chunkedReader struct {
	r    *bufio.Reader
	left int64 // bytes left in the current chunk
	done bool
}

func (c *chunkedReader) Read(p []byte) (int, error) {
	if c.done {
		return 0, io.EOF
	}
	if c.left == 0 {
		line, err := readLine(c.r)
		if err != nil {
			return 0, fmt.Errorf("chunk size: %w", err)
		}
		size, _, _ := strings.Cut(line, ";")
		n, err := strconv.ParseInt(strings.TrimSpace(size), 16, 64)
		if err != nil || n < 0 {
			return 0, fmt.Errorf("bad chunk size %q", line)
		}
		if n == 0 {
			for { // trailers up to the blank line
				t, err := readLine(c.r)
				if err != nil {
					return 0, fmt.Errorf("trailer: %w", err)
				}
				if t == "" {
					break
				}
			}
			c.done = true
			return 0, io.EOF
		}
		c.left = n
	}
	if int64(len(p)) > c.left {
		p = p[:c.left]
	}
	n, err := c.r.Read(p)
	c.left -= int64(n)
	if c.left == 0 && err == nil {
		if _, err := readLine(c.r); err != nil { // the chunk's CRLF
			return n, fmt.Errorf("chunk end: %w", err)
		}
	}
	if errors.Is(err, io.EOF) {
		err = io.ErrUnexpectedEOF
	}
	return n, err
}
