//go:build !linux || 386

package rawsock

import "syscall"

const supported = false

// sys here has no raw path: Conn makes the net.Conn's calls, and only the
// peek needs the socket (peek_unix.go, peek_other.go).
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
