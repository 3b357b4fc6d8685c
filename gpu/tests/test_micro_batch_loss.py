"""micro_batch_loss (docs/train.md §3, §4, §8) without a model: random float64
logits stand in for a micro-batch's response rows, and the loss, its gradient,
the metrics dict (exact keys and values) and full_lp are checked against a
per-token re-implementation written here, across the objectives, the old
policy's source (§13), the corrections (§3.2), the reductions (§4, through
step_denominators), score centering, top-p replay, the KL and entropy terms,
several rollouts and segments in one micro-batch and masked tokens. Also
Objective's validation: each bad field raises naming it.

The reference computes PPO clip, the correction, the segment mean and the
reduction itself; only the score-centering score (score_centering_term, a
separate function with its own identity tests in test_train.py) is taken
from the module."""

import itertools
import math

import pytest
import torch

from kiln_gpu.loss import LossConfig, step_denominators
from kiln_gpu.objectives import Objective, micro_batch_loss, score_centering_term

F64 = torch.float64
R, V = 14, 9
# the micro-batch: rollout 0 has segments 0, 1; rollout 1 segments 2, 3 (3
# has no trained token); rollout 2 segment 4
SEG_LEN = [3, 4, 2, 2, 3]
ROLLOUT = [0, 0, 1, 1, 2]
MASK = [1, 1, 0, 1, 1, 1, 0, 1, 1, 0, 0, 1, 0, 1]


def _seg():
    return torch.repeat_interleave(torch.arange(len(SEG_LEN)), torch.tensor(SEG_LEN))


def _denoms(reduction, mask, seg):
    """Per-token denominators and the divisor of a reduction for this micro-batch
    as the trainer makes them (the rollout's D: its trained tokens plus 5 in
    micro-batches elsewhere)."""
    seg_tok = [int(mask[seg == s].sum()) for s in range(len(SEG_LEN))]
    roll_tok = [sum(seg_tok[j] for j in range(len(SEG_LEN)) if ROLLOUT[j] == ROLLOUT[s]) + 5
                for s in range(len(SEG_LEN))]
    d, div = step_denominators(ROLLOUT, seg_tok, roll_tok, reduction)
    return torch.tensor(d, dtype=F64)[seg], div


def _spans(g, kind):
    """Recorded spans per row: "nucleus" (ids only, target inside some, not
    others), "sc-top-p" / "sc-top-k" (with probabilities; an empty span on
    row 2)."""
    offs, ids, probs = [0], [], []
    for i in range(R):
        k = 0 if (kind != "nucleus" and i == 2) else 3 + i % 3
        s = torch.randperm(V, generator=g)[:k]
        q = torch.rand(k, generator=g, dtype=F64) + 0.1
        q = q / q.sum() * (0.8 if kind == "sc-top-k" else 1.0)
        ids += s.tolist()
        probs += q.tolist()
        offs.append(len(ids))
    return torch.tensor(offs), torch.tensor(ids), (None if kind == "nucleus" else torch.tensor(probs, dtype=F64))


def _targets(g, spans):
    """Targets: inside the span on even rows, random (maybe outside) on odd ones."""
    target = torch.randint(0, V, (R,), generator=g)
    if spans is not None:
        offs, ids, _ = spans
        for i in range(0, R, 2):
            if offs[i + 1] > offs[i]:
                target[i] = ids[offs[i] + 1]
    return target


def _nucleus_lp(z, target, spans):
    """lp on the logits masked to the recorded nucleus, the target kept, row by row."""
    offs, ids, _ = spans
    out = []
    for i in range(R):
        keep = set(ids[offs[i]:offs[i + 1]].tolist()) | {int(target[i])}
        row = z[i, sorted(keep)]
        out.append(z[i, int(target[i])] - torch.logsumexp(row, 0))
    return torch.stack(out)


