package sandboxinit

import (
	"io"
	"os"
	"sync"
	"syscall"
)

// listenLoopback listens on 127.0.0.1:port.
func listenLoopback(port int) (int, error) {
	fd, err := syscall.Socket(syscall.AF_INET, syscall.SOCK_STREAM|syscall.SOCK_CLOEXEC, 0)
	if err != nil {
		return -1, err
	}
	_ = syscall.SetsockoptInt(fd, syscall.SOL_SOCKET, syscall.SO_REUSEADDR, 1)
	if err := syscall.Bind(fd, &syscall.SockaddrInet4{Port: port, Addr: [4]byte{127, 0, 0, 1}}); err != nil {
		syscall.Close(fd)
		return -1, err
	}
	if err := syscall.Listen(fd, 128); err != nil {
		syscall.Close(fd)
		return -1, err
	}
	return fd, nil
}

// acceptLoop hands every accepted connection, as a pollable *os.File, to
// handle on its own goroutine. It returns when accept fails for good.
func acceptLoop(fd int, handle func(*os.File)) {
	for {
		nfd, _, err := syscall.Accept4(fd, syscall.SOCK_CLOEXEC)
		if err == syscall.EINTR || err == syscall.ECONNABORTED || err == syscall.EMFILE || err == syscall.ENFILE {
			continue
		}
		if err != nil {
			return
		}
		go handle(fileOf(nfd, "conn"))
	}
}

func fileOf(fd int, name string) *os.File {
	_ = syscall.SetNonblock(fd, true)
	return os.NewFile(uintptr(fd), name)
}

func dialUnix(path string) (*os.File, error) {
	fd, err := syscall.Socket(syscall.AF_UNIX, syscall.SOCK_STREAM|syscall.SOCK_CLOEXEC, 0)
	if err != nil {
		return nil, err
	}
	if err := syscall.Connect(fd, &syscall.SockaddrUnix{Name: path}); err != nil {
		syscall.Close(fd)
		return nil, err
	}
	return fileOf(fd, path), nil
}

// forwardToEndpoint joins a loopback connection to the host endpoint socket.
func forwardToEndpoint(c *os.File) {
	defer c.Close()
	up, err := dialUnix(EndpointSocket)
	if err != nil {
		return
	}
	defer up.Close()
	var wg sync.WaitGroup
	wg.Add(2)
	go func() { defer wg.Done(); pipe(up, c) }()
	go func() { defer wg.Done(); pipe(c, up) }()
	wg.Wait()
}

// pipe copies src to dst, then half-closes dst so the peer sees EOF.
func pipe(dst, src *os.File) {
	_, _ = io.Copy(dst, src)
	if rc, err := dst.SyscallConn(); err == nil {
		_ = rc.Control(func(fd uintptr) { _ = syscall.Shutdown(int(fd), syscall.SHUT_WR) })
	}
}
