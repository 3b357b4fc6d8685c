"""kiln's trainer: one plan of kiln-train's batches, AdamW steps, an HF
checkpoint (docs/train.md §9–§11).

    python -m kiln_gpu.train --plan DIR/plan.json
    torchrun --nproc-per-node N -m kiln_gpu.train --plan DIR/plan.json

stdout: JSON lines ({"event":"start"}, one {"event":"step"} per optimizer
step, {"event":"saved"}); logs on stderr. Exit 0 once the output directory
is complete, 2 for a bad plan (the message names the file and field), 1
for any other failure.
"""

from __future__ import annotations

import argparse
import contextlib
import json
import logging
import math
import os
import sys
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Optional

import torch

from .batches import MicroBatch, Plan, PlanError, load_micro_batch, load_plan
from .checkpoint import DEFAULT_SHARD_BYTES, CheckpointError, load_optimizer_state, write_checkpoint
from .defaults import LOSS, OPTIMIZER
from .loss import LossConfig
from .objectives import Objective, micro_batch_loss, policy_logprobs

log = logging.getLogger("kiln_gpu.train")

# Dense bf16 peak FLOP/s by device-name substring (docs/train.md §11).
PEAK_FLOPS = (
    ("H200", 989e12),
    ("H100", 989e12),
    ("H800", 989e12),
    ("GH200", 989e12),
    ("B200", 2250e12),
    ("A100", 312e12),
    ("A800", 312e12),
    ("L40S", 362e12),
    ("A10", 125e12),
    ("L4", 121e12),
)


def peak_flops(name: str) -> Optional[float]:
    for key, v in PEAK_FLOPS:
        if key in name:
            return v
    return None


def objective_from_plan(plan: Plan) -> Objective:
    """The plan's "loss", each field it leaves out at defaults.json's value."""
    extra = sorted(set(plan.loss) - set(LOSS))
    if extra:
        raise PlanError(f"{plan.path}: loss has unknown fields {extra}")
    L = {**LOSS, **plan.loss}

    def opt_float(k: str) -> Optional[float]:
        return None if L[k] is None else float(L[k])

    try:
        base = LossConfig(
            eps_clip=float(L["eps_clip"]),
            eps_clip_high=opt_float("eps_clip_high"),
            eps_clip_c=opt_float("eps_clip_c"),
            correction=L["correction"],
            correction_low=float(L["correction_low"]),
            correction_high=float(L["correction_high"]),
            reduction=L["reduction"],
        )
        if base.eps_clip_c is not None and base.eps_clip_c <= 1:
            raise ValueError(f"eps_clip_c must be > 1, got {base.eps_clip_c}")
        if L["score_centering"] and plan.temperature <= 0:
            raise ValueError("score centering needs temperature > 0")
        return Objective(
            objective=L["objective"],
            base=base,
            kl_coef=float(L["kl_coef"]),
            entropy_coef=float(L["entropy_coef"]),
            score_centering=bool(L["score_centering"]),
            sc_path=L["score_centering_path"],
            old_logprobs=L["old_logprobs"],
        )
    except (TypeError, ValueError) as e:
        raise PlanError(f"{plan.path}: loss: {e}") from None


class Dist:
    """The process group, if any: rank r trains micro-batches r::world of each step."""

    def __init__(self) -> None:
        self.world = int(os.environ.get("WORLD_SIZE", "1"))
        self.rank = int(os.environ.get("RANK", "0"))
        self.local_rank = int(os.environ.get("LOCAL_RANK", "0"))
        self.on = self.world > 1
        if self.on:
            import torch.distributed as dist

            backend = "nccl" if torch.cuda.is_available() else "gloo"
            if torch.cuda.is_available():
                torch.cuda.set_device(self.local_rank)
            dist.init_process_group(backend)

    def all_reduce_(self, t: torch.Tensor, op: str = "sum") -> torch.Tensor:
        if self.on:
            import torch.distributed as dist

            dist.all_reduce(t, op=dist.ReduceOp.MAX if op == "max" else dist.ReduceOp.SUM)
        return t

    def close(self) -> None:
        if self.on:
            import torch.distributed as dist

            dist.destroy_process_group()


