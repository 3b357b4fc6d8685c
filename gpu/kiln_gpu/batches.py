"""kiln-train's batch directory: the plan and its micro-batch files
(docs/train.md §9). Every defect is a PlanError naming the file and field.
"""

from __future__ import annotations

import json
import math
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Optional

import torch
from safetensors.torch import load_file

PLAN_FORMAT = "kiln-train-plan/1"

# name -> (dtype, required)
COLUMNS = {
    "tokens": (torch.int32, True),
    "seq_offsets": (torch.int64, True),
    "response_lengths": (torch.int32, True),
    "loss_mask": (torch.uint8, True),
    "rollout_logprobs": (torch.float32, True),
    "advantages": (torch.float32, True),
    "denominators": (torch.float32, True),
    "rollout_index": (torch.int32, True),
    "top_p_offsets": (torch.int64, False),
    "top_p_ids": (torch.int32, False),
    "top_p_probs": (torch.float32, False),
}


class PlanError(ValueError):
    """A bad plan or micro-batch file: exit 2."""


@dataclass
class Step:
    index: int
    rollouts: int
    segments: int
    tokens: int
    trained_tokens: int
    divisor: float
    micro_batches: list[Path]


@dataclass
class Plan:
    path: Path
    model: Path
    resume_from: Optional[Path]
    out: Path
    seed: int
    temperature: float
    global_batch_size: int
    loss: dict[str, Any]
    optimizer: dict[str, Any]
    steps: list[Step]
    dropped_rollouts: int
    raw: dict[str, Any]

    def flag(self, name: str, default: Any) -> Any:
        """An optional trainer flag of the plan (docs/train.md §9)."""
        return self.raw.get(name, default)


def _need(d: dict, key: str, types, where: str, path: Path):
    if key not in d:
        raise PlanError(f"{path}: {where}{key} is missing")
    v = d[key]
    if isinstance(v, bool) and bool not in (types if isinstance(types, tuple) else (types,)):
        raise PlanError(f"{path}: {where}{key} must be {types}, got {v!r}")
    if not isinstance(v, types):
        raise PlanError(f"{path}: {where}{key} must be {getattr(types, '__name__', types)}, got {v!r}")
    return v


def load_plan(path: str | Path) -> Plan:
    path = Path(path)
    try:
        raw = json.loads(path.read_text())
    except FileNotFoundError:
        raise PlanError(f"{path}: no such plan file") from None
    except (OSError, ValueError) as e:
        raise PlanError(f"{path}: not a JSON plan: {e}") from None
    if not isinstance(raw, dict):
        raise PlanError(f"{path}: the plan must be a JSON object")
    if raw.get("format") != PLAN_FORMAT:
        raise PlanError(f"{path}: format is {raw.get('format')!r}, want {PLAN_FORMAT!r}")
    model = Path(_need(raw, "model", str, "", path))
    if not (model / "config.json").is_file():
        raise PlanError(f"{path}: model {str(model)!r} has no config.json")
    resume = raw.get("resume_from")
    if resume is not None:
        if not isinstance(resume, str):
            raise PlanError(f"{path}: resume_from must be a directory path or null")
        resume = Path(resume)
        if not (resume / "optimizer.pt").is_file() or not (resume / "config.json").is_file():
            raise PlanError(f"{path}: resume_from {str(resume)!r} is not a kiln checkpoint (config.json, optimizer.pt)")
    out = Path(_need(raw, "out", str, "", path))
    seed = _need(raw, "seed", int, "", path)
    temperature = float(_need(raw, "temperature", (int, float), "", path))
    if not temperature > 0:
        raise PlanError(f"{path}: temperature must be > 0, got {temperature}")
    G = _need(raw, "global_batch_size", int, "", path)
    loss = _need(raw, "loss", dict, "", path)
    opt = _need(raw, "optimizer", dict, "", path)
    for k in ("lr", "grad_clip"):
        v = opt.get(k)
        if not isinstance(v, (int, float)) or isinstance(v, bool) or not math.isfinite(v) or v < 0:
            raise PlanError(f"{path}: optimizer.{k} must be a number >= 0, got {v!r}")
    steps_raw = _need(raw, "steps", list, "", path)
    if not steps_raw:
        raise PlanError(f"{path}: steps is empty")
    steps = []
    for i, s in enumerate(steps_raw):
        w = f"steps[{i}]."
        if not isinstance(s, dict):
            raise PlanError(f"{path}: steps[{i}] must be an object")
        mbs = _need(s, "micro_batches", list, w, path)
        if not mbs:
            raise PlanError(f"{path}: {w}micro_batches is empty")
        files = []
        for j, m in enumerate(mbs):
            if not isinstance(m, str) or Path(m).is_absolute() or ".." in Path(m).parts:
                raise PlanError(f"{path}: {w}micro_batches[{j}] must be a path relative to the plan's directory")
            f = path.parent / m
            if not f.is_file():
                raise PlanError(f"{path}: {w}micro_batches[{j}] {m!r} does not exist")
            files.append(f)
        div = float(_need(s, "divisor", (int, float), w, path))
        if not div > 0:
            raise PlanError(f"{path}: {w}divisor must be > 0, got {div}")
        steps.append(Step(
            index=_need(s, "index", int, w, path),
            rollouts=_need(s, "rollouts", int, w, path),
            segments=_need(s, "segments", int, w, path),
            tokens=_need(s, "tokens", int, w, path),
            trained_tokens=_need(s, "trained_tokens", int, w, path),
            divisor=div,
            micro_batches=files,
        ))
    return Plan(path=path, model=model, resume_from=resume, out=out, seed=seed, temperature=temperature,
                global_batch_size=G, loss=loss, optimizer=opt, steps=steps,
                dropped_rollouts=int(raw.get("dropped_rollouts", 0)), raw=raw)


