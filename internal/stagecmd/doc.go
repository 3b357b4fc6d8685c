// Package stagecmd is the plumbing every kiln binary shares: the --store,
// --shard, --print-version and --quiet flags, exit codes, input resolution,
// progress reporting, and the write-a-version flow that ends by printing the
// committed reference as the last line of stdout.
//
// A binary is a stage package's App(env) run by Run (its main is one
// line). Env.App gives every app the global flags (--store, -q/--quiet,
// -v/--verbose, --log-format) on the app and every command, one-line usage
// errors (exit 2), "help [COMMAND...]" and the EXIT STATUS section; Main
// runs it after Reorder, so flags and arguments go in any order and the
// global flags before or after the command. A command binds its own flags
// to the fields of a struct it makes in its constructor (Destination; see
// stages/rollout's assemble), not to names looked up in the action:
// cmd/kiln's tests run every command of every binary with its flags in
// several orders, parse every help example, and check any flag still read
// by name against the flags defined.
package stagecmd
