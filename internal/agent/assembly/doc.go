// Package assembly is kiln's trajectory assembly: the turn records of one
// agent session (the turns kind) become training segments (the trajectories
// kind, records.Trajectory), following docs/assembly.md.
//
// A Session is the routing tree of docs/assembly.md §2.1. Record mounts each turn by its
// prompt messages: it descends into the first child with the same role and a
// deep-equal message (decoded JSON values, so key order and whitespace do not
// matter; tokens are irrelevant), optionally rewrite-merges a short generated
// leaf (threshold T > 0), appends the remaining messages as routing-only nodes
// and the turn as a generated assistant leaf. Turns without prompt messages
// are ignored; a logprob/output length mismatch and malformed replay data
// (top-p offsets, top-k shape, routed-experts shape, replay columns that
// differ between turns) are errors: assembly fails closed.
//
// Splitter cuts a turn's prompt_messages text into the messages Record
// takes, reading each message's head as it goes; when a turn's text extends
// the previous turn's (a resent history), only the new tail is scanned.
//
// Segments linearizes the tree (docs/assembly.md §2.2): leaves in depth-first insertion
// order; along each leaf's generated turns a builder is extended when the
// prompt extends its tokens (CLEAN), realigned when the drift lies inside its
// most recent response and that turn's output is shorter than T (REALIGN,
// the whole last response span becomes context), and forked otherwise. A
// generated turn shared by several leaves is trained only in the first; later
// leaves carry it with loss mask 0 but keep its original logprobs and replay
// rows (newer vime, docs/assembly.md §2.3 and TV25). Builders without a trained token are
// dropped; segments are truncated to Base.MaxSampleTokens (a segment left
// without response or trained token is dropped, docs/assembly.md §2.2 [INFERRED]).
// Every segment carries Base's ids and the full reward. Replay columns follow
// docs/assembly.md §2.3: top-p spans concatenated in token order with empty spans for
// context, top-k heads with a dummy head (ids 0..k-1, logprob log(1/k)) on
// context rows, and with routed experts every generated turn its own segment
// carrying its routes cut to len(tokens)-1 rows. Every segment is checked
// against records.Trajectory.Validate and the validate_sampler_top_p contract
// (ValidateSamplerTopP). The session is drained by Segments.
//
// Where kiln departs from the reference manager (docs/departures.md §6):
//   - the threshold T (Options.ForkMergeMaxResponseTokens) defaults to 0, as
//     the coding example's launchers set it (docs/assembly.md §2.4), not 1024: every
//     token drift forks and no sampled token is discarded;
//   - the reward is null unless Base.Reward is given (grades are the source
//     of truth, docs/records.md §1);
//   - segment metadata (truncated, use_tool, ill_formed) is per leaf, as in
//     the reference, and truncation by MaxSampleTokens does not set Truncated.
package assembly
