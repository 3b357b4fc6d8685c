// Package storetest checks that a store.Store honours the contract written in
// package store, and starts a real S3 server (versitygw) for tests.
//
// # Plugging in a new back end
//
// Write a test in the back end's package that hands Run a constructor
// returning a fresh, empty store for every subtest:
//
//	func TestMyStore(t *testing.T) {
//		storetest.Run(t, func(t *testing.T) store.Store {
//			return newEmptyMyStore(t) // clean up with t.Cleanup
//		})
//	}
//
// Run covers absent objects, round trips, ranges, conditional writes
// (PutIfAbsent, PutIfMatch) including races between goroutines, Delete, List
// prefixes, key validation, unknown and mismatched sizes, empty and
// multi-megabyte objects, context cancellation and, for a store.Sweeper,
// Leftovers. A failure names the contract point; do not skip it for a new
// back end, fix the back end (or, if the contract is wrong, the contract and
// every back end together).
//
// # S3 tests
//
// StartVersity starts versitygw (github.com/versity/versitygw) on a free
// loopback port with a POSIX back end in t.TempDir() and returns a store.S3
// in a fresh bucket. VersityEnv gives the environment and s3:// URI a child
// process (a kiln binary under test) needs to reach the same server. The
// binary is looked up in $KILN_VERSITYGW, then
// $HOME/.cache/kiln/versitygw-v1.8.0/versitygw, then $PATH; run
// scripts/install-test-deps.sh to install it. Without it the tests skip, or
// fail when CI=true. versitygw keeps object metadata in user xattrs, or in a
// sidecar directory where the filesystem has none (KILN_VERSITYGW_SIDECAR=1
// forces that mode).
//
// versitygw v1.8.0 is not a perfect S3: see the GetUnderOverwrite subtest,
// which it fails (a GET may report the ETag of another version than the
// bytes it returns).
package storetest