@dataclass
class MicroBatch:
    """One micro-batch file's columns (docs/train.md §9), checked."""

    path: Path
    tokens: torch.Tensor
    seq_offsets: torch.Tensor
    response_lengths: torch.Tensor
    loss_mask: torch.Tensor
    rollout_logprobs: torch.Tensor
    advantages: torch.Tensor
    denominators: torch.Tensor
    rollout_index: torch.Tensor
    spans: Optional[tuple[torch.Tensor, torch.Tensor, Optional[torch.Tensor]]]

    @property
    def n_segments(self) -> int:
        return int(self.response_lengths.numel())


def load_micro_batch(path: Path) -> MicroBatch:
    try:
        t = load_file(str(path))
    except Exception as e:  # safetensors raises several types
        raise PlanError(f"{path}: not a safetensors file: {e}") from None
    for name, (dt, req) in COLUMNS.items():
        if name not in t:
            if req:
                raise PlanError(f"{path}: column {name} is missing")
            continue
        if t[name].dtype != dt or t[name].dim() != 1:
            raise PlanError(f"{path}: column {name} is {t[name].dtype} {tuple(t[name].shape)}, want 1-d {dt}")
    S = t["response_lengths"].numel()
    off = t["seq_offsets"]
    if off.numel() != S + 1 or int(off[0]) != 0 or int(off[-1]) != t["tokens"].numel() or bool((off[1:] < off[:-1]).any()):
        raise PlanError(f"{path}: seq_offsets must be [S+1] from 0 to len(tokens), non-decreasing")
    seg_len = off[1:] - off[:-1]
    rl = t["response_lengths"].long()
    if bool((rl < 1).any()) or bool((rl >= seg_len).any()):
        raise PlanError(f"{path}: response_lengths must be >= 1 and shorter than each segment (a prompt token first)")
    R = int(rl.sum())
    for name in ("loss_mask", "rollout_logprobs", "advantages"):
        if t[name].numel() != R:
            raise PlanError(f"{path}: column {name} has {t[name].numel()} entries, want {R} (Σ response_lengths)")
    for name in ("denominators", "rollout_index"):
        if t[name].numel() != S:
            raise PlanError(f"{path}: column {name} has {t[name].numel()} entries, want {S} (segments)")
    if bool((t["loss_mask"] > 1).any()):
        raise PlanError(f"{path}: loss_mask must be 0 or 1")
    for name in ("rollout_logprobs", "advantages", "denominators"):
        if not bool(torch.isfinite(t[name]).all()):
            raise PlanError(f"{path}: column {name} has a non-finite value")
    spans = None
    if "top_p_offsets" in t or "top_p_ids" in t or "top_p_probs" in t:
        # the probabilities are absent when the trajectories recorded ids only
        if "top_p_offsets" not in t or "top_p_ids" not in t:
            raise PlanError(f"{path}: top_p_offsets and top_p_ids come together")
        po, pi, pp = t["top_p_offsets"], t["top_p_ids"], t.get("top_p_probs")
        if po.numel() != R + 1 or int(po[0]) != 0 or int(po[-1]) != pi.numel() \
                or (pp is not None and pi.numel() != pp.numel()) or bool((po[1:] < po[:-1]).any()):
            raise PlanError(f"{path}: top_p_offsets must be [R+1] from 0 to len(top_p_ids) = len(top_p_probs)")
        spans = (po, pi, pp)
    return MicroBatch(path=path, tokens=t["tokens"], seq_offsets=off, response_lengths=t["response_lengths"],
                      loss_mask=t["loss_mask"], rollout_logprobs=t["rollout_logprobs"], advantages=t["advantages"],
                      denominators=t["denominators"], rollout_index=t["rollout_index"], spans=spans)
