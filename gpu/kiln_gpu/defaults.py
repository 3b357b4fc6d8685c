"""The trainer's defaults, defined once in defaults.json beside this file:
kiln-train's flags read the same file (the Go package gpu embeds it), so a
default changes in one place for both (docs/train.md §3). LOSS's keys are
also the fields plan.json's "loss" may have."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

DEFAULTS: dict[str, Any] = json.loads(Path(__file__).with_name("defaults.json").read_text())
LOSS: dict[str, Any] = DEFAULTS["loss"]
OPTIMIZER: dict[str, Any] = DEFAULTS["optimizer"]
