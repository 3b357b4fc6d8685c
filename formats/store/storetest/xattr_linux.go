//go:build linux

package storetest

import (
	"os"
	"syscall"
)

// userXattrs reports whether the filesystem holding dir accepts user
// extended attributes, where versitygw's posix back end keeps its metadata.
func userXattrs(dir string) bool {
	f, err := os.CreateTemp(dir, ".kiln-probe-*")
	if err != nil {
		return false
	}
	name := f.Name()
	f.Close()
	defer os.Remove(name)
	return syscall.Setxattr(name, "user.kiln-probe", []byte("1"), 0) == nil
}
