"""Writes kiln-train's batch directory from Python (docs/train.md §9), for the tests.

A segment is a dict: prompt (ids), response (ids), mask, roll (rollout
logprobs), adv (per token or a scalar), rollout (id); optional spans: a
list per response token of (ids, probs). A step is a list of micro-batches,
each a list of segments.
"""

from __future__ import annotations

import json
from pathlib import Path

import torch
from safetensors.torch import save_file

from kiln_gpu.loss import step_denominators


def segment(g: torch.Generator, vocab: int, n_prompt: int, n_resp: int, rollout: int, adv: float,
            mask=None, spans=None) -> dict:
    ids = torch.randint(0, vocab, (n_prompt + n_resp,), generator=g).tolist()
    return {
        "prompt": ids[:n_prompt], "response": ids[n_prompt:],
        "mask": mask if mask is not None else [1] * n_resp,
        "roll": (-(torch.rand(n_resp, generator=g) * 3)).tolist(),
        "adv": [adv] * n_resp if isinstance(adv, (int, float)) else list(adv),
        "rollout": rollout, "spans": spans,
    }


def write_micro_batch(path: Path, segs: list[dict], denoms: list[float]) -> None:
    toks, off, rl, mask, roll, adv, ri = [], [0], [], [], [], [], []
    po, pi, pp = [0], [], []
    with_spans = any(s.get("spans") is not None for s in segs)
    for s in segs:
        toks += s["prompt"] + s["response"]
        off.append(len(toks))
        rl.append(len(s["response"]))
        mask += s["mask"]
        roll += s["roll"]
        adv += s["adv"]
        ri.append(s["rollout"])
        if with_spans:
            for ids, probs in (s.get("spans") or [([], [])] * len(s["response"])):
                pi += list(ids)
                pp += list(probs)
                po.append(len(pi))
    t = {
        "tokens": torch.tensor(toks, dtype=torch.int32),
        "seq_offsets": torch.tensor(off, dtype=torch.int64),
        "response_lengths": torch.tensor(rl, dtype=torch.int32),
        "loss_mask": torch.tensor(mask, dtype=torch.uint8),
        "rollout_logprobs": torch.tensor(roll, dtype=torch.float32),
        "advantages": torch.tensor(adv, dtype=torch.float32),
        "denominators": torch.tensor(denoms, dtype=torch.float32),
        "rollout_index": torch.tensor(ri, dtype=torch.int32),
    }
    if with_spans:
        t["top_p_offsets"] = torch.tensor(po, dtype=torch.int64)
        t["top_p_ids"] = torch.tensor(pi, dtype=torch.int32)
        t["top_p_probs"] = torch.tensor(pp, dtype=torch.float32)
    save_file(t, str(path))


def write_plan(dir: Path, model: Path, steps: list[list[list[dict]]], out: Path, resume_from=None,
               loss: dict | None = None, optimizer: dict | None = None, temperature: float = 1.0,
               seed: int = 0, **flags) -> Path:
    """Writes dir/plan.json and the micro-batch files; returns the plan path.
    Denominators and divisors follow loss["reduction"] (docs/train.md §4)."""
    dir = Path(dir)
    dir.mkdir(parents=True, exist_ok=True)
    loss = {"objective": "ppo", "eps_clip": 0.2, "eps_clip_high": None, "eps_clip_c": None, "correction": None,
            "correction_low": 0.0, "correction_high": 2.0, "reduction": "rollout", "kl_coef": 0.0,
            "entropy_coef": 0.0, "score_centering": False, **(loss or {})}
    optimizer = {"lr": 1e-3, "weight_decay": 0.0, "betas": [0.9, 0.999], "eps": 1e-8, "grad_clip": 1.0,
                 **(optimizer or {})}
    plan_steps = []
    G = None
    for si, mbs in enumerate(steps):
        segs = [s for mb in mbs for s in mb]
        rt: dict[int, int] = {}
        for s in segs:
            rt[s["rollout"]] = rt.get(s["rollout"], 0) + sum(s["mask"])
        dens, div = step_denominators([s["rollout"] for s in segs], [sum(s["mask"]) for s in segs],
                                      [rt[s["rollout"]] for s in segs], loss["reduction"])
        names = []
        k = 0
        (dir / f"step-{si:05d}").mkdir(exist_ok=True)
        for mi, mb in enumerate(mbs):
            name = f"step-{si:05d}/mb-{mi:05d}.safetensors"
            write_micro_batch(dir / name, mb, dens[k:k + len(mb)])
            k += len(mb)
            names.append(name)
        G = len(rt)
        plan_steps.append({
            "index": si, "rollouts": len(rt), "segments": len(segs),
            "tokens": sum(len(s["prompt"]) + len(s["response"]) for s in segs),
            "trained_tokens": sum(sum(s["mask"]) for s in segs), "divisor": div, "micro_batches": names,
        })
    plan = {"format": "kiln-train-plan/1", "model": str(model), "resume_from": None if resume_from is None else
            str(resume_from), "out": str(out), "seed": seed, "temperature": temperature, "global_batch_size": G,
            "loss": loss, "optimizer": optimizer, "steps": plan_steps, "dropped_rollouts": 0, **flags}
    p = dir / "plan.json"
    p.write_text(json.dumps(plan, indent=1))
    return p