def response_logits(model, mb: MicroBatch, temperature: float, device, autocast,
                    direct: bool = True) -> tuple[torch.Tensor, torch.Tensor]:
    """The logits / T that predict each response token (position t−1 for
    token t, docs/train.md §2) and those tokens, in the file's order.
    The segments are right-padded into one batch; causal attention keeps
    the padding out of every real position. direct: run the decoder and
    apply the LM head only to the rows that train (R × V logits, not
    S × L × V); off under FSDP, whose root module must run its own forward."""
    off = mb.seq_offsets.tolist()
    lens = [b - a for a, b in zip(off, off[1:])]
    S, Lmax = len(lens), max(lens)
    ids = torch.zeros(S, Lmax, dtype=torch.long)
    att = torch.zeros(S, Lmax, dtype=torch.long)
    for i, (a, n) in enumerate(zip(off, lens)):
        ids[i, :n] = mb.tokens[a:a + n].long()
        att[i, :n] = 1
    ids, att = ids.to(device), att.to(device)
    rl = mb.response_lengths.tolist()
    # row i, the positions n−rl−1 … n−2 predict the response tokens n−rl … n−1
    rows = torch.cat([torch.full((r,), i, dtype=torch.long) for i, r in enumerate(rl)]).to(device)
    cols = torch.cat([torch.arange(n - r - 1, n - 1) for n, r in zip(lens, rl)]).to(device)
    with autocast():
        direct = direct and hasattr(model, "model") and hasattr(model, "lm_head")
        if direct:
            hidden = model.model(input_ids=ids, attention_mask=att).last_hidden_state
            logits = model.lm_head(hidden[rows, cols])  # only the rows that train: R × V, not S × L × V
        else:
            logits = model(input_ids=ids, attention_mask=att).logits[rows, cols]
    logits = logits.float() if logits.dtype in (torch.float16, torch.bfloat16) else logits
    if temperature != 1.0:
        logits = logits / temperature
    target = ids[rows, cols + 1]
    return logits, target


def micro_batch_step(model, ref_model, mb: MicroBatch, obj: Objective, divisor: float, temperature: float,
                     device, autocast, scale: float = 1.0, direct: bool = True,
                     old: Optional[torch.Tensor] = None):
    """Forward and backward of one micro-batch; returns its metrics. scale 0
    is the FSDP filler pass (same collectives, no contribution). old: the
    micro-batch's old logprobs from old_logprobs (None: the current
    weights are the old policy's, docs/train.md §13)."""
    logits, target = response_logits(model, mb, temperature, device, autocast, direct)
    rl = mb.response_lengths.long()
    seg = torch.repeat_interleave(torch.arange(mb.n_segments), rl).to(device)
    denom = mb.denominators.to(device)[seg]
    ref_lp = None
    if ref_model is not None:
        with torch.no_grad():
            rlog, _ = response_logits(ref_model, mb, temperature, device, autocast, direct)
            ref_lp = torch.log_softmax(rlog, -1).gather(-1, target.unsqueeze(-1)).squeeze(-1)
    spans = None if mb.spans is None else tuple(None if x is None else x.to(device) for x in mb.spans)
    out = micro_batch_loss(
        obj, logits, target, mb.rollout_logprobs.to(device), mb.advantages.to(device),
        mb.loss_mask.to(device), denom, divisor, seg, mb.n_segments, ref_lp=ref_lp, spans=spans,
        old=None if old is None else old.to(device),
    )
    (out.loss * scale if scale != 1.0 else out.loss).backward()
    if scale != 1.0:
        return {}
    return {**out.metrics,
            "train_rollout_logprob_max_abs_diff": max_abs_logprob_diff(logits, target, mb, device, out.full_lp)}


def old_logprobs(model, plan: Plan, obj: Objective, dist: "Dist", device, autocast, fsdp: bool) -> dict:
    """PPO's old policy, fixed before the run's first optimizer step
    (docs/train.md §13): one no-grad forward pass over each of this rank's
    micro-batches of steps 2…n with the weights as loaded, the objective's
    logprob of every response token kept on the CPU ([R] floats a
    micro-batch, never logits). Step 1 needs none: its weights are these,
    so its old logprobs are sg(lp) exactly. Returns {(step, j): tensor} for
    the rank's j-th micro-batch; empty under old_logprobs "rollout" (old
    is the rollout logprobs) and for a one-step plan. Under FSDP every rank
    runs the same number of passes, as in training."""
    out: dict[tuple[int, int], torch.Tensor] = {}
    if obj.old_logprobs != "recompute" or not obj.uses_old:  # REINFORCE has no old policy
        return out
    with torch.no_grad():
        for si, step in enumerate(plan.steps):
            if si == 0:
                continue
            mine = step.micro_batches[dist.rank::dist.world]
            n_rounds = math.ceil(len(step.micro_batches) / dist.world) if fsdp else len(mine)
            for j in range(n_rounds):
                mb = load_micro_batch(mine[j] if j < len(mine) else step.micro_batches[0])
                logits, target = response_logits(model, mb, plan.temperature, device, autocast, direct=not fsdp)
                if j >= len(mine):
                    continue  # FSDP filler: the collectives only
                spans = None if mb.spans is None else tuple(None if x is None else x.to(device) for x in mb.spans)
                lp = policy_logprobs(obj, logits, target, mb.rollout_logprobs.to(device).to(logits.dtype), spans)[0]
                out[(si, j)] = lp.detach().cpu()
    return out


