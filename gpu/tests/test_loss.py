"""The loss core against docs/train.md §7's vectors, gradient identities and an
independent re-implementation of the formulas."""

import math

import numpy as np
import pytest
import torch

from kiln_gpu.loss import (
    LossConfig,
    policy_loss,
    ppo_clip,
    reduce,
    rollout_correction,
    step_denominators,
    target_logprobs,
    token_logprobs,
)

F64 = torch.float64


def t(x):
    return torch.tensor(x, dtype=F64)


# --- docs/train.md §7.1: PPO clip and dual clip -----------------------------


def test_ppo_dual_clip_vector():
    r, a = t([2.0, 2.0, 0.5]), t([2.0, -2.0, 2.0])
    loss, clipfrac = ppo_clip(torch.log(r), a, 0.2, 0.2, eps_c=1.5)
    assert torch.allclose(loss, t([-2.4, 3.0, -1.0]))
    assert clipfrac.tolist() == [1.0, 0.0, 0.0]
    loss, clipfrac = ppo_clip(torch.log(r), a, 0.2, 0.2)
    assert torch.allclose(loss, t([-2.4, 4.0, -1.0]))
    assert clipfrac.tolist() == [1.0, 0.0, 0.0]


@pytest.mark.parametrize(
    "r,a,want,clipped",
    [(1.25, 1.0, -1.25, 0.0), (1.3, 1.0, -1.28, 1.0), (0.75, 1.0, -0.75, 0.0), (0.7, -1.0, 0.8, 1.0)],
)
def test_ppo_asymmetric_clip_vector(r, a, want, clipped):
    loss, clipfrac = ppo_clip(torch.log(t([r])), t([a]), 0.2, 0.28)
    assert loss.item() == pytest.approx(want, abs=1e-12)
    assert clipfrac.item() == clipped


def test_dual_clip_constant_must_exceed_one():
    with pytest.raises(ValueError):
        ppo_clip(t([0.0]), t([1.0]), eps_c=1.0)


# --- docs/train.md §7.2: TIS and MIS -----------------------------------------


@pytest.mark.parametrize(
    "mode,w_want",
    [("tis", [0.5, 0.5, 1.0, 2.0, 2.0]), ("mis", [0.0, 0.5, 1.0, 2.0, 0.0])],
)
def test_correction_vector(mode, w_want):
    rho = t([0.1, 0.5, 1.0, 2.0, 5.0])
    roll = torch.zeros(5, dtype=F64)
    w, changed = rollout_correction(torch.log(rho), roll, mode, 0.5, 2.0)
    assert torch.allclose(w, t(w_want))
    assert changed.tolist() == [1.0, 0.0, 0.0, 0.0, 1.0]
    pg = t([1.0, -2.0, 3.0, -4.0, 5.0]).requires_grad_()
    (pg * w).sum().backward()
    assert torch.allclose(pg * w, t(w_want) * t([1.0, -2.0, 3.0, -4.0, 5.0]))
    assert torch.allclose(pg.grad, t(w_want))  # the weight is a constant
    assert not w.requires_grad


def test_tis_default_bounds_are_0_and_2():
    cfg = LossConfig(correction="tis")
    assert (cfg.correction_low, cfg.correction_high) == (0.0, 2.0)
    w, _ = rollout_correction(t([3.0, -3.0]), t([0.0, 0.0]), "tis")
    assert w.tolist() == pytest.approx([2.0, math.exp(-3.0)])


def test_correction_weight_has_no_gradient():
    old = t([0.3, -0.2]).requires_grad_()
    w, _ = rollout_correction(old, t([0.0, 0.0]), "tis")
    assert not w.requires_grad


# --- docs/train.md §7.3: the per-rollout reducer ------------------------------

# Step of G = 2 rollouts: r0 has segments s0, s1; r1 has s2.
S0 = ([0.2, 0.4, 9.9, 0.6], [1, 1, 0, 1])
S1 = ([5.0, 0.1, 0.3], [0, 1, 1])
S2 = ([1.0, -1.0], [1, 1])
D = {0: 5.0, 1: 2.0}


