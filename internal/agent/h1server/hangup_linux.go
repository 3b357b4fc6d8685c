//go:build linux

package h1server

import (
	"errors"
	"fmt"
	"net"
	"sync"
	"syscall"
)

// hangups watches connections for their peer's close: one epoll set
// holding every connection with EPOLLRDHUP (edge-triggered, so each close
// is told once), waited on by one goroutine in a blocking epoll_wait.
// Connections stay in the runtime's own poller too; a second epoll set may
// hold the same socket. A connection's registration goes with its socket
// when it closes; ids tell a reused descriptor's events from its
// predecessor's.
type hangups struct {
	epfd int
	wake [2]int // a pipe whose read end (id 0) ends the watcher

	mu     sync.Mutex
	next   uint64
	hungUp map[uint64]func() // by id: what a hang-up calls
	closed bool
	done   chan struct{} // closed when the watcher has returned
}

// epollET is EPOLLET as the uint32 the event mask is (package syscall's
// constant is negative on some architectures, positive on others).
const epollET = 1 << 31

func newHangups() (*hangups, error) {
	epfd, err := syscall.EpollCreate1(syscall.EPOLL_CLOEXEC)
	if err != nil {
		return nil, fmt.Errorf("epoll_create1: %w", err)
	}
	h := &hangups{epfd: epfd, hungUp: map[uint64]func(){}, done: make(chan struct{})}
	if err := syscall.Pipe2(h.wake[:], syscall.O_CLOEXEC|syscall.O_NONBLOCK); err != nil {
		syscall.Close(epfd)
		return nil, fmt.Errorf("pipe2: %w", err)
	}
	ev := syscall.EpollEvent{Events: syscall.EPOLLIN}
	if err := syscall.EpollCtl(epfd, syscall.EPOLL_CTL_ADD, h.wake[0], &ev); err != nil {
		h.closeFDs()
		return nil, fmt.Errorf("epoll_ctl: %w", err)
	}
	go h.watch()
	return h, nil
}

// add watches nc; onHangUp is called (on the watcher's goroutine, so it
// must not block) when its peer closes or resets it.
func (h *hangups) add(nc net.Conn, onHangUp func()) (uint64, error) {
	sc, ok := nc.(syscall.Conn)
	if !ok {
		return 0, fmt.Errorf("%T has no socket to watch", nc)
	}
	rc, err := sc.SyscallConn()
	if err != nil {
		return 0, err
	}
	h.mu.Lock()
	defer h.mu.Unlock()
	if h.closed {
		return 0, errors.New("server closed")
	}
	h.next++
	id := h.next
	ev := syscall.EpollEvent{Events: syscall.EPOLLRDHUP | epollET, Fd: int32(uint32(id)), Pad: int32(uint32(id >> 32))}
	var cerr error
	if err := rc.Control(func(fd uintptr) {
		cerr = syscall.EpollCtl(h.epfd, syscall.EPOLL_CTL_ADD, int(fd), &ev)
	}); err != nil {
		return 0, err
	}
	if cerr != nil {
		return 0, fmt.Errorf("epoll_ctl: %w", cerr)
	}
	h.hungUp[id] = onHangUp
	return id, nil
}

// remove stops watching the connection id, before nc closes (if nc is
// closed already, its registration went with it). It holds mu throughout,
// so that close cannot release the epoll descriptor — whose number a new
// descriptor could then take — while it is used here.
func (h *hangups) remove(id uint64, nc net.Conn) {
	h.mu.Lock()
	defer h.mu.Unlock()
	delete(h.hungUp, id)
	if h.closed {
		return
	}
	if sc, ok := nc.(syscall.Conn); ok {
		if rc, err := sc.SyscallConn(); err == nil {
			_ = rc.Control(func(fd uintptr) { _ = syscall.EpollCtl(h.epfd, syscall.EPOLL_CTL_DEL, int(fd), nil) })
		}
	}
}

func (h *hangups) watch() {
	defer close(h.done)
	events := make([]syscall.EpollEvent, 128)
	for {
		n, err := syscall.EpollWait(h.epfd, events, -1)
		if err == syscall.EINTR {
			continue
		}
		if err != nil {
			return
		}
		for _, ev := range events[:n] {
			id := uint64(uint32(ev.Fd)) | uint64(uint32(ev.Pad))<<32
			if id == 0 {
				return
			}
			h.mu.Lock()
			f := h.hungUp[id]
			delete(h.hungUp, id)
			h.mu.Unlock()
			if f != nil {
				f()
			}
		}
	}
}

// close ends the watcher and releases its descriptors.
func (h *hangups) close() {
	h.mu.Lock()
	if h.closed {
		h.mu.Unlock()
		return
	}
	h.closed = true
	h.mu.Unlock()
	_, _ = syscall.Write(h.wake[1], []byte{0})
	<-h.done
	h.closeFDs()
}

func (h *hangups) closeFDs() {
	syscall.Close(h.wake[0])
	syscall.Close(h.wake[1])
	syscall.Close(h.epfd)
}
