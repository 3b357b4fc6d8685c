// Package rollout implements the kiln-rollout binary's commands. Today that
// is assemble: turn records (a turns dataset, or JSON lines from another
// system) become training segments (a trajectories dataset) through
// trajectory assembly, offline, with no engine, adapter or sandbox. The
// agent-running rollout command joins it when the adapter and sandboxes land.
package rollout
