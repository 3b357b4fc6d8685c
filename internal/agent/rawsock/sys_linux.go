//go:build linux && !386

package rawsock

import (
	"syscall"
	"unsafe"
)

const supported = true

// iovMax is Linux's IOV_MAX: the most buffers one writev takes.
const iovMax = 1024

// sys is the call in progress and the functions the poller calls back (method
// values made once, so a call allocates nothing).
type sys struct {
	p       []byte // Read's buffer
	rn      int
	rerr    syscall.Errno
	iov     []syscall.Iovec // what WriteBuffers has left to write
	iovBuf  []syscall.Iovec // iov's memory, reused
	werr    syscall.Errno
	open    bool // PeerOpen's answer
	readFn  func(fd uintptr) bool
	writeFn func(fd uintptr) bool
	peekFn  func(fd uintptr) bool
}

func (s *sys) init() { s.readFn, s.writeFn, s.peekFn = s.read, s.writev, s.peek }

// read makes one read call; false (wait, then call again) on EAGAIN.
func (s *sys) read(fd uintptr) bool {
	for {
		n, _, e := syscall.RawSyscall(syscall.SYS_READ, fd, uintptr(unsafe.Pointer(&s.p[0])), uintptr(len(s.p)))
		switch e {
		case syscall.EINTR:
			continue
		case syscall.EAGAIN:
			return false
		case 0:
			s.rn, s.rerr = int(n), 0
		default:
			s.rn, s.rerr = 0, e
		}
		return true
	}
}

func (s *sys) setIovecs(bufs [][]byte) {
	iov := s.iovBuf[:0]
	for _, b := range bufs {
		if len(b) > 0 {
			v := syscall.Iovec{Base: &b[0]}
			v.SetLen(len(b))
			iov = append(iov, v)
		}
	}
	s.iovBuf, s.iov, s.werr = iov, iov, 0
}

func (s *sys) clearIovecs() {
	clear(s.iovBuf)
	s.iov = nil
}

// writev writes what the socket takes of s.iov and drops it from s.iov:
// true when all of it is written or on an error, false (wait until the
// socket is writable, then call again) when the socket is full.
func (s *sys) writev(fd uintptr) bool {
	for len(s.iov) > 0 {
		n, _, e := syscall.RawSyscall(syscall.SYS_WRITEV, fd, uintptr(unsafe.Pointer(&s.iov[0])), uintptr(min(len(s.iov), iovMax)))
		switch e {
		case 0:
		case syscall.EINTR:
			continue
		case syscall.EAGAIN:
			return false
		default:
			s.werr = e
			return true
		}
		for w := uint64(n); w > 0; {
			if l := uint64(s.iov[0].Len); l <= w {
				w -= l
				s.iov = s.iov[1:]
			} else {
				s.iov[0].Base = (*byte)(unsafe.Add(unsafe.Pointer(s.iov[0].Base), w))
				s.iov[0].SetLen(int(l - w))
				w = 0
			}
		}
	}
	return true
}

// peek sets open: a non-blocking peek of one byte finds none yet (EAGAIN).
// It never waits (true).
func (s *sys) peek(fd uintptr) bool {
	var b [1]byte
	_, _, e := syscall.RawSyscall6(syscall.SYS_RECVFROM, fd, uintptr(unsafe.Pointer(&b[0])), 1,
		syscall.MSG_PEEK|syscall.MSG_DONTWAIT, 0, 0)
	s.open = e == syscall.EAGAIN || e == syscall.EWOULDBLOCK
	return true
}