def _weight(rho, cfg):
    if cfg.correction is None:
        return torch.ones_like(rho), torch.zeros_like(rho)
    lo, hi = cfg.correction_low, cfg.correction_high
    if cfg.correction == "tis":
        w = torch.tensor([min(max(x, lo), hi) for x in rho.tolist()], dtype=F64)
    else:
        w = torch.tensor([x if lo <= x <= hi else 0.0 for x in rho.tolist()], dtype=F64)
    return w, (w != rho).to(F64)


def _reference(obj, z, target, roll, adv, mask, denom, divisor, seg, ref_lp=None, spans=None, old=None):
    """(loss with gradient in z, metrics dict, full_lp) by the formulas of
    docs/train.md §3, §4, §8, token by token where it matters."""
    cfg = obj.base
    roll, adv, mask, denom = roll.to(F64), adv.to(F64), mask.to(F64), denom.to(F64)
    k = mask / denom.clamp(min=1.0) / divisor

    def red(x):
        return (x * k).sum()

    full = torch.log_softmax(z, -1)[torch.arange(R), target]
    score, sc_m = None, {}
    if obj.score_centering:
        lp, score, sc_m = score_centering_term(z, target, roll, *spans, cfg, obj.sc_path)
    elif spans is not None and obj.sc_path == "top-p":
        lp = _nucleus_lp(z, target, spans)
    else:
        lp = full
    sg = lp.detach()
    if obj.old_logprobs == "rollout":
        o = roll
    elif old is None:
        o = sg
    else:
        o = old.to(F64)
    prox = o if obj.objective != "reinforce" else sg
    w, changed = _weight(torch.exp(prox - roll), cfg)
    clip = torch.zeros(R, dtype=F64)
    eps_lo = cfg.eps_clip
    eps_hi = cfg.eps_clip if cfg.eps_clip_high is None else cfg.eps_clip_high
    if obj.score_centering:
        ell = -adv * score
    elif obj.objective == "reinforce":
        ell = -adv * lp * w
    elif obj.objective == "cispo":
        r = torch.exp(sg - o)
        rc = r.clamp(1 - eps_lo, 1 + eps_hi)
        clip = (rc != r).to(F64)
        ell = -rc * adv * lp * w
    else:
        lr = lp - o
        if obj.objective == "gspo":
            parts = []
            for s in range(len(SEG_LEN)):
                sel = seg == s
                n = float(mask[sel].sum())
                mean = (lr[sel] * mask[sel]).sum() / max(n, 1.0)
                parts.append(mean.expand(int(sel.sum())))
            lr = torch.cat(parts)
        r = torch.exp(lr)
        un = -r * adv
        cl = -r.clamp(1 - eps_lo, 1 + eps_hi) * adv
        ell = torch.maximum(un, cl)
        clip = (cl > un).to(F64).detach()
        if cfg.eps_clip_c is not None:
            ell = torch.where(adv < 0, torch.minimum(-cfg.eps_clip_c * adv, ell), ell)
        ell = ell * w
    pg = red(ell)
    loss = pg
    ent = None
    if obj.entropy_coef != 0.0:
        p = torch.softmax(z, -1)
        ent = -(p * torch.log(p)).sum(-1)
        loss = loss - obj.entropy_coef * red(ent)
    kl = None
    if obj.kl_coef != 0.0:
        d = full - ref_lp.to(F64)
        kl = torch.exp(-d) - 1 + d
        loss = loss + obj.kl_coef * red(kl)
    with torch.no_grad():
        m = {
            "loss": float(loss),
            "pg_loss": float(pg),
            "pg_clipfrac": float(red(clip)),
            "ppo_kl": float(red(o - sg)),
            "train_rollout_logprob_abs_diff": float(red(((sg if obj.old_logprobs == "rollout" else o) - roll).abs())),
            "kl_loss": float(red(kl)) if kl is not None else 0.0,
            "entropy": float(red(ent)) if ent is not None else None,
        }
        if cfg.correction is not None:
            m["tis"] = float(red(w))
            m["tis_clipfrac"] = float(red(changed))
        for key, v in sc_m.items():
            m[key] = float(red(v))
    replayed = obj.score_centering or (spans is not None and obj.sc_path == "top-p")
    full_lp = None if replayed and kl is None and ent is None else full.detach()
    return loss, m, full_lp