def _mb(segs):
    """Flat per-token tensors of a micro-batch of (loss, mask, rollout) segments."""
    x = t([v for s, _ in segs for v in s[0]])
    m = t([v for s, _ in segs for v in s[1]])
    d = t([D[r] for s, r in segs for _ in s[0]])
    return x, m, d


@pytest.mark.parametrize(
    "split",
    [[[(S0, 0), (S1, 0), (S2, 1)]], [[(S0, 0)], [(S1, 0), (S2, 1)]], [[(S2, 1)], [(S1, 0)], [(S0, 0)]]],
)
def test_per_rollout_reducer_vector(split):
    parts = [reduce(*_mb(mb), divisor=1.0).item() for mb in split]
    assert sum(parts) == pytest.approx(0.32, abs=1e-12)
    assert sum(reduce(*_mb(mb), divisor=2.0).item() for mb in split) == pytest.approx(0.16, abs=1e-12)
    if len(split) == 2:
        assert parts == pytest.approx([0.24, 0.08], abs=1e-12)


def test_other_reductions_vector():
    segs = [(S0, 0), (S1, 0), (S2, 1)]
    x, m, _ = _mb(segs)
    n = [sum(s[1]) for s, _ in segs]
    # sequence-mean: each segment's own token mean (0.4 + 0.2 + 0), over 3 segments
    dens, div = step_denominators([0, 0, 1], n, [5, 5, 2], "sequence-mean")
    d = t([dens[i] for i, (s, _) in enumerate(segs) for _ in s[0]])
    assert reduce(x, m, d, 1.0).item() == pytest.approx(0.6, abs=1e-12)
    assert div == 3.0
    # token-mean: 1.6 over the step's 7 trained tokens
    dens, div = step_denominators([0, 0, 1], n, [5, 5, 2], "token-mean")
    d = t([dens[i] for i, (s, _) in enumerate(segs) for _ in s[0]])
    assert reduce(x, m, d, div).item() == pytest.approx(1.6 / 7, abs=1e-12)
    # rollout: D per segment, G = 2
    dens, div = step_denominators([0, 0, 1], n, [5, 5, 2], "rollout")
    assert (dens, div) == ([5.0, 5.0, 2.0], 2.0)


def test_config_rejects_unknown_names():
    with pytest.raises(ValueError):
        LossConfig(reduction="mean")
    with pytest.raises(ValueError):
        LossConfig(correction="icepop")


# --- logprobs: the shift and the temperature ---------------------------------


def test_token_logprobs_shift_and_temperature():
    g = torch.Generator().manual_seed(1)
    logits = torch.randn(2, 6, 11, generator=g, dtype=F64)
    tokens = torch.randint(0, 11, (2, 6), generator=g)
    for temp in (1.0, 0.7):
        got = token_logprobs(logits, tokens, temp)
        assert got.shape == (2, 5)
        for b in range(2):
            for i in range(5):
                row = logits[b, i].numpy() / temp
                want = row[tokens[b, i + 1]] - math.log(np.exp(row - row.max()).sum()) - row.max()
                assert got[b, i].item() == pytest.approx(want, abs=1e-12)


def test_token_logprobs_default_temperature_and_bad_temperature():
    """The default temperature is 1 and a temperature of 0 is refused by
    name (mutation survivors: default 2, `< 0`, a message-less error)."""
    g = torch.Generator().manual_seed(2)
    logits = torch.randn(1, 4, 5, generator=g, dtype=F64)
    tokens = torch.randint(0, 5, (1, 4), generator=g)
    assert torch.equal(token_logprobs(logits, tokens), token_logprobs(logits, tokens, 1.0))
    # every temperature other than 1 divides, 2 included (a survivor skipped it at 2)
    assert torch.allclose(token_logprobs(logits, tokens, 2.0), token_logprobs(logits / 2, tokens, 1.0))
    for bad in (0.0, -1.0):
        with pytest.raises(ValueError, match="temperature must be > 0"):
            token_logprobs(logits, tokens, bad)
    with pytest.raises(ValueError, match=r"logits \(1, 4, 5\) do not match tokens \(1, 3\)"):
        token_logprobs(logits, tokens[:, :3])


