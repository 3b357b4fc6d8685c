package rawsock

import "net"

// Listener wraps ln so that the TCP connections it accepts read and write
// with raw system calls (Conn). Everything else — deadlines, Close,
// CloseWrite, addresses — is the *net.TCPConn's, so an http.Server serves
// them as it serves ln's own. Connections without the raw path are returned
// as accepted.
func Listener(ln net.Listener) net.Listener { return listener{ln} }

type listener struct{ net.Listener }

func (l listener) Accept() (net.Conn, error) {
	c, err := l.Listener.Accept()
	if err != nil {
		return c, err
	}
	tc, ok := c.(*net.TCPConn)
	if !ok {
		return c, nil
	}
	rc := New(tc)
	if !rc.Raw() {
		return c, nil
	}
	return &tcpConn{TCPConn: tc, raw: rc}, nil
}

// tcpConn is a *net.TCPConn whose Read and Write are raw.
type tcpConn struct {
	*net.TCPConn
	raw *Conn
}

func (c *tcpConn) Read(p []byte) (int, error)  { return c.raw.Read(p) }
func (c *tcpConn) Write(p []byte) (int, error) { return c.raw.Write(p) }