def _inputs(seed, spans_kind=None, mask_dtype=F64, col_dtype=F64, logit_dtype=F64):
    g = torch.Generator().manual_seed(seed)
    z = (torch.randn(R, V, generator=g, dtype=F64) * 1.5).to(logit_dtype)
    spans = _spans(g, spans_kind) if spans_kind else None
    target = _targets(g, spans)
    full = torch.log_softmax(z.to(F64), -1)[torch.arange(R), target]
    # far enough from lp that the clip, the dual clip and both correction
    # bounds all bite on some token
    roll = (full + torch.randn(R, generator=g, dtype=F64) * 0.8).to(col_dtype)
    old = full + torch.randn(R, generator=g, dtype=F64) * 0.8
    adv = (torch.randn(R, generator=g, dtype=F64) * 1.3).to(col_dtype)
    ref_lp = full + torch.randn(R, generator=g, dtype=F64) * 0.5
    mask = torch.tensor(MASK).to(mask_dtype)
    return z, target, roll, old, adv, mask, ref_lp, spans


def _check(obj, seed, reduction="rollout", old_given=False, spans_kind=None, with_ref=False,
           mask_dtype=F64, col_dtype=F64):
    z, target, roll, old, adv, mask, ref_lp, spans = _inputs(seed, spans_kind, mask_dtype, col_dtype)
    seg = _seg()
    denom, divisor = _denoms(reduction, torch.tensor(MASK, dtype=F64), seg)
    kw = dict(ref_lp=ref_lp if with_ref else None, spans=spans, old=old if old_given else None)
    x = z.clone().requires_grad_(True)
    out = micro_batch_loss(obj, x, target, roll, adv, mask, denom, divisor, seg, len(SEG_LEN), **kw)
    y = z.clone().requires_grad_(True)
    want, m, full_lp = _reference(obj, y, target, roll, adv, mask, denom, divisor, seg, **kw)
    assert out.loss.dtype == F64 and out.loss.dim() == 0
    assert float(out.loss.detach()) == pytest.approx(float(want.detach()), rel=1e-10, abs=1e-12)
    assert set(out.metrics) == set(m), sorted(set(out.metrics) ^ set(m))
    for key, v in m.items():
        got = out.metrics[key]
        if v is None:
            assert got is None, key
        else:
            assert isinstance(got, float), key
            assert got == pytest.approx(v, rel=1e-10, abs=1e-12), key
    if full_lp is None:
        assert out.full_lp is None
    else:
        assert out.full_lp is not None and not out.full_lp.requires_grad
        assert torch.allclose(out.full_lp, full_lp, rtol=0, atol=1e-12)
    out.loss.backward()
    want.backward()
    assert float((x.grad - y.grad).abs().max()) <= 1e-10 * max(1.0, float(y.grad.abs().max()))
    return out, m


EPS = {"asym-dual": dict(eps_clip=0.2, eps_clip_high=0.28, eps_clip_c=3.0),
       "sym": dict(eps_clip=0.25, eps_clip_high=None, eps_clip_c=None)}
CORR = {None: {}, "tis": dict(correction_low=0.5, correction_high=1.6),
        "mis": dict(correction_low=0.5, correction_high=1.6)}
OLD = {"first-step": ("recompute", False), "given": ("recompute", True), "rollout": ("rollout", False)}

GRID = [
    (objective, old, corr, eps, reduction)
    for objective, old, corr, eps, reduction in itertools.product(
        ["ppo", "gspo", "cispo", "reinforce"], OLD, CORR, EPS, ["rollout", "token-mean", "sequence-mean"])
    if not (old == "rollout" and corr is not None and objective != "reinforce")
]


