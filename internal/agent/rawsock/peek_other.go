//go:build !unix

package rawsock

// peek: no peek here; an idle connection is taken as open.
func (s *sys) peek(uintptr) bool {
	s.open = true
	return true
}