# Metrics a step reduces by their maximum over micro-batches and ranks; the
# others are sums of per-rollout-reduced terms.
MAX_METRICS = ("train_rollout_logprob_max_abs_diff",)


def max_abs_logprob_diff(logits, target, mb: MicroBatch, device, full_lp: Optional[torch.Tensor] = None) -> float:
    """max |log_softmax(logits / T)[target] - rollout logprob| over the
    trained tokens (loss mask 1) of the micro-batch: the on-policy identity
    (docs/train-stage.md §13) needs the worst token, which the mean
    train_rollout_logprob_abs_diff hides. Full-vocabulary logprobs, as the
    engine reports them (docs/serve.md §4); 0 with no trained token.
    full_lp: those logprobs when the loss already computed them (the plain
    objective's lp, LossOutput.full_lp); else one logsumexp over the R × V
    logits computes them here, which on a small model with a large
    vocabulary is a sixth of a CPU step (docs/train.md §12)."""
    with torch.no_grad():
        if full_lp is not None:
            lp = full_lp.detach()
        else:
            lg = logits.detach()
            lg = lg if lg.dtype == torch.float64 else lg.float()
            lp = lg.gather(-1, target.long().unsqueeze(-1)).squeeze(-1) - torch.logsumexp(lg, -1)
        m = mb.loss_mask.to(device) > 0
        if not bool(m.any()):
            return 0.0
        # in float64: a float64 run's difference is not rounded to float32's
        return float((lp.double() - mb.rollout_logprobs.to(device).double())[m].abs().max())


def build_optimizer(model, o: dict[str, Any]):
    """AdamW per the plan's "optimizer", what it leaves out (all but lr) at
    defaults.json's value."""
    o = {**OPTIMIZER, **o}
    betas = o["betas"]
    return torch.optim.AdamW(
        model.parameters(), lr=float(o["lr"]), betas=(float(betas[0]), float(betas[1])),
        eps=float(o["eps"]), weight_decay=float(o["weight_decay"]),
        foreach=False,
    )


def load_optimizer_keeping_plan(opt, state: dict) -> None:
    """Loads a resumed optimizer's state (AdamW's moments and step count)
    but keeps this plan's hyperparameters: torch's load_state_dict also
    restores the saved param_groups' lr, betas, eps and weight decay, which
    would silently make a resumed run train at the previous run's --lr
    (docs/train.md §9)."""
    plan = [{k: v for k, v in g.items() if k != "params"} for g in opt.param_groups]
    opt.load_state_dict(state)
    for g, hp in zip(opt.param_groups, plan):
        g.update(hp)


def grad_norm_and_clip(model, max_norm: float) -> float:
    params = [p for p in model.parameters() if p.grad is not None]
    norm = torch.nn.utils.clip_grad_norm_(params, max_norm if max_norm > 0 else float("inf"))
    if hasattr(norm, "full_tensor"):
        norm = norm.full_tensor()
    return float(norm)


def _save_dtype(model_dir: Path, fallback: torch.dtype) -> torch.dtype:
    cfg = json.loads((model_dir / "config.json").read_text())
    name = cfg.get("dtype") or cfg.get("torch_dtype")
    return getattr(torch, name) if isinstance(name, str) and isinstance(getattr(torch, name, None), torch.dtype) else fallback


def emit(obj: dict) -> None:
    sys.stdout.write(json.dumps(obj) + "\n")
    sys.stdout.flush()