@pytest.mark.parametrize("objective,old,corr,eps,reduction", GRID)
def test_objectives_match_reference(objective, old, corr, eps, reduction):
    mode, old_given = OLD[old]
    obj = Objective(objective=objective, old_logprobs=mode,
                    base=LossConfig(correction=corr, reduction=reduction, **CORR[corr], **EPS[eps]))
    seed = GRID.index((objective, old, corr, eps, reduction))
    _check(obj, seed, reduction=reduction, old_given=old_given)


def test_grid_exercises_every_branch():
    """The inputs are not degenerate: with the old policy given, some tokens
    are clipped on each side, some hit the dual clip, and the correction's
    both bounds bite (else the reference comparison proves little)."""
    z, target, roll, old, adv, mask, _, _ = _inputs(3)
    full = torch.log_softmax(z, -1)[torch.arange(R), target]
    r = torch.exp(full - old)[mask > 0]
    a = adv[mask > 0]
    assert bool(((r > 1.28) & (a > 0)).any()) and bool(((r < 0.8) & (a < 0)).any())
    assert bool(((r > 3.0) & (a < 0)).any())
    rho = torch.exp(old - roll)[mask > 0]
    assert bool((rho > 1.6).any()) and bool((rho < 0.5).any()) and bool(((rho > 0.5) & (rho < 1.6)).any())


@pytest.mark.parametrize("path", ["top-p", "top-k"])
@pytest.mark.parametrize("corr", [None, "tis", "mis"])
@pytest.mark.parametrize("old", ["first-step", "given", "rollout"])
def test_score_centering_matches_reference(path, corr, old):
    mode, old_given = OLD[old]
    obj = Objective(objective="reinforce", score_centering=True, sc_path=path, old_logprobs=mode,
                    base=LossConfig(correction=corr, **CORR[corr]))
    out, m = _check(obj, 200 + len(path), reduction="sequence-mean", old_given=old_given,
                    spans_kind="sc-" + path)
    assert {"sc_correction", "sc_sampler_head_mass", "sc_train_head_mass"} <= set(out.metrics)
    assert m["sc_correction"] != 0.0


@pytest.mark.parametrize("objective", ["ppo", "gspo", "cispo", "reinforce"])
@pytest.mark.parametrize("path", ["top-p", "top-k"])
@pytest.mark.parametrize("kl,ent", [(0.0, 0.0), (0.3, 0.0), (0.0, 0.05), (0.3, 0.05)])
def test_nucleus_replay_kl_entropy(objective, path, kl, ent):
    """Spans without probabilities: top-p replays lp on the nucleus (so
    full_lp only when the KL or entropy term computed the full one), top-k
    keeps the full-vocabulary lp; KL on full-vocabulary logprobs both sides."""
    obj = Objective(objective=objective, sc_path=path, kl_coef=kl, entropy_coef=ent,
                    base=LossConfig(correction="tis", **CORR["tis"], **EPS["asym-dual"]))
    _check(obj, 300 + int(kl * 10) + int(ent * 100), reduction="token-mean", old_given=True,
           spans_kind="nucleus", with_ref=kl != 0.0)


@pytest.mark.parametrize("objective", ["ppo", "gspo", "cispo", "reinforce"])
@pytest.mark.parametrize("kl,ent", [(0.3, 0.0), (0.0, 0.05), (0.3, 0.05), (-0.2, -0.07)])
@pytest.mark.parametrize("old", ["first-step", "rollout"])
def test_kl_entropy_without_spans(objective, kl, ent, old):
    mode, old_given = OLD[old]
    obj = Objective(objective=objective, kl_coef=kl, entropy_coef=ent, old_logprobs=mode)
    out, m = _check(obj, 400, reduction="rollout", old_given=old_given, with_ref=kl != 0.0)
    assert (m["kl_loss"] != 0.0) == (kl != 0.0)
    assert (m["entropy"] is not None) == (ent != 0.0)


