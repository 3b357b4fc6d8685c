//go:build !linux

package h1server

import "net"

// hangups is Linux's epoll watcher; elsewhere Serve is net/http's server.
type hangups struct{}

func newHangups() (*hangups, error) { return nil, errUnsupported }

func (h *hangups) add(net.Conn, func()) (uint64, error) { return 0, errUnsupported }
func (h *hangups) remove(uint64, net.Conn)              {}
func (h *hangups) close()                               {}