def test_policy_loss_applies_the_dual_clip():
    """policy_loss hands cfg.eps_clip_c to ppo_clip (a mutation survivor
    dropped it): a ratio of e² on a negative advantage is capped at c."""
    lp, old = t([0.0, 0.0]), t([-2.0, -2.0])
    adv, mask, denom = t([-1.0, -1.0]), t([1.0, 1.0]), t([1.0, 1.0])
    got = policy_loss(lp, old, old, adv, mask, denom, 1.0, LossConfig(eps_clip_c=3.0))
    want, _ = ppo_clip(lp - old, adv, 0.2, None, 3.0)
    assert got.loss.item() == pytest.approx(reduce(want, mask, denom, 1.0).item())
    plain = policy_loss(lp, old, old, adv, mask, denom, 1.0, LossConfig())
    assert plain.loss.item() != pytest.approx(got.loss.item())


@pytest.mark.parametrize(
    "mode,w_want",
    # rho = [1.5, 1.1, 0.5]: 1.5 is above the bound 1.2 but below the default 2.0
    [("tis", [1.2, 1.1, 0.5]), ("mis", [0.0, 1.1, 0.5])],
)
def test_policy_loss_applies_a_non_default_correction_high(mode, w_want):
    """policy_loss hands cfg.correction_high to rollout_correction (a
    mutation survivor passed the default 2.0 instead, which every other test
    uses): with a bound of 1.2 a rollout ratio of 1.5 is clipped (tis) or
    dropped (mis), against values worked out by hand."""
    rho = [1.5, 1.1, 0.5]
    old = t([-1.0, -0.3, -2.0])
    roll = old - torch.log(t(rho))
    adv, mask, denom = t([1.0, 2.0, -1.0]), t([1.0, 1.0, 1.0]), t([1.0, 1.0, 1.0])
    cfg = LossConfig(correction=mode, correction_low=0.0, correction_high=1.2)
    out = policy_loss(old.clone(), old, roll, adv, mask, denom, 1.0, cfg)
    # ratio 1, inside every clip: each token's loss is -A·w
    want = sum(-a * w for a, w in zip([1.0, 2.0, -1.0], w_want))
    assert out.loss.item() == pytest.approx(want, abs=1e-12)
    assert out.metrics["pg_loss"] == pytest.approx(want, abs=1e-12)
    assert out.metrics["tis"] == pytest.approx(sum(w_want), abs=1e-12)
    assert out.metrics["tis_clipfrac"] == pytest.approx(1.0, abs=1e-12)  # only the 1.5 changed
    at_default = policy_loss(old.clone(), old, roll, adv, mask, denom, 1.0, LossConfig(correction=mode))
    assert at_default.metrics["tis_clipfrac"] == 0.0
    assert at_default.loss.item() != pytest.approx(want)


