// Package dataset implements kiln's versioned datasets on top of a
// store.Store (docs/design.md §2).
//
// A dataset is a name in a store; it has immutable versions. A version is a
// set of shard files and a manifest, laid out as
//
//	<name>/_v/<version>/shards/p<part>-<attempt>-<seq><ext>   shard files
//	<name>/_v/<version>/rows/p<part>/<attempt>-<seq>.json     row receipts
//	<name>/_v/<version>/parts/<part>-of-<parts>.json          part receipts
//	<name>/_v/<version>/manifest.json                         the commit
//	<name>/_v/<version>/attachments/...                       files stored beside the rows
//	<name>/_latest.json                                       the latest pointer (Latest)
//
// Attachments (AttachmentKey) are what a stage stores beside its rows and
// points to from them — grading logs, agent artifacts: a committed version
// keeps them, and GC collects them with a version that never commits.
//
// The commit protocol: shards are written first under keys unique to the
// writing attempt; each flushed shard may get a row receipt naming the input
// rows it holds (so a rerun resumes there); a finished part writes its part
// receipt with create-if-absent (so one attempt per part wins and a late
// duplicate never replaces it); whichever writer then sees every part
// receipted writes the manifest, also create-if-absent, so exactly one
// commit happens. A version without a manifest does not exist for readers,
// and every file the protocol leaves behind is found by GC. After the
// commit (and when a writer finds its version committed already), the
// writer moves the dataset's latest pointer to the version by
// compare-and-swap: a bare name means that version (Resolve). GC never
// removes a committed version, so never the one the pointer names.
//
// Version ids are derived from what produced the data (Identity), so a
// rerun of an identical stage finds its committed output instead of
// recomputing it, and a changed input — a new upstream version, a changed
// external file — always yields a new version.
package dataset
