"""kiln report --wandb: writes the report's per-step scalars as a wandb run
in offline mode (docs/report.md §5). kiln runs it with the trackers' Python
(scripts/install-tracker-deps.sh) as `python -c THIS`, the run's data as one
JSON object on stdin:

    {"dir": DIR, "project": P, "name": N, "config": {...},
     "steps": [{"step": K, "scalars": {TAG: VALUE, ...}}, ...]}

steps in increasing step order. It prints the run's directory
(DIR/wandb/offline-run-*) as its last stdout line; the user uploads it
later with `wandb sync`. Nothing is sent anywhere: the mode is offline.
"""

import json
import os
import sys

os.environ["WANDB_MODE"] = "offline"
os.environ["WANDB_SILENT"] = "true"

import wandb  # noqa: E402  (after the environment above)

spec = json.load(sys.stdin)
run = wandb.init(
    mode="offline",
    dir=spec["dir"],
    project=spec["project"],
    name=spec["name"],
    config=spec["config"],
    settings=wandb.Settings(
        silent=True,
        console="off",
        save_code=False,
        disable_git=True,
        x_disable_stats=True,
        x_disable_meta=True,
    ),
)
for s in spec["steps"]:
    run.log(s["scalars"], step=s["step"])
run.finish()
print(os.path.dirname(run.dir))
