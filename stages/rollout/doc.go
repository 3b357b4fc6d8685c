// Package rollout implements the kiln-rollout binary's commands: run (coding
// agents in sandboxes against the policy, committed as rollouts, turns and
// trajectories; docs/rollout.md), assemble (turn records, a turns dataset or
// JSON lines from another system, become training segments offline, with no
// engine, adapter or sandbox) and adapter (the model adapter on its own,
// recording every client session).
package rollout