@dataclass
class RunResult:
    """What run() trained, for save(): the model and optimizer after the
    plan's steps, each step's event line (metrics.jsonl), the global step
    reached (counting a resumed run's earlier steps), whether the model is
    FSDP-sharded, and the dtype it trained in."""

    model: torch.nn.Module
    opt: torch.optim.Optimizer
    lines: list[str]
    done_steps: int
    fsdp: bool
    dtype: torch.dtype


def run(plan: Plan, dist: Dist) -> RunResult:
    from transformers import AutoModelForCausalLM

    obj = objective_from_plan(plan)
    cuda = torch.cuda.is_available() and plan.flag("device", "auto") != "cpu"
    device = torch.device("cuda", dist.local_rank) if cuda else torch.device("cpu")
    dtype = getattr(torch, plan.flag("dtype", "float32"))
    bf16 = bool(plan.flag("bf16", cuda and dtype == torch.float32))  # never under float64: it is asked for exactness
    autocast = (lambda: torch.autocast("cuda", dtype=torch.bfloat16)) if (cuda and bf16) else contextlib.nullcontext
    torch.manual_seed(plan.seed)
    src = plan.resume_from or plan.model
    # before any weights: a refused optimizer state fails fast (exit 2)
    resumed = None if plan.resume_from is None else load_optimizer_state(plan.resume_from, device)
    model = AutoModelForCausalLM.from_pretrained(src, dtype=dtype).to(device)
    model.train()
    if cuda and plan.flag("activation_checkpointing", True):
        model.gradient_checkpointing_enable(gradient_checkpointing_kwargs={"use_reentrant": False})
    ref_model = None
    if obj.kl_coef != 0.0:
        ref_model = AutoModelForCausalLM.from_pretrained(plan.model, dtype=dtype).to(device).eval()
        for p in ref_model.parameters():
            p.requires_grad_(False)
    fsdp = dist.on and cuda
    if fsdp:
        from torch.distributed.fsdp import fully_shard

        for layer in model.model.layers:
            fully_shard(layer)
        fully_shard(model)
        # the step's gradient is the SUM of the ranks' micro-batches (docs/train.md §11)
        model.set_reduce_scatter_divide_factor(1.0)
    opt = build_optimizer(model, plan.optimizer)
    done_steps = 0
    if resumed is not None:
        st = resumed
        if "master" in st:
            model.load_state_dict(st["master"])
        load_optimizer_keeping_plan(opt, st["optimizer"])
        done_steps = int(st["step"])
        torch.set_rng_state(st["rng"]["cpu"])
    n_params = sum(p.numel() for p in model.parameters())
    peak = peak_flops(torch.cuda.get_device_name(device)) if cuda else None
    if dist.rank == 0:
        emit({"event": "start", "plan": str(plan.path), "model": str(src), "steps": len(plan.steps),
                  "world_size": dist.world, "device": str(device), "params": n_params, "resumed_at": done_steps})
    olds = old_logprobs(model, plan, obj, dist, device, autocast, fsdp)
    lines = []
    for si, step in enumerate(plan.steps):
        t0 = time.perf_counter()
        opt.zero_grad(set_to_none=True)
        mine = step.micro_batches[dist.rank::dist.world]
        sums: dict[str, float] = {}
        maxes: dict[str, float] = {k: 0.0 for k in MAX_METRICS}
        tokens = 0
        n_rounds = math.ceil(len(step.micro_batches) / dist.world) if fsdp else len(mine)
        for j in range(n_rounds):
            if j < len(mine):
                mb = load_micro_batch(mine[j])
                m = micro_batch_step(model, ref_model, mb, obj, step.divisor, plan.temperature, device, autocast,
                                     direct=not fsdp, old=olds.pop((si, j), None))
                tokens += mb.tokens.numel()
            else:  # FSDP: every rank runs the same number of forward/backward passes
                mb = load_micro_batch(step.micro_batches[0])
                m = micro_batch_step(model, ref_model, mb, obj, step.divisor, plan.temperature, device,
                                     autocast, scale=0.0, direct=False)
            for k, v in m.items():
                if v is None:
                    continue
                if k in maxes:
                    maxes[k] = max(maxes[k], v)
                else:
                    sums[k] = sums.get(k, 0.0) + v
        if dist.on and not fsdp:
            for p in model.parameters():
                if p.grad is None:
                    p.grad = torch.zeros_like(p)
                dist.all_reduce_(p.grad)
        keys = sorted(set(sums) | {"loss", "pg_loss", "pg_clipfrac", "ppo_kl", "train_rollout_logprob_abs_diff",
                                   "kl_loss"})
        vec = torch.tensor([sums.get(k, 0.0) for k in keys] + [float(tokens)], dtype=torch.float64)
        if dist.on:
            vec = dist.all_reduce_(vec.to(device)).cpu()
        metrics = dict(zip(keys, vec[:-1].tolist()))
        mx = torch.tensor([maxes[k] for k in MAX_METRICS], dtype=torch.float64)
        if dist.on:
            mx = dist.all_reduce_(mx.to(device), op="max").cpu()
        metrics.update(zip(MAX_METRICS, mx.tolist()))
        metrics.setdefault("entropy", None)
        tokens = int(vec[-1])
        gn = grad_norm_and_clip(model, float(plan.optimizer["grad_clip"]))  # required by load_plan
        opt.step()
        if cuda:
            torch.cuda.synchronize(device)
        dt = time.perf_counter() - t0
        done_steps += 1
        ev = {"event": "step", "step": si, "steps": len(plan.steps), "index": step.index,
              "global_step": done_steps, **metrics, "grad_norm": gn, "tokens": tokens,
              "tokens_per_s": tokens / dt if dt > 0 else None,
              "mfu": (6 * n_params * tokens / dt / (peak * dist.world)) if (peak and dt > 0) else None,
              "time_s": dt, "rollouts": step.rollouts, "global_batch_size": plan.global_batch_size}
        lines.append(json.dumps(ev))
        if dist.rank == 0:
            emit(ev)
    return RunResult(model=model, opt=opt, lines=lines, done_steps=done_steps, fsdp=fsdp, dtype=dtype)


