// Package sync is kiln-sync (docs/sync.md): it publishes what kiln-train
// committed as versioned, checksummed, delta-aware weights, pulls a
// version onto an engine host byte for byte, and reloads the engines.
//
// Publish (docs/sync.md §1) commits a `weights` version (docs/records.md
// §12) through the dataset layer's commit protocol. Each version has a
// weights number, claimed before anything is uploaded under
// NAME/_weights/numbers/ and never reused; the latest pointer moves only to
// a higher number. A version is full (every file stored whole, as an
// attachment at its own path) or a delta on the version latest named when
// the publish started: only the tensors whose xxh3-128 changed, each one
// zstd frame (xor, overwrite or replace) in a pack attachment. Every row
// describes the whole reconstructed directory, so one version's rows
// verify it.
//
// Pull (docs/sync.md §2) walks the bases back to a full version (or the one
// a pull directory holds), applies the deltas in order into a staging
// directory, checks every tensor and file, and swaps it into place.
package sync