@pytest.mark.parametrize("path", ["top-p", "top-k"])
def test_score_centering_with_kl_entropy(path):
    obj = Objective(objective="reinforce", score_centering=True, sc_path=path, kl_coef=0.2, entropy_coef=0.03,
                    base=LossConfig(correction="tis", **CORR["tis"]))
    _check(obj, 500, reduction="rollout", spans_kind="sc-" + path, with_ref=True)


@pytest.mark.parametrize("objective", ["ppo", "gspo", "cispo", "reinforce"])
@pytest.mark.parametrize("corr", [None, "mis"])
def test_trainer_column_dtypes(objective, corr):
    """The trainer's columns as the micro-batch files hold them (uint8 mask,
    float32 rollout logprobs and advantages) against float64 logits: the
    same as with everything in float64."""
    obj = Objective(objective=objective, base=LossConfig(correction=corr, **CORR[corr], **EPS["asym-dual"]))
    _check(obj, 600, reduction="sequence-mean", old_given=True, mask_dtype=torch.uint8, col_dtype=torch.float32)


@pytest.mark.parametrize("objective", ["ppo", "gspo", "cispo", "reinforce"])
@pytest.mark.parametrize("old", ["first-step", "given", "rollout"])
def test_float32_logits_keep_float32(objective, old):
    """Float32 logits (a float32 model) with float64 columns: the loss is
    computed and returned in the logits' dtype, close to the float64 value."""
    mode, old_given = OLD[old]
    obj = Objective(objective=objective, old_logprobs=mode, kl_coef=0.1, entropy_coef=0.01,
                    base=LossConfig(**EPS["asym-dual"]))
    z, target, roll, old_lp, adv, mask, ref_lp, _ = _inputs(700)
    seg = _seg()
    denom, divisor = _denoms("rollout", mask, seg)
    kw = dict(ref_lp=ref_lp, old=old_lp if old_given else None)
    out = micro_batch_loss(obj, z.float(), target, roll, adv, mask, denom, divisor, seg, len(SEG_LEN), **kw)
    want, m, _ = _reference(obj, z.float().double(), target, roll.float(), adv.float(), mask, denom.float(),
                            divisor, seg, ref_lp=ref_lp.float(), old=old_lp.float() if old_given else None)
    assert out.loss.dtype == torch.float32
    assert out.full_lp.dtype == torch.float32
    assert float(out.loss.detach()) == pytest.approx(float(want.detach()), rel=1e-5, abs=1e-6)
    for key in ("pg_loss", "ppo_kl", "train_rollout_logprob_abs_diff", "kl_loss", "entropy"):
        assert out.metrics[key] == pytest.approx(m[key], rel=1e-5, abs=1e-6), key


def test_divisor_and_clamped_denominator():
    """The divisor divides everything; a denominator below 1 counts as 1."""
    obj = Objective(objective="reinforce", kl_coef=0.1, entropy_coef=0.02)
    z, target, roll, _, adv, mask, ref_lp, _ = _inputs(800)
    seg = _seg()
    full = torch.log_softmax(z, -1)[torch.arange(R), target]
    denom = torch.full((R,), 0.25, dtype=F64)
    a = micro_batch_loss(obj, z, target, roll, adv, mask, denom, 1.0, seg, len(SEG_LEN), ref_lp=ref_lp)
    b = micro_batch_loss(obj, z, target, roll, adv, mask, torch.ones(R, dtype=F64), 4.0, seg, len(SEG_LEN),
                         ref_lp=ref_lp)
    assert a.metrics["pg_loss"] == pytest.approx(float((-adv * full * mask).sum()), rel=1e-12)
    for key, v in a.metrics.items():
        assert b.metrics[key] == pytest.approx(v / 4.0, rel=1e-12), key