def test_policy_loss_metric_names_and_values():
    """The metrics dict's exact keys (the trainer and kiln's Go side read
    them by name; a mutation survivor renaming one went unseen) and their
    values against a hand computation."""
    lp, old = t([-1.0, -2.0, -0.5]), t([-1.5, -2.0, -0.25])
    roll = t([-1.5, -2.0 - math.log(3.0), -0.25])  # rho = [1, 3, 1]
    adv, mask, denom = t([1.0, -1.0, 2.0]), t([1.0, 1.0, 0.0]), t([2.0, 2.0, 2.0])
    base = {"loss", "pg_loss", "pg_clipfrac", "ppo_kl", "train_rollout_logprob_abs_diff"}
    plain = policy_loss(lp, old, roll, adv, mask, denom, 2.0, LossConfig())
    assert set(plain.metrics) == base
    out = policy_loss(lp, old, roll, adv, mask, denom, 2.0, LossConfig(correction="tis"))
    assert set(out.metrics) == base | {"tis", "tis_clipfrac"}
    # trained tokens 0 and 1, each scaled by 1 / (denom 2 · divisor 2) = 1/4
    # token 0: r = e^0.5 > 1.2 with A = 1: clipped, -1.2; w = 1
    # token 1: r = 1, A = -1: 1; rho 3 clamped to w = 2: 2
    assert out.metrics["loss"] == pytest.approx((-1.2 + 2.0) / 4, abs=1e-12)
    assert out.metrics["pg_loss"] == out.metrics["loss"]
    assert out.metrics["pg_clipfrac"] == pytest.approx(1 / 4, abs=1e-12)
    assert out.metrics["ppo_kl"] == pytest.approx((-0.5 + 0.0) / 4, abs=1e-12)
    assert out.metrics["train_rollout_logprob_abs_diff"] == pytest.approx(math.log(3.0) / 4, abs=1e-12)
    assert out.metrics["tis"] == pytest.approx((1.0 + 2.0) / 4, abs=1e-12)
    assert out.metrics["tis_clipfrac"] == pytest.approx(1 / 4, abs=1e-12)


def test_step_denominators_edges_and_errors():
    """token-mean's divisor is the step's trained tokens, 1 included (a
    survivor floored it at 2); bad input is refused by name."""
    assert step_denominators([7], [1], [1], "token-mean") == ([1.0], 1.0)
    assert step_denominators([7], [0], [0], "token-mean") == ([1.0], 1.0)
    with pytest.raises(ValueError, match="^rollout_ids, segment_tokens and rollout_tokens differ in length$"):
        step_denominators([1, 2], [1], [1], "rollout")
    with pytest.raises(ValueError, match="unknown reduction 'mean'"):
        step_denominators([1], [1], [1], "mean")


def test_segment_mean_one_trained_token():
    """A segment's masked mean divides by its trained-token count, 1
    included; a segment without one gets 0 (mutation survivor: the count
    clamped at 2)."""
    from kiln_gpu.objectives import segment_mean

    x = t([3.0, 5.0, 7.0, 1.0, 2.0])
    mask = t([0.0, 1.0, 1.0, 1.0, 0.0])
    seg = torch.tensor([0, 0, 1, 1, 2])
    assert segment_mean(x, mask, seg, 3).tolist() == [5.0, 5.0, 4.0, 4.0, 0.0]


def test_token_logprobs_upcasts_half_precision():
    logits = torch.randn(4, 7).to(torch.bfloat16)
    out = token_logprobs(logits, torch.tensor([1, 2, 3, 4]))
    assert out.dtype == torch.float32


# --- gradients over micro-batches ---------------------------------------------


class Toy(torch.nn.Module):
    """A small float64 causal model: each position sees a running mean of the
    embeddings so far, so the logits depend on the whole prefix."""

    def __init__(self, vocab=13, dim=8, seed=0):
        super().__init__()
        g = torch.Generator().manual_seed(seed)
        self.emb = torch.nn.Parameter(torch.randn(vocab, dim, generator=g, dtype=F64) * 0.5)
        self.out = torch.nn.Parameter(torch.randn(dim, vocab, generator=g, dtype=F64) * 0.5)

    def forward(self, tokens):
        e = self.emb[tokens]
        pos = torch.arange(1, tokens.shape[-1] + 1, dtype=F64).unsqueeze(-1)
        h = torch.tanh(torch.cumsum(e, dim=-2) / pos)
        return h @ self.out


def _segment(g, vocab, n_prompt, n_resp, rid, adv):
    tokens = torch.randint(0, vocab, (n_prompt + n_resp,), generator=g)
    mask = (torch.rand(n_resp, generator=g) < 0.7).to(F64)
    mask[0] = 1.0
    roll = -torch.rand(n_resp, generator=g, dtype=F64) * 3
    return {"tokens": tokens, "resp": n_resp, "mask": mask, "roll": roll, "rid": rid, "adv": adv}


