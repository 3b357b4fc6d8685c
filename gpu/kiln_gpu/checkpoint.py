"""The trainer's output directory (docs/train.md §10): HF layout weights,
the base model's other files, metrics, optimizer and trainer state.
Written into OUT.tmp-<pid> and renamed to OUT, so OUT exists only complete.
"""

from __future__ import annotations

import json
import os
import pickle
import shutil
from pathlib import Path

import torch
from safetensors.torch import save_file

WEIGHT_SUFFIXES = (".safetensors", ".bin", ".pt", ".pth", ".ckpt", ".msgpack", ".h5")
DEFAULT_SHARD_BYTES = 5 * 1024**3
OPTIMIZER_FILE = "optimizer.pt"


def is_weight_file(name: str) -> bool:
    return name.endswith(WEIGHT_SUFFIXES) or name.endswith(".index.json")


def _dedup(state: dict[str, torch.Tensor]) -> dict[str, torch.Tensor]:
    """Drops tensors that share storage with an earlier one (tied weights:
    HF keeps the first, e.g. embed_tokens, and re-ties on load)."""
    seen, out = set(), {}
    for k, v in state.items():
        key = (v.untyped_storage().data_ptr(), v.storage_offset(), tuple(v.shape))
        if key in seen:
            continue
        seen.add(key)
        out[k] = v
    return out


def save_weights(state: dict[str, torch.Tensor], out: Path, dtype: torch.dtype, max_shard_bytes: int) -> None:
    state = _dedup(state)
    shards: list[dict[str, torch.Tensor]] = [{}]
    size = 0
    total = 0
    for k, v in state.items():
        t = v.detach().to("cpu", dtype if v.is_floating_point() else v.dtype).contiguous()
        n = t.numel() * t.element_size()
        if shards[-1] and size + n > max_shard_bytes:
            shards.append({})
            size = 0
        shards[-1][k] = t
        size += n
        total += n
    n_sh = len(shards)
    weight_map = {}
    for i, sh in enumerate(shards):
        name = f"model-{i + 1:05d}-of-{n_sh:05d}.safetensors"
        save_file(sh, str(out / name), metadata={"format": "pt"})
        for k in sh:
            weight_map[k] = name
    (out / "model.safetensors.index.json").write_text(
        json.dumps({"metadata": {"total_size": total}, "weight_map": dict(sorted(weight_map.items()))}, indent=2) + "\n"
    )


def copy_base_files(base: Path, out: Path) -> None:
    """Every top-level non-weight file of the base (config, tokenizer, chat
    template, generation config), docs/train-stage.md §6.1."""
    for p in sorted(base.iterdir()):
        if p.name in (OPTIMIZER_FILE, "trainer_state.json", "metrics.jsonl") or not p.is_file():
            continue
        if not is_weight_file(p.name):
            shutil.copyfile(p, out / p.name)


def write_checkpoint(
    out: Path,
    base: Path,
    state: dict[str, torch.Tensor],
    save_dtype: torch.dtype,
    optimizer_state: dict,
    trainer_state: dict,
    metrics_lines: list[str],
    max_shard_bytes: int = DEFAULT_SHARD_BYTES,
) -> None:
    if out.exists():
        raise FileExistsError(f"{out} exists: the trainer writes a new directory")
    tmp = out.parent / f"{out.name}.tmp-{os.getpid()}"
    if tmp.exists():
        shutil.rmtree(tmp)
    tmp.mkdir(parents=True)
    copy_base_files(base, tmp)
    save_weights(state, tmp, save_dtype, max_shard_bytes)
    (tmp / "metrics.jsonl").write_text("".join(line + "\n" for line in metrics_lines))
    torch.save(optimizer_state, tmp / OPTIMIZER_FILE)  # loadable with weights_only=True only
    (tmp / "trainer_state.json").write_text(json.dumps(trainer_state, indent=2, sort_keys=True) + "\n")
    os.rename(tmp, out)


class CheckpointError(ValueError):
    """A checkpoint the trainer refuses to load (exit 2): its optimizer
    state needs more than tensors and plain containers, or is malformed."""


def load_optimizer_state(ckpt: Path, map_location) -> dict:
    """ckpt's optimizer.pt, loaded with torch.load(weights_only=True): the
    unpickler builds tensors, dicts, lists, tuples, strings and numbers
    only, and refuses any other global before calling it, so a crafted file
    in the store cannot run code on the training node (docs/train.md §10).
    What write_checkpoint saves is within those types, old checkpoints'
    optimizer.pt included. CheckpointError otherwise."""
    path = ckpt / OPTIMIZER_FILE
    try:
        st = torch.load(path, map_location=map_location, weights_only=True)
    except pickle.UnpicklingError as ex:
        why = next((ln.strip() for ln in str(ex).splitlines() if "GLOBAL" in ln), "not a weights-only pickle")
        raise CheckpointError(
            f"{path}: refused: loading it would need code beyond tensors and plain containers ({why}); "
            "kiln never loads a checkpoint with pickle's arbitrary objects: resume from a checkpoint "
            "kiln-train wrote, or train without --resume-from") from None
    except (RuntimeError, EOFError, OSError) as ex:
        raise CheckpointError(f"{path}: not a readable optimizer state ({ex}): resume from a checkpoint kiln-train wrote") from None
    _check_optimizer_state(path, st)
    return st


def _check_optimizer_state(path: Path, st) -> None:
    """The layout train.save writes: {"optimizer": dict, "step": int,
    "rng": {"cpu": uint8 tensor}, optionally "master": {name: tensor}}."""
    def fail(what: str):
        raise CheckpointError(f"{path}: {what}: not the optimizer state kiln's trainer writes (docs/train.md §10)")

    if not isinstance(st, dict):
        fail(f"the top level is a {type(st).__name__}, not a dict")
    if not isinstance(st.get("optimizer"), dict):
        fail("no optimizer state dict")
    step = st.get("step")
    if isinstance(step, bool) or not isinstance(step, int) or step < 0:
        fail(f"step {step!r} is not a non-negative integer")
    rng = st.get("rng")
    if not isinstance(rng, dict) or not isinstance(rng.get("cpu"), torch.Tensor) or rng["cpu"].dtype != torch.uint8:
        fail("rng.cpu is not a uint8 tensor")
    master = st.get("master")
    if master is not None and not (isinstance(master, dict) and all(isinstance(v, torch.Tensor) for v in master.values())):
        fail("master is not a dict of tensors")
