//go:build (!linux || 386) && unix

package rawsock

import "syscall"

// peek sets open: a non-blocking peek of one byte (an ordinary system
// call) finds none yet.
func (s *sys) peek(fd uintptr) bool {
	var b [1]byte
	n, _, err := syscall.Recvfrom(int(fd), b[:], syscall.MSG_PEEK|syscall.MSG_DONTWAIT)
	s.open = n < 0 && (err == syscall.EAGAIN || err == syscall.EWOULDBLOCK)
	return true
}