def _step_grad(model, micro_batches, cfg, old_model=None):
    """Accumulates the step's gradient over micro-batches, as the trainer does."""
    model.zero_grad()
    segs = [s for mb in micro_batches for s in mb]
    rids = [s["rid"] for s in segs]
    n = [int(s["mask"].sum()) for s in segs]
    d_roll = {r: sum(n[i] for i in range(len(segs)) if rids[i] == r) for r in set(rids)}
    dens, div = step_denominators(rids, n, [d_roll[r] for r in rids], cfg.reduction)
    den_of = {id(s): dens[i] for i, s in enumerate(segs)}
    total = 0.0
    for mb in micro_batches:
        lps, olds, rolls, advs, masks, ds = [], [], [], [], [], []
        for s in mb:
            lp = token_logprobs(model(s["tokens"]), s["tokens"])[-s["resp"] :]
            lps.append(lp)
            if old_model is not None:
                with torch.no_grad():
                    olds.append(token_logprobs(old_model(s["tokens"]), s["tokens"])[-s["resp"] :])
            rolls.append(s["roll"])
            advs.append(torch.full((s["resp"],), s["adv"], dtype=F64))
            masks.append(s["mask"])
            ds.append(torch.full((s["resp"],), den_of[id(s)], dtype=F64))
        out = policy_loss(
            torch.cat(lps),
            torch.cat(olds) if olds else None,
            torch.cat(rolls),
            torch.cat(advs),
            torch.cat(masks),
            torch.cat(ds),
            div,
            cfg,
        )
        out.loss.backward()
        total += out.loss.item()
    return total, [p.grad.clone() for p in model.parameters()]


def _perturbed(model, seed):
    old = Toy(seed=0)
    old.load_state_dict(model.state_dict())
    g = torch.Generator().manual_seed(seed)
    with torch.no_grad():
        for p in old.parameters():
            p.add_(torch.randn(p.shape, generator=g, dtype=F64) * 0.05)
    return old


@pytest.mark.parametrize("correction", [None, "tis", "mis"])
def test_split_rollout_across_micro_batches_same_gradient(correction):
    g = torch.Generator().manual_seed(7)
    model = Toy()
    r0 = [_segment(g, 13, 4, 6, 0, 0.8), _segment(g, 13, 3, 5, 0, 0.8), _segment(g, 13, 5, 4, 0, 0.8)]
    r1 = [_segment(g, 13, 2, 7, 1, -1.1)]
    old = _perturbed(model, 3)
    cfg = LossConfig(correction=correction, correction_low=0.5 if correction == "mis" else 0.0)
    one_loss, one = _step_grad(model, [r0 + r1], cfg, old)
    two_loss, two = _step_grad(model, [[r0[0], r1[0]], [r0[1], r0[2]]], cfg, old)
    assert two_loss == pytest.approx(one_loss, abs=1e-12)
    for a, b in zip(one, two):
        assert torch.allclose(a, b, atol=1e-6, rtol=0)
        assert a.abs().max() > 1e-3  # a real gradient, not zero


