// Package advantages is kiln-advantages: it joins training segments
// (trajectories) to their rollouts' grades and writes the advantages kind,
// one row per segment with its rollout's advantage, reward and loss
// denominator (docs/advantages.md). Group statistics count every rollout
// once however many segments it was split into.
//
// The pieces:
//   - GroupAdvantages (estimate.go): the estimators over one group's
//     per-rollout rewards.
//   - Compute (compute.go): the join, the checks, the filters (infrastructure
//     failures, truncation, small and uniform groups) and the broadcast, on
//     rows in memory; every removed row is counted by reason.
//   - Summarize (stats.go): per-group reward statistics and pass@k over a
//     grades version, shared by the manifest metrics and the stats command.
//   - Run, Select, Stats (command.go): the commands over datasets.
package advantages
