//go:build !linux

package storetest

// userXattrs reports false where the probe is not implemented, so versitygw
// keeps its metadata in a sidecar directory, which works everywhere.
func userXattrs(dir string) bool { return false }
