// Package convert is the convert stage (kiln-convert): coding-RL datasets
// (the MiMo code subset, SWE-bench-style rows, SWE-bench Pro rows, f2p-script
// rows) to versions of the tasks kind, following the reference converter
// (docs/data-and-grading.md §1) where it has one. Each format is a source yielding
// rows; the shared flow selects (--ids), checks, splits (--split, --limit)
// and writes shards of bounded size, so memory does not grow with the input.
package convert