def save(plan: Plan, dist: Dist, res: RunResult) -> None:
    model, opt = res.model, res.opt
    state = model.state_dict()
    if res.fsdp:
        from torch.distributed.checkpoint.state_dict import StateDictOptions, get_model_state_dict, \
            get_optimizer_state_dict

        state = get_model_state_dict(model, options=StateDictOptions(full_state_dict=True, cpu_offload=True))
        ostate = get_optimizer_state_dict(model, opt, options=StateDictOptions(full_state_dict=True, cpu_offload=True))
    else:
        ostate = opt.state_dict()
    if dist.rank != 0:
        return
    save_dtype = _save_dtype(plan.model, res.dtype)
    opt_file = {"optimizer": ostate, "step": res.done_steps, "rng": {"cpu": torch.get_rng_state()}}
    if save_dtype != res.dtype:
        # the saved weights are rounded; resume needs the exact master copy
        opt_file["master"] = {k: v.detach().cpu() for k, v in state.items()}
    trainer_state = {"format": "kiln-trainer-state/1", "global_step": res.done_steps,
                     "plan_steps": [s.index for s in plan.steps], "base_model": str(plan.model),
                     "resumed_from": None if plan.resume_from is None else str(plan.resume_from),
                     "seed": plan.seed, "world_size": dist.world, "dropped_rollouts": plan.dropped_rollouts}
    write_checkpoint(plan.out, plan.model, state, save_dtype, opt_file, trainer_state, res.lines,
                     int(plan.flag("max_shard_bytes", DEFAULT_SHARD_BYTES)))
    emit({"event": "saved", "dir": str(plan.out)})


def main(argv=None) -> int:
    p = argparse.ArgumentParser(prog="python -m kiln_gpu.train", description=__doc__.split("\n\n")[0])
    p.add_argument("--plan", required=True, help="kiln-train's plan.json")
    a = p.parse_args(argv)
    logging.basicConfig(stream=sys.stderr, level=logging.INFO, format="%(asctime)s %(levelname)s %(message)s")
    try:
        plan = load_plan(a.plan)
        objective_from_plan(plan)
        if plan.out.exists():
            raise PlanError(f"{plan.path}: out {str(plan.out)!r} exists; the trainer writes a new directory")
    except PlanError as e:
        log.error("bad plan: %s", e)
        return 2
    dist = None
    try:
        dist = Dist()
        res = run(plan, dist)
        save(plan, dist, res)
        return 0
    except PlanError as e:
        log.error("bad plan: %s", e)
        return 2
    except CheckpointError as e:
        log.error("refused --resume-from checkpoint: %s", e)
        return 2
    except Exception:
        log.exception("training failed")
        return 1
    finally:
        if dist is not None:
            dist.close()


if __name__ == "__main__":
    raise SystemExit(main())
