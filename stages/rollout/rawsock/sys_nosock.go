//go:build !unix

package rawsock

import "syscall"

const supported = false

// sys here has no raw path and no peek: Conn makes the net.Conn's calls,
// and an idle connection is taken as open.
type sys struct {
	p                       []byte
	rn                      int
	rerr, werr              syscall.Errno
	open                    bool
	readFn, writeFn, peekFn func(fd uintptr) bool
}

func (s *sys) init()                   { s.peekFn = func(uintptr) bool { s.open = true; return true } }
func (s *sys) setIovecs(bufs [][]byte) {}
func (s *sys) clearIovecs()            {}