def test_twenty_segments_weigh_as_one():
    """A rollout cut into 20 segments contributes what the same tokens in one
    segment do; the sequence-mean reduction, by contrast, weighs it 20 times."""
    g = torch.Generator().manual_seed(11)
    lp_vals = -torch.rand(40, generator=g, dtype=F64) * 2
    adv = {0: 1.0, 1: -0.5}

    def contributions(reduction, pieces):
        lp = lp_vals.clone().requires_grad_()
        # rollout 0: one segment of 20 tokens; rollout 1: 20 segments of 1 token
        seg_rid = [0] + [1] * pieces
        seg_len = [20] + [20 // pieces] * pieces
        dens, div = step_denominators(seg_rid, seg_len, [20] + [20] * pieces, reduction)
        den = torch.cat([torch.full((n,), d, dtype=F64) for n, d in zip(seg_len, dens)])
        rid = torch.cat([torch.full((n,), r) for n, r in zip(seg_len, seg_rid)])
        a = torch.where(rid == 0, adv[0], adv[1]).to(F64)
        out = policy_loss(lp, None, lp_vals, a, torch.ones(40, dtype=F64), den, div, LossConfig(reduction=reduction))
        out.loss.backward()
        # weight of each rollout: |sum of its tokens' gradient| / |A|
        w0 = lp.grad[:20].sum().abs().item() / abs(adv[0])
        w1 = lp.grad[20:].sum().abs().item() / abs(adv[1])
        return w0, w1

    w0, w1 = contributions("rollout", 20)
    assert w0 == pytest.approx(0.5, abs=1e-12) and w1 == pytest.approx(0.5, abs=1e-12)
    assert contributions("rollout", 1) == pytest.approx((w0, w1), abs=1e-12)
    s0, s1 = contributions("sequence-mean", 20)
    assert s1 == pytest.approx(20 * s0, rel=1e-9)


# --- differential: an independent implementation from the formulas -----------


def reference_loss_and_grad(lp, old, roll, adv, mask, den, div, eps_lo, eps_hi, eps_c, mode, lo, hi):
    """docs/train.md §3–§4 written out per token in plain Python, with the
    gradient with respect to lp derived by hand: d(-r·A)/dlp = -r·A where the
    unclipped branch is taken, 0 where a clip (or the dual clip) is."""
    loss, grad = 0.0, []
    for i in range(len(lp)):
        r = math.exp(lp[i] - old[i])
        a = adv[i]
        unclipped = -r * a
        clipped = -min(max(r, 1 - eps_lo), 1 + eps_hi) * a
        if unclipped >= clipped:
            val, dval = unclipped, -r * a
        else:
            val, dval = clipped, 0.0
        if eps_c is not None and a < 0 and -eps_c * a < val:
            val, dval = -eps_c * a, 0.0
        rho = math.exp(old[i] - roll[i])
        if mode == "tis":
            w = min(max(rho, lo), hi)
        elif mode == "mis":
            w = rho if lo <= rho <= hi else 0.0
        else:
            w = 1.0
        scale = mask[i] / max(den[i], 1.0) / div
        loss += val * w * scale
        grad.append(dval * w * scale)
    return loss, grad


@pytest.mark.parametrize("seed", range(40))
def test_differential_against_reference(seed):
    rng = np.random.default_rng(seed)
    n = int(rng.integers(5, 60))
    roll = -rng.exponential(1.0, n)
    old = roll + rng.normal(0, 0.4, n)
    lp = old + rng.normal(0, 0.3, n)
    adv = rng.normal(0, 1.0, n)
    mask = (rng.random(n) < 0.75).astype(float)
    den = rng.integers(0, 30, n).astype(float)  # 0 exercises the clamp at 1
    div = float(rng.integers(1, 9))
    eps_lo = float(rng.choice([0.1, 0.2, 0.3]))
    eps_hi = float(rng.choice([eps_lo, 0.28, 0.4]))
    eps_c = [None, 3.0][seed % 2]
    mode = [None, "tis", "mis"][seed % 3]
    lo, hi = (0.0, 2.0) if mode != "mis" else (0.5, 2.0)
    cfg = LossConfig(eps_lo, eps_hi, eps_c, mode, lo, hi)
    x = torch.tensor(lp, dtype=F64, requires_grad=True)
    out = policy_loss(x, t(old), t(roll), t(adv), t(mask), t(den), div, cfg)
    out.loss.backward()
    want, want_grad = reference_loss_and_grad(lp, old, roll, adv, mask, den, div, eps_lo, eps_hi, eps_c, mode, lo, hi)
    assert out.loss.item() == pytest.approx(want, abs=1e-12, rel=1e-12)
    assert np.allclose(x.grad.numpy(), want_grad, atol=1e-12, rtol=1e-10)
    # the metrics are the same reducer over their per-token values
    scale = mask / np.maximum(den, 1.0) / div
    assert out.metrics["ppo_kl"] == pytest.approx(float(((old - lp) * scale).sum()), abs=1e-12)
    assert out.metrics["train_rollout_logprob_abs_diff"] == pytest.approx(
        float((np.abs(old - roll) * scale).sum()), abs=1e-12
    )


def test_on_policy_ratio_is_one():
    lp = t([-0.5, -1.0, -2.0]).requires_grad_()
    out = policy_loss(lp, None, lp.detach(), t([1.0, -1.0, 2.0]), t([1, 1, 1]), t([3, 3, 3]), 1.0)
    assert out.metrics["pg_clipfrac"] == 0.0
    assert out.metrics["ppo_kl"] == 0.0
    assert out.metrics["train_rollout_logprob_abs_diff"] == 0.0
    out.loss.backward()
    # on-policy PPO's gradient is that of -A·lp / D
    assert torch.allclose(lp.grad, t([-1.0, 1.0, -2.0]) / 3)


def test_target_logprobs_equal_log_softmax_gather_value_and_gradient():
    """The fused full-vocabulary logprob (loss.target_logprobs) is
    log_softmax(logits)[target] and has its gradient, in float64 to
    rounding, with a target repeated across rows and logits far from 0;
    gradcheck checks the backward against finite differences."""
    g = torch.Generator().manual_seed(3)
    logits = (torch.randn(6, 50, generator=g, dtype=torch.float64) * 8 + 30).requires_grad_()
    target = torch.tensor([0, 7, 7, 49, 3, 7])
    w = torch.randn(6, generator=g, dtype=torch.float64)
    lp = target_logprobs(logits, target)
    (gl,) = torch.autograd.grad((lp * w).sum(), logits)
    ref = torch.log_softmax(logits, -1).gather(-1, target.unsqueeze(-1)).squeeze(-1)
    (gr,) = torch.autograd.grad((ref * w).sum(), logits)
    assert float((lp - ref).abs().max()) <= 1e-12
    assert float((gl - gr).abs().max()) <= 1e-12
    small = torch.randn(3, 5, generator=g, dtype=torch.float64, requires_grad=True)
    assert torch.autograd.gradcheck(lambda x: target_logprobs(x, torch.tensor([4, 0, 4])), (small,))


def test_defaults_of_ppo_clip_and_rollout_correction():
    """ppo_clip's eps_low defaults to 0.2 (and eps_high to it), and
    rollout_correction's mode to tis with bounds [0, 2]: a caller that
    leaves them out gets docs/train.md §3's defaults, not another clip."""
    lr = torch.log(torch.tensor([0.5, 0.9, 1.1, 1.5], dtype=torch.float64))
    adv = torch.tensor([-1.0, 1.0, -1.0, 1.0], dtype=torch.float64)
    loss, frac = ppo_clip(lr, adv)
    r = torch.exp(lr)
    want = torch.maximum(-r * adv, -torch.clamp(r, 0.8, 1.2) * adv)
    assert torch.allclose(loss, want, rtol=0, atol=1e-15)
    assert frac.tolist() == [1.0, 0.0, 0.0, 1.0]
    old = torch.log(torch.tensor([0.5, 1.0, 3.0], dtype=torch.float64))
    roll = torch.zeros(3, dtype=torch.float64)
    w, changed = rollout_correction(old, roll)
    assert torch.allclose(w, torch.tensor([0.5, 1.0, 2.0], dtype=torch.float64), rtol=0, atol=1e-15)
    assert changed.tolist() == [0.0, 0.0, 1.0]


@pytest.mark.parametrize(
    "call, message",
    [
        (lambda: ppo_clip(torch.zeros(1), torch.ones(1), eps_c=1.0), "dual clip constant must be > 1, got 1.0"),
        (lambda: rollout_correction(torch.zeros(1), torch.zeros(1), mode="TIS"), "unknown rollout correction 'TIS'"),
        (lambda: LossConfig(reduction="mean"), "unknown reduction 'mean'"),
        (lambda: LossConfig(correction="clip"), "unknown rollout correction 'clip'"),
    ],
)
def test_loss_errors_name_the_bad_value(call, message):
    with pytest.raises(ValueError) as e:
        call()
    assert message in str(e.value)
