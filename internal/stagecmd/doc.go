// Package stagecmd is the plumbing every kiln binary shares: the --store,
// --shard, --print-version and --quiet flags, exit codes, input resolution,
// progress reporting, and the write-a-version flow that ends by printing the
// committed reference as the last line of stdout.
package stagecmd
