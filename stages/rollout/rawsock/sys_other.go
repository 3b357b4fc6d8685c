//go:build !linux || 386

package rawsock

import "syscall"

const supported = false

// sys has no raw path here: New reports false, so none of this is called.
type sys struct {
	p                       []byte
	rn                      int
	rerr, werr              syscall.Errno
	open                    bool
	readFn, writeFn, peekFn func(fd uintptr) bool
}

func (s *sys) init()                   {}
func (s *sys) setIovecs(bufs [][]byte) {}
func (s *sys) clearIovecs()            {}
