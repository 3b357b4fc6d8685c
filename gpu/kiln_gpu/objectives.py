"""The per-token objectives beyond PPO clip: GSPO, CISPO, REINFORCE, score
centering, and the KL and entropy terms (docs/train.md §8).

Everything works on one micro-batch's flat response region (R tokens, in
segment order) as loss.py does; `seg` maps each token to its segment index
within the micro-batch. The result is one micro-batch's share of the step's
objective: Σ m·ℓ / max(d, 1) / divisor (docs/train.md §4), so backward per
micro-batch accumulates the step's gradient.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Optional

import torch

from .defaults import LOSS
from .loss import LossConfig, LossOutput, ppo_clip, reduce, rollout_correction, target_logprobs

OBJECTIVES = ("ppo", "gspo", "cispo", "reinforce")
SC_PATHS = ("top-p", "top-k")
# where PPO's old policy comes from (docs/train.md §13): the trainer's own
# logprobs with the weights as they were before the run's first optimizer
# step, or the sampler's rollout logprobs
OLD_LOGPROBS = ("recompute", "rollout")


@dataclass(frozen=True)
class Objective:
    """The full objective (docs/train.md §8): the PPO-family token loss and
    its knobs (loss.LossConfig), score centering, KL and entropy."""

    objective: str = LOSS["objective"]
    base: LossConfig = LossConfig()
    kl_coef: float = LOSS["kl_coef"]
    entropy_coef: float = LOSS["entropy_coef"]
    score_centering: bool = LOSS["score_centering"]
    # how the recorded spans are read under score centering: "top-p" (the
    # sampler's nucleus, probabilities normalised on it) or "top-k" (the
    # sampler's head with full-vocabulary probabilities, spec §4.4)
    sc_path: str = LOSS["score_centering_path"]
    # PPO's old policy (docs/train.md §13): "recompute" (the default, as
    # slime and verl) or "rollout"
    old_logprobs: str = LOSS["old_logprobs"]

    def __post_init__(self) -> None:
        if self.objective not in OBJECTIVES:
            raise ValueError(f"unknown objective {self.objective!r}: want one of {OBJECTIVES}")
        if self.score_centering and self.objective != "reinforce":
            raise ValueError("score centering needs objective reinforce (docs/train.md §8.3)")
        if self.sc_path not in SC_PATHS:
            raise ValueError(f"unknown score-centering path {self.sc_path!r}: want one of {SC_PATHS}")
        if self.old_logprobs not in OLD_LOGPROBS:
            raise ValueError(f"unknown old_logprobs {self.old_logprobs!r}: want one of {OLD_LOGPROBS}")
        if self.old_logprobs == "rollout" and self.base.correction is not None and self.objective != "reinforce":
            # old = roll makes ρ = exp(old − roll) 1 on every token: the
            # correction would silently do nothing (slime refuses the pair too)
            raise ValueError(f"correction {self.base.correction!r} with old_logprobs 'rollout' is a no-op for "
                             f"{self.objective}: the rollout logprobs are already the old policy")

    @property
    def uses_old(self) -> bool:
        """Whether the loss has a ratio to an old policy (PPO, GSPO, CISPO);
        REINFORCE and SC weigh the current policy against the rollout."""
        return self.objective != "reinforce"


def _f(ratio: torch.Tensor, cfg: LossConfig) -> torch.Tensor:
    """The correction weight rule f applied to a probability ratio (docs/train.md §3.2)."""
    if cfg.correction is None:
        return torch.ones_like(ratio)
    if cfg.correction == "tis":
        return torch.clamp(ratio, cfg.correction_low, cfg.correction_high)
    inside = (ratio >= cfg.correction_low) & (ratio <= cfg.correction_high)
    return torch.where(inside, ratio, torch.zeros_like(ratio))


def segment_mean(x: torch.Tensor, mask: torch.Tensor, seg: torch.Tensor, n_seg: int) -> torch.Tensor:
    """Each token gets the masked mean of x over its segment (0 for a segment
    without trained tokens)."""
    num = torch.zeros(n_seg, dtype=x.dtype, device=x.device).index_add(0, seg, x * mask)
    den = torch.zeros(n_seg, dtype=x.dtype, device=x.device).index_add(0, seg, mask)
    return (num / torch.clamp(den, min=1.0))[seg]


def score_centering_term(
    logits: torch.Tensor,
    target: torch.Tensor,
    roll: torch.Tensor,
    offsets: torch.Tensor,
    ids: torch.Tensor,
    probs: torch.Tensor,
    cfg: LossConfig,
    path: str,
) -> tuple[torch.Tensor, torch.Tensor, dict[str, torch.Tensor]]:
    """SC REINFORCE (docs/train.md §8.3, spec §4.4) for R response tokens.

    logits [R, V] are already divided by the temperature; target [R] the
    sampled ids; the span of token i is ids/probs[offsets[i]:offsets[i+1]].
    Returns (lp of the sampled token, the per-token centered score
    sg(w_a)·lp(a) − C, per-token metrics). The loss is −A times the score.
    top-p: lp is renormalised on the span, q is the sampler's nucleus
    normalised on it; C = Σ_S (q·f(p/q) − p)·lp. top-k: lp is full
    vocabulary, C = Σ_H (q·f(p/q) − α·p)·lp with α = ρ·f(1/ρ),
    ρ = max(1 − Q_H, 1e-6) / max(1 − P_H, 1e-6). An empty span (a masked
    row) contributes 0.
    """
    R = logits.shape[0]
    lens = (offsets[1:] - offsets[:-1]).long()
    row = torch.repeat_interleave(torch.arange(R, device=logits.device), lens)
    ids = ids.long()
    q = probs.to(logits.dtype)
    full_lp = torch.log_softmax(logits, dim=-1)
    span_full = full_lp[row, ids]  # full-vocabulary lp of each span entry
    if path == "top-p":
        # renormalise on the span: lp^S = z_v − logsumexp_S z
        z = logits[row, ids]
        mx = torch.full((R,), float("-inf"), dtype=z.dtype, device=z.device).index_reduce(
            0, row, z.detach(), "amax", include_self=True
        )
        mx = torch.where(torch.isfinite(mx), mx, torch.zeros_like(mx))
        se = torch.zeros(R, dtype=z.dtype, device=z.device).index_add(0, row, torch.exp(z - mx[row]))
        lse = mx + torch.log(torch.clamp(se, min=torch.finfo(z.dtype).tiny))
        span_lp = z - lse[row]
        qsum = torch.zeros(R, dtype=q.dtype, device=q.device).index_add(0, row, q)
        qn = q / torch.clamp(qsum, min=1e-30)[row]
        p = torch.exp(span_lp.detach())
        coef = qn * _f(p / torch.clamp(qn, min=1e-30), cfg) - p
        # the sampled token's renormalised lp: its entry in the span
        hit = (ids == target.long()[row]).to(z.dtype)
        hits = torch.zeros(R, dtype=z.dtype, device=z.device).index_add(0, row, hit)
        lp_a = torch.zeros(R, dtype=z.dtype, device=z.device).index_add(0, row, span_lp * hit)
        lp_a = torch.where(hits > 0, lp_a, full_lp.gather(-1, target.long().unsqueeze(-1)).squeeze(-1))
        sampler_mass = qsum
        train_mass = torch.zeros(R, dtype=z.dtype, device=z.device).index_add(0, row, torch.exp(span_full.detach()))
    else:
        span_lp = span_full
        p = torch.exp(span_lp.detach())
        P = torch.zeros(R, dtype=p.dtype, device=p.device).index_add(0, row, p)
        Q = torch.zeros(R, dtype=q.dtype, device=q.device).index_add(0, row, q)
        rho = torch.clamp(1 - Q, min=1e-6) / torch.clamp(1 - P, min=1e-6)
        alpha = rho * _f(1.0 / rho, cfg)
        coef = q * _f(p / torch.clamp(q, min=1e-30), cfg) - alpha[row] * p
        lp_a = full_lp.gather(-1, target.long().unsqueeze(-1)).squeeze(-1)
        sampler_mass, train_mass = Q, P
    C = torch.zeros(R, dtype=span_lp.dtype, device=span_lp.device).index_add(0, row, coef.detach() * span_lp)
    w_a = _f(torch.exp(lp_a.detach() - roll.to(lp_a.dtype)), cfg)
    score = w_a * lp_a - C
    return lp_a, score, {"sc_correction": C.detach(), "sc_sampler_head_mass": sampler_mass.detach(),
                         "sc_train_head_mass": train_mass.detach()}


def policy_logprobs(
    obj: Objective,
    logits: torch.Tensor,
    target: torch.Tensor,
    roll: torch.Tensor,
    spans: Optional[tuple[torch.Tensor, torch.Tensor, torch.Tensor]] = None,
) -> tuple[torch.Tensor, Optional[torch.Tensor], Optional[torch.Tensor], dict[str, torch.Tensor]]:
    """lp of each target token as the objective defines it (docs/train.md
    §8.1–§8.3): full vocabulary, on the recorded nucleus (top-p replay) or
    the span (score centering). Returns (lp, lp again when it is the
    full-vocabulary logprob (no nucleus, no score centering) else None, the
    SC score or None, the SC metrics). The trainer's old-logprob pass calls it too, so old and
    lp are the same function of the weights."""
    if obj.score_centering:
        if spans is None or spans[2] is None:
            raise ValueError("score centering needs the recorded spans with probabilities "
                             "(top_p_offsets, top_p_ids, top_p_probs)")
        lp, score, sc_metrics = score_centering_term(logits, target, roll, *spans, obj.base, obj.sc_path)
        return lp, None, score, sc_metrics
    if spans is not None and obj.sc_path == "top-p":
        # top-p replay (spec §4.4, last item): lp on the logits masked to the
        # recorded nucleus, the target always kept
        offsets, ids, _ = spans
        lens = (offsets[1:] - offsets[:-1]).long()
        row = torch.repeat_interleave(torch.arange(logits.shape[0], device=logits.device), lens)
        keep = torch.zeros_like(logits, dtype=torch.bool)
        keep[row, ids.long()] = True
        keep[torch.arange(logits.shape[0], device=logits.device), target.long()] = True
        masked = logits.masked_fill(~keep, float("-inf"))
        lp = torch.log_softmax(masked, dim=-1).gather(-1, target.long().unsqueeze(-1)).squeeze(-1)
        return lp, None, None, {}
    lp = target_logprobs(logits, target)
    return lp, lp, None, {}


def micro_batch_loss(
    obj: Objective,
    logits: torch.Tensor,
    target: torch.Tensor,
    roll: torch.Tensor,
    adv: torch.Tensor,
    mask: torch.Tensor,
    denom: torch.Tensor,
    divisor: float,
    seg: torch.Tensor,
    n_seg: int,
    ref_lp: Optional[torch.Tensor] = None,
    spans: Optional[tuple[torch.Tensor, torch.Tensor, torch.Tensor]] = None,
    old: Optional[torch.Tensor] = None,
) -> LossOutput:
    """One micro-batch's share of the step's objective (docs/train.md §8).

    logits [R, V]: the response tokens' logits (position t−1 for token t),
    already divided by the temperature; target [R] the trained ids; the
    other tensors per token as in loss.py. old [R]: PPO's old logprob of
    each token (docs/train.md §13), computed by policy_logprobs with the
    weights before the run's first optimizer step; None means the current
    weights are those (the first step), so old = sg(lp) and the ratio is 1.
    Under obj.old_logprobs "rollout", old is roll and this argument unused.
    """
    cfg = obj.base
    dt = logits.dtype
    mask = mask.to(dt)
    denom = denom.to(dt)
    adv = adv.to(dt)
    roll = roll.to(dt)
    lp, full, score, sc_metrics = policy_logprobs(obj, logits, target, roll, spans)
    full_lp = full.detach() if full is not None else None
    if obj.old_logprobs == "rollout":
        old = roll  # the behaviour policy is the old policy (decoupled PPO collapsed)
    elif old is None:
        old = lp.detach()  # the current weights are the old policy's (the run's first step)
    else:
        old = old.to(dt).detach()
    zeros = torch.zeros_like(lp)
    clipfrac = zeros
    # the correction weighs the old policy against the behaviour policy
    # (decoupled PPO); REINFORCE and SC have no old policy, so the current
    # one (spec §4.3)
    proximal = old if obj.uses_old else lp.detach()
    w, changed = rollout_correction(proximal, roll, cfg.correction, cfg.correction_low, cfg.correction_high)
    if obj.score_centering:
        pg = -adv * score  # the weight is inside the score
    elif obj.objective == "reinforce":
        pg = -adv * lp * w
    elif obj.objective == "cispo":
        r = torch.exp(lp - old)
        eps_hi = cfg.eps_clip if cfg.eps_clip_high is None else cfg.eps_clip_high
        rc = torch.clamp(r, 1.0 - cfg.eps_clip, 1.0 + eps_hi)
        clipfrac = (rc != r).to(dt).detach()
        pg = -rc.detach() * adv * lp * w
    else:
        log_ratio = lp - old
        if obj.objective == "gspo":
            log_ratio = segment_mean(log_ratio, mask, seg, n_seg)
        pg, clipfrac = ppo_clip(log_ratio, adv, cfg.eps_clip, cfg.eps_clip_high, cfg.eps_clip_c)
        pg = pg * w
    pg_loss = reduce(pg, mask, denom, divisor)
    loss = pg_loss
    ent = None
    logp = None  # the R × V log-softmax, only for the entropy and KL terms
    if obj.entropy_coef != 0.0:
        logp = torch.log_softmax(logits, dim=-1)
        ent = -(torch.exp(logp) * logp).sum(-1)
        loss = loss - obj.entropy_coef * reduce(ent, mask, denom, divisor)
    kl = None
    if obj.kl_coef != 0.0:
        if ref_lp is None:
            raise ValueError("kl_coef needs the reference model's logprobs")
        # full-vocabulary logprobs on both sides, whatever lp is renormalised on
        if full is None:
            full = (logp.gather(-1, target.long().unsqueeze(-1)).squeeze(-1) if logp is not None
                    else target_logprobs(logits, target))
        d = full - ref_lp.to(dt)
        kl = torch.exp(-d) - 1 + d  # k3 (spec §4.1)
        loss = loss + obj.kl_coef * reduce(kl, mask, denom, divisor)
    with torch.no_grad():
        r_ = lambda x: float(reduce(x, mask, denom, divisor))  # noqa: E731
        metrics = {
            "loss": float(loss.detach()),
            "pg_loss": float(pg_loss.detach()),
            "pg_clipfrac": r_(clipfrac),
            "ppo_kl": r_(old - lp.detach()),
            # the old policy against the sampler; with rollout logprobs as the
            # old policy that is 0, so the current one (spec §4.5)
            "train_rollout_logprob_abs_diff": r_(((lp.detach() if obj.old_logprobs == "rollout" else old) - roll).abs()),
            "kl_loss": r_(kl.detach()) if kl is not None else 0.0,
        }
        # the entropy is a metric only when it is in the loss: on its own it
        # costs two more passes over the R × V logits (docs/train.md §8.4)
        metrics["entropy"] = r_(ent.detach()) if ent is not None else None
        if cfg.correction is not None:
            metrics["tis"] = r_(w)
            metrics["tis_clipfrac"] = r_(changed)
        for k, v in sc_metrics.items():
            metrics[k] = r_(v)
        if full_lp is None and full is not None:  # computed for the KL term
            full_lp = full.detach()
        elif full_lp is None and logp is not None:  # computed for the entropy term
            full_lp = logp.gather(-1, target.long().unsqueeze(-1)).squeeze(-1)
    return LossOutput(loss=loss, metrics=metrics, full_lp=full_lp)
