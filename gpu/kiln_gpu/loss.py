"""The policy loss: per-token logprobs, PPO clip, rollout-logprob correction
and the reductions (docs/train.md §2–§4).

Everything here works on flat per-token tensors of one micro-batch's trained
region: `lp` (current logprobs, with gradient), `old` (the pre-update
logprobs, detached), `roll` (the sampler's logprobs), `adv` (advantages),
`mask` (loss mask, 0/1) and `denom` (each token's reduction denominator,
docs/train.md §4). A step's objective is the sum of its micro-batches'
`policy_loss(...).loss`, each already divided by the step divisor, so
calling backward on every micro-batch accumulates exactly the step's
gradient.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Optional, Sequence

import torch

from .defaults import LOSS

REDUCTIONS = ("rollout", "token-mean", "sequence-mean")
CORRECTIONS = (None, "tis", "mis")


def token_logprobs(logits: torch.Tensor, tokens: torch.Tensor, temperature: float = 1.0) -> torch.Tensor:
    """Logprob of each token given the ones before it (docs/train.md §2).

    logits: [..., T, V] for the input tokens [..., T]. Returns [..., T-1]:
    entry t is log softmax(logits[t] / temperature)[tokens[t+1]], the
    standard shift (the logits at position t predict token t+1). Half
    precision logits are upcast to float32 first; float64 stays float64.
    """
    if temperature <= 0:
        raise ValueError(f"temperature must be > 0, got {temperature}")
    if logits.shape[:-1] != tokens.shape:
        raise ValueError(f"logits {tuple(logits.shape)} do not match tokens {tuple(tokens.shape)}")
    if logits.dtype in (torch.float16, torch.bfloat16):
        logits = logits.float()
    x = logits[..., :-1, :]
    if temperature != 1.0:
        x = x / temperature
    target = tokens[..., 1:].long().unsqueeze(-1)
    picked = torch.gather(x, -1, target).squeeze(-1)
    return picked - torch.logsumexp(x, dim=-1)


class _TargetLogprobs(torch.autograd.Function):
    """log_softmax(logits)[target] of rows [R, V] without the R × V
    log-softmax: forward one logsumexp and a gather, backward the gradient
    −g·softmax + g at the target in one R × V tensor. Autograd's
    log_softmax + gather keeps the R × V log-softmax, and its backward
    zero-fills an R × V gradient for the gather and writes another for the
    log-softmax: on the demo's CPU steps (~3,000 rows × 152k ids) those
    passes were a third of the step in float32 and over half in float64
    (docs/train.md §2)."""

    @staticmethod
    def forward(ctx, logits: torch.Tensor, target: torch.Tensor) -> torch.Tensor:
        lse = torch.logsumexp(logits, dim=-1)
        ctx.save_for_backward(logits, target, lse)
        return logits.gather(-1, target.unsqueeze(-1)).squeeze(-1) - lse

    @staticmethod
    def backward(ctx, g: torch.Tensor):
        logits, target, lse = ctx.saved_tensors
        grad = torch.sub(logits, lse.unsqueeze(-1)).exp_().mul_(-g.unsqueeze(-1))
        return grad.scatter_add_(-1, target.unsqueeze(-1), g.unsqueeze(-1)), None


def target_logprobs(logits: torch.Tensor, target: torch.Tensor) -> torch.Tensor:
    """log_softmax(logits, -1)[r, target[r]] for logits [R, V], target [R]
    (the full-vocabulary logprob of each row's token), differentiable in
    logits, without materialising the R × V log-softmax (_TargetLogprobs)."""
    return _TargetLogprobs.apply(logits, target.long())


def ppo_clip(
    log_ratio: torch.Tensor,
    adv: torch.Tensor,
    eps_low: float = 0.2,
    eps_high: Optional[float] = None,
    eps_c: Optional[float] = None,
) -> tuple[torch.Tensor, torch.Tensor]:
    """The PPO-clip token loss (minimized) and its clip indicator (docs/train.md §3.1).

    r = exp(log_ratio); loss = max(-r·A, -clip(r, 1-eps_low, 1+eps_high)·A);
    with dual clip (eps_c > 1) a token with A < 0 has loss min(-eps_c·A, loss).
    The indicator is 1 where the clipped branch is the larger.
    """
    if eps_high is None:
        eps_high = eps_low
    if eps_c is not None and eps_c <= 1.0:
        raise ValueError(f"dual clip constant must be > 1, got {eps_c}")
    r = torch.exp(log_ratio)
    unclipped = -r * adv
    clipped = -torch.clamp(r, 1.0 - eps_low, 1.0 + eps_high) * adv
    loss = torch.maximum(unclipped, clipped)
    clipfrac = (clipped > unclipped).to(loss.dtype)
    if eps_c is not None:
        loss = torch.where(adv < 0, torch.minimum(-eps_c * adv, loss), loss)
    return loss, clipfrac


def rollout_correction(
    old: torch.Tensor,
    roll: torch.Tensor,
    mode: Optional[str] = "tis",
    low: float = 0.0,
    high: float = 2.0,
) -> tuple[torch.Tensor, torch.Tensor]:
    """The detached rollout-logprob importance weight and its "changed" indicator
    (docs/train.md §3.2).

    rho = exp(old - roll). tis: w = clamp(rho, low, high); mis: w = rho inside
    [low, high], else 0. The indicator is 1 where w != rho. mode None gives
    w = 1 everywhere.
    """
    if mode not in CORRECTIONS:
        raise ValueError(f"unknown rollout correction {mode!r}: want one of {CORRECTIONS}")
    rho = torch.exp(old.detach() - roll.detach())
    if mode is None:
        return torch.ones_like(rho), torch.zeros_like(rho)
    if mode == "tis":
        w = torch.clamp(rho, low, high)
    else:
        w = torch.where((rho >= low) & (rho <= high), rho, torch.zeros_like(rho))
    return w, (w != rho).to(rho.dtype)


@dataclass(frozen=True)
class LossConfig:
    """The objective's knobs (docs/train.md §3, §4); the defaults are
    defaults.json's, which kiln-train's flags read too."""

    eps_clip: float = LOSS["eps_clip"]
    eps_clip_high: Optional[float] = LOSS["eps_clip_high"]
    eps_clip_c: Optional[float] = LOSS["eps_clip_c"]
    correction: Optional[str] = LOSS["correction"]  # None, "tis" or "mis"
    correction_low: float = LOSS["correction_low"]
    correction_high: float = LOSS["correction_high"]
    reduction: str = LOSS["reduction"]

    def __post_init__(self) -> None:
        if self.reduction not in REDUCTIONS:
            raise ValueError(f"unknown reduction {self.reduction!r}: want one of {REDUCTIONS}")
        if self.correction not in CORRECTIONS:
            raise ValueError(f"unknown rollout correction {self.correction!r}: want one of {CORRECTIONS}")


@dataclass
class LossOutput:
    """loss carries the gradient; metrics are detached step contributions:
    summed over a step's micro-batches they give the step's value."""

    loss: torch.Tensor
    metrics: dict[str, float]
    # the full-vocabulary log_softmax(logits)[target] of each token,
    # detached, when the loss computed it anyway (None otherwise): the
    # trainer's max |lp − roll| metric reads it instead of a second pass
    # over the R × V logits
    full_lp: Optional[torch.Tensor] = None


def reduce(x: torch.Tensor, mask: torch.Tensor, denom: torch.Tensor, divisor: float) -> torch.Tensor:
    """Σ x·m / max(denom, 1), divided by the step divisor (docs/train.md §4)."""
    return (x * mask / torch.clamp(denom, min=1.0)).sum() / divisor


def policy_loss(
    lp: torch.Tensor,
    old: Optional[torch.Tensor],
    roll: torch.Tensor,
    adv: torch.Tensor,
    mask: torch.Tensor,
    denom: torch.Tensor,
    divisor: float,
    cfg: LossConfig = LossConfig(),
) -> LossOutput:
    """One micro-batch's share of the step's PPO objective (docs/train.md §3, §4).

    old None means on-policy: old = sg(lp), so the ratio is 1 and its
    gradient is that of -A·lp. The rollout correction weight is computed
    from old and roll and multiplies the clipped loss, detached.
    """
    if old is None:
        old = lp.detach()
    old = old.detach()
    mask = mask.to(lp.dtype)
    denom = denom.to(lp.dtype)
    roll = roll.to(lp.dtype)
    adv = adv.to(lp.dtype)
    log_ratio = lp - old
    pg, clipfrac = ppo_clip(log_ratio, adv, cfg.eps_clip, cfg.eps_clip_high, cfg.eps_clip_c)
    w, changed = rollout_correction(old, roll, cfg.correction, cfg.correction_low, cfg.correction_high)
    pg = pg * w
    loss = reduce(pg, mask, denom, divisor)
    with torch.no_grad():
        r = lambda x: float(reduce(x, mask, denom, divisor))  # noqa: E731
        metrics = {
            "loss": float(loss.detach()),
            "pg_loss": float(loss.detach()),
            "pg_clipfrac": r(clipfrac),
            "ppo_kl": r(old - lp.detach()),
            "train_rollout_logprob_abs_diff": r((old - roll).abs()),
        }
        if cfg.correction is not None:
            metrics["tis"] = r(w)
            metrics["tis_clipfrac"] = r(changed)
    return LossOutput(loss=loss, metrics=metrics)


def step_denominators(
    rollout_ids: Sequence[int],
    segment_tokens: Sequence[int],
    rollout_tokens: Sequence[int],
    reduction: str,
) -> tuple[list[float], float]:
    """Per-segment denominators and the step divisor of a reduction
    (docs/train.md §4), for the segments of ONE optimizer step.

    rollout_ids[i], segment_tokens[i] (trained tokens of segment i) and
    rollout_tokens[i] (the rollout's D, from the advantages) describe
    segment i. Returns (denominator of each segment, divisor):
      rollout:       D of the segment's rollout, divisor G (rollouts in step)
      token-mean:    1, divisor the step's trained tokens
      sequence-mean: the segment's trained tokens, divisor the step's segments
    """
    if not (len(rollout_ids) == len(segment_tokens) == len(rollout_tokens)):
        raise ValueError("rollout_ids, segment_tokens and rollout_tokens differ in length")
    if reduction == "rollout":
        return [float(d) for d in rollout_tokens], float(len(set(rollout_ids)))
    if reduction == "token-mean":
        return [1.0] * len(rollout_ids), float(max(sum(segment_tokens), 1))
    if reduction == "sequence-mean":
        return [float(n) for n in segment_tokens], float(len(rollout_ids))
    raise ValueError(f"unknown reduction {reduction!r}: want one of {REDUCTIONS}")