def test_kl_needs_reference_logprobs():
    z, target, roll, _, adv, mask, _, _ = _inputs(900)
    seg = _seg()
    with pytest.raises(ValueError) as e:
        micro_batch_loss(Objective(kl_coef=0.1), z, target, roll, adv, mask, torch.ones(R, dtype=F64), 1.0,
                         seg, len(SEG_LEN))
    assert str(e.value) == "kl_coef needs the reference model's logprobs"


def test_gspo_ratio_is_the_segment_mean():
    """GSPO by hand on one token per clip case: every token of a segment
    gets the masked mean of its segment's log ratios (masked tokens do not
    count; a segment without trained tokens has ratio 1)."""
    z, target, roll, _, _, _, _, _ = _inputs(1000)
    full = torch.log_softmax(z, -1)[torch.arange(R), target]
    seg = _seg()
    mask = torch.tensor(MASK, dtype=F64)
    lr = torch.zeros(R, dtype=F64)
    lr[0:3] = torch.tensor([0.1, 0.3, 5.0], dtype=F64)  # token 2 masked: mean 0.2
    lr[3:7] = torch.tensor([-0.2, -0.4, 0.3, 9.0], dtype=F64)  # token 6 masked: mean -0.1
    lr[9:11] = torch.tensor([1.0, 2.0], dtype=F64)  # segment 3: no trained token
    old = full - lr
    adv = torch.ones(R, dtype=F64)
    obj = Objective(objective="gspo", base=LossConfig(eps_clip=10.0))  # no clipping
    out = micro_batch_loss(obj, z, target, roll, adv, mask, torch.ones(R, dtype=F64), 1.0, seg, len(SEG_LEN),
                           old=old)
    want = -(2 * math.exp(0.2) + 3 * math.exp(-0.1) + 2 + 2)
    assert out.metrics["pg_loss"] == pytest.approx(want, rel=1e-12)


# --- Objective's validation ---------------------------------------------------

BAD = [
    (dict(objective="grpo"),
     "unknown objective 'grpo': want one of ('ppo', 'gspo', 'cispo', 'reinforce')"),
    (dict(objective="ppo", score_centering=True),
     "score centering needs objective reinforce (docs/train.md §8.3)"),
    (dict(objective="cispo", score_centering=True),
     "score centering needs objective reinforce (docs/train.md §8.3)"),
    (dict(objective="reinforce", sc_path="top-q"),
     "unknown score-centering path 'top-q': want one of ('top-p', 'top-k')"),
    (dict(old_logprobs="behaviour"),
     "unknown old_logprobs 'behaviour': want one of ('recompute', 'rollout')"),
    (dict(objective="ppo", old_logprobs="rollout", base=LossConfig(correction="tis")),
     "correction 'tis' with old_logprobs 'rollout' is a no-op for ppo: the rollout logprobs are already the "
     "old policy"),
    (dict(objective="gspo", old_logprobs="rollout", base=LossConfig(correction="mis")),
     "correction 'mis' with old_logprobs 'rollout' is a no-op for gspo: the rollout logprobs are already the "
     "old policy"),
]


@pytest.mark.parametrize("kw,msg", BAD)
def test_objective_rejects_bad_fields(kw, msg):
    with pytest.raises(ValueError) as e:
        Objective(**kw)
    assert str(e.value) == msg


@pytest.mark.parametrize("kw", [
    dict(),
    dict(objective="reinforce", score_centering=True),
    dict(objective="reinforce", score_centering=True, sc_path="top-k", old_logprobs="rollout"),
    dict(objective="reinforce", old_logprobs="rollout", base=LossConfig(correction="tis")),
    dict(objective="cispo", old_logprobs="rollout"),
    dict(objective="gspo", old_logprobs="recompute", base=LossConfig(correction="mis")),
    dict(objective="ppo", sc_path="top-k"),
])
def test_objective_accepts_valid_fields(kw):
    o = Objective(**kw)
    for k, v in kw.items():
        assert getattr(o, k) == v
    assert o.uses_old == (o.objective != "reinforce")
