"""Reads a TensorBoard log directory with TensorBoard's own reader
(tensorboard.backend.event_processing.event_accumulator) and prints every
scalar as one JSON object: {TAG: [[STEP, VALUE, WALL_TIME], ...]}.
TestTrackers runs it on what kiln report --tensorboard wrote."""

import json
import sys

from tensorboard.backend.event_processing import event_accumulator as ea

acc = ea.EventAccumulator(sys.argv[1], size_guidance={ea.SCALARS: 0})
acc.Reload()
print(json.dumps({tag: [[e.step, e.value, e.wall_time] for e in acc.Scalars(tag)] for tag in acc.Tags()["scalars"]}))
