//go:build (!linux || 386) && unix

package rawsock

import "syscall"

const supported = false

// sys here has no raw path: Conn makes the net.Conn's calls, and only the
// peek needs the socket (an ordinary system call).
type sys struct {
	p                       []byte
	rn                      int
	rerr, werr              syscall.Errno
	open                    bool
	readFn, writeFn, peekFn func(fd uintptr) bool
}

func (s *sys) init()                   { s.peekFn = s.peek }
func (s *sys) setIovecs(bufs [][]byte) {}
func (s *sys) clearIovecs()            {}

func (s *sys) peek(fd uintptr) bool {
	var b [1]byte
	n, _, err := syscall.Recvfrom(int(fd), b[:], syscall.MSG_PEEK|syscall.MSG_DONTWAIT)
	s.open = n < 0 && (err == syscall.EAGAIN || err == syscall.EWOULDBLOCK)
	return true
}
