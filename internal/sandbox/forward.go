package sandbox

import (
	"fmt"
	"io"
	"net"
	"os"
	"sync"
	"time"
)

// listenEndpoint serves the host end of a sandbox's one way out: every
// connection to the unix socket at sock (which the in-sandbox forwarder
// reaches through a bind mount) is joined to a new TCP connection to addr.
// Closing the listener stops it.
func listenEndpoint(sock, addr string) (net.Listener, error) {
	if _, _, err := net.SplitHostPort(addr); err != nil {
		return nil, fmt.Errorf("sandbox endpoint %q: want host:port: %w", addr, err)
	}
	ln, err := listenEndpointSocket(sock)
	if err != nil {
		return nil, err
	}
	go func() {
		for {
			c, err := ln.Accept()
			if err != nil {
				return
			}
			go joinTCP(c, addr)
		}
	}()
	return ln, nil
}

// listenEndpointSocket listens on the host end of a sandbox's way out, the
// unix socket at sock: its connections are those of the in-sandbox
// forwarder (Options.ServeEndpoint serves them as they are).
func listenEndpointSocket(sock string) (net.Listener, error) {
	ln, err := net.Listen("unix", sock)
	if err != nil {
		return nil, fmt.Errorf("sandbox endpoint socket: %w", err)
	}
	// Root only: in the sandbox, only init's forwarder (root) dials it.
	if err := os.Chmod(sock, 0o600); err != nil {
		ln.Close()
		return nil, fmt.Errorf("sandbox endpoint socket: %w", err)
	}
	return ln, nil
}

func joinTCP(c net.Conn, addr string) {
	defer c.Close()
	up, err := net.DialTimeout("tcp", addr, 10*time.Second)
	if err != nil {
		return
	}
	defer up.Close()
	var wg sync.WaitGroup
	wg.Add(2)
	go func() { defer wg.Done(); halfCopy(up, c) }()
	go func() { defer wg.Done(); halfCopy(c, up) }()
	wg.Wait()
}

// halfCopy copies src to dst, then closes dst's write side so the peer sees
// EOF while the other direction may still be running.
func halfCopy(dst, src net.Conn) {
	_, _ = io.Copy(dst, src)
	if cw, ok := dst.(interface{ CloseWrite() error }); ok {
		_ = cw.CloseWrite()
	} else {
		dst.Close()
	}
}
