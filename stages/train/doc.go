// Package train is kiln-train: it joins trajectories to their advantages,
// schedules rollout-atomic optimizer steps, packs each step's segments into
// micro-batches, writes them as safetensors files with a JSON plan, runs
// the PyTorch trainer (gpu/kiln_gpu/train.py) on them and commits what it
// saved as a checkpoints version (docs/train-stage.md).
//
// The pieces:
//   - Schedule, Pack (plan.go): steps of exactly G rollouts, first-fit
//     (decreasing) packing under the token cap, the reduction's
//     denominators; pure functions over segments in memory.
//   - safetensors.go: the safetensors writer (and a reader for tests).
//   - batches.go: the micro-batch tensors and plan.json.
//   - model.go: the base model (a directory or a checkpoints version,
//     materialized into a cache) and its checks.
//   - trainer.go: the launch command and the trainer's event stream.
//   - command.go: the stage over datasets.
package train
