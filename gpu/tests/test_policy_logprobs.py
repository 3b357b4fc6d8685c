"""policy_logprobs, score_centering_term, _f and segment_mean against
independent computations (docs/train.md §3.2, §8.1–§8.3).

Everything here is small random float64 tensors seeded by a
torch.Generator: no model, no trainer. The references are written the
plain way, one row at a time (sort, cumulative sum, mask, renormalise;
the score-centering correction C from its definition in docs/train.md
§8.3), so they share no code with kiln_gpu.objectives. Values and
gradients are compared, not just shapes.
"""

from __future__ import annotations

import math

import pytest
import torch

from kiln_gpu.loss import LossConfig
from kiln_gpu.objectives import Objective, _f, policy_logprobs, score_centering_term, segment_mean

F64 = torch.float64


# ---------------------------------------------------------------- references


def ref_f(x: float, corr, low: float, high: float) -> float:
    """The correction rule of docs/train.md §3.2 on one ratio."""
    if corr is None:
        return 1.0
    if corr == "tis":
        return min(max(x, low), high)
    return x if low <= x <= high else 0.0


def nucleus(probs_row: torch.Tensor, top_p: float, top_k: int | None = None) -> list[int]:
    """The sampler's nucleus the plain way: sort descending, keep the head
    whose mass before each entry is < top_p (the crossing entry kept, at
    least one), then the first top_k of those. Ties keep the lower id
    first (stable sort)."""
    order = sorted(range(probs_row.numel()), key=lambda v: (-float(probs_row[v]), v))
    kept, before = [], 0.0
    for v in order:
        if before >= top_p and kept:
            break
        kept.append(v)
        before += float(probs_row[v])
    if top_k is not None:
        kept = kept[:top_k]
    return kept


def make_spans(sampler_logits: torch.Tensor, temperature: float, top_p: float, top_k: int | None = None,
               empty_rows: tuple[int, ...] = (), normalise: bool = False):
    """(offsets, ids, probs) as the sampler records them: per row its
    nucleus ids and their full-vocabulary probabilities under
    softmax(sampler_logits / T) (normalised on the nucleus if asked); the
    rows in empty_rows get an empty span (masked tokens)."""
    R = sampler_logits.shape[0]
    offs, ids, probs = [0], [], []
    for i in range(R):
        if i not in empty_rows:
            pr = torch.softmax(sampler_logits[i] / temperature, -1)
            s = nucleus(pr, top_p, top_k)
            q = [float(pr[v]) for v in s]
            if normalise:
                tot = sum(q)
                q = [x / tot for x in q]
            ids += s
            probs += q
        offs.append(len(ids))
    return (torch.tensor(offs, dtype=torch.int64), torch.tensor(ids, dtype=torch.int64),
            torch.tensor(probs, dtype=F64))


def ref_replay_lp(logits: torch.Tensor, target: torch.Tensor, offs, ids) -> torch.Tensor:
    """lp of the target on the logits masked to span ∪ {target},
    renormalised there (docs/train.md §8.2), row by row."""
    out = []
    for i in range(logits.shape[0]):
        keep = set(ids[int(offs[i]):int(offs[i + 1])].tolist()) | {int(target[i])}
        mask = torch.full_like(logits[i], float("-inf"))
        for v in keep:
            mask[v] = 0.0
        row = logits[i] + mask
        out.append(row[int(target[i])] - torch.logsumexp(row, 0))
    return torch.stack(out)


def ref_full_lp(logits: torch.Tensor, target: torch.Tensor) -> torch.Tensor:
    rows = []
    for i in range(logits.shape[0]):
        rows.append(logits[i, int(target[i])] - torch.logsumexp(logits[i], 0))
    return torch.stack(rows)


def ref_sc(logits, target, roll, offs, ids, probs, corr, low, high, path):
    """The score-centering term of docs/train.md §8.3 from its definition,
    row by row: returns (lp_a, score, C, sampler head mass, trainer head
    mass), lp_a, score and C differentiable in logits (p, q and w_a
    detached)."""
    f = lambda x: ref_f(x, corr, low, high)  # noqa: E731
    lps, scores, Cs, smass, tmass = [], [], [], [], []
    for i in range(logits.shape[0]):
        a, b = int(offs[i]), int(offs[i + 1])
        S = [int(v) for v in ids[a:b]]
        q = [float(x) for x in probs[a:b]]
        t = int(target[i])
        full = logits[i] - torch.logsumexp(logits[i], 0)
        C = logits.new_zeros(())
        if path == "top-p":
            if S:
                zS = torch.stack([logits[i, v] for v in S])
                lpS = zS - torch.logsumexp(zS, 0)
                Qs = sum(q)
                for k in range(len(S)):
                    qn = q[k] / Qs
                    p = math.exp(float(lpS[k].detach()))
                    C = C + (qn * f(p / qn) - p) * lpS[k]
                lp_a = lpS[S.index(t)] if t in S else full[t]
                smass.append(Qs)
                tmass.append(sum(math.exp(float(full[v].detach())) for v in S))
            else:
                lp_a = full[t]
                smass.append(0.0)
                tmass.append(0.0)
        else:
            P = sum(math.exp(float(full[v].detach())) for v in S)
            Q = sum(q)
            rho = max(1 - Q, 1e-6) / max(1 - P, 1e-6)
            alpha = rho * f(1 / rho)
            for k, v in enumerate(S):
                p = math.exp(float(full[v].detach()))
                C = C + (q[k] * f(p / q[k]) - alpha * p) * full[v]
            lp_a = full[t]
            smass.append(Q)
            tmass.append(P)
        w = f(math.exp(float(lp_a.detach()) - float(roll[i])))
        lps.append(lp_a)
        scores.append(w * lp_a - C)
        Cs.append(C)
    return (torch.stack(lps), torch.stack(scores), torch.stack(Cs).detach(),
            torch.tensor(smass, dtype=F64), torch.tensor(tmass, dtype=F64))


def _close(a: torch.Tensor, b: torch.Tensor, tol: float = 1e-10) -> None:
    assert a.shape == b.shape, (a.shape, b.shape)
    assert a.dtype == b.dtype, (a.dtype, b.dtype)
    assert torch.allclose(a, b, rtol=tol, atol=tol), (a, b)


def _grad(fn, logits: torch.Tensor, weights: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """(value, d Σ weights·value / d logits) of fn(logits)."""
    x = logits.clone().requires_grad_(True)
    y = fn(x)
    (y * weights).sum().backward()
    return y.detach(), x.grad


def _sc_case(seed, R=6, V=10, T=1.0, top_p=0.9, top_k=None, empty=(), shift=0.0, spread=1.5):
    """Trainer logits (divided by T), a sampler that differs from them,
    its recorded spans, targets (most drawn from the span, one outside it)
    and rollout logprobs spread around the trainer's so the correction
    bounds bite."""
    g = torch.Generator().manual_seed(seed)
    raw = torch.randn(R, V, generator=g, dtype=F64) * 2.0
    sampler_raw = raw + torch.randn(R, V, generator=g, dtype=F64) * spread
    logits = raw / T + shift
    offs, ids, probs = make_spans(sampler_raw, T, top_p, top_k, empty_rows=empty)
    target = torch.empty(R, dtype=torch.int64)
    for i in range(R):
        S = ids[int(offs[i]):int(offs[i + 1])].tolist()
        outside = [v for v in range(V) if v not in S]
        if S and (i % 3 != 2 or not outside):
            target[i] = S[int(torch.randint(len(S), (1,), generator=g))]
        else:
            target[i] = outside[int(torch.randint(len(outside), (1,), generator=g))]
    full = torch.log_softmax(logits, -1).gather(-1, target[:, None]).squeeze(-1)
    roll = full + torch.linspace(-1.5, 1.5, R, dtype=F64)
    weights = torch.randn(R, generator=g, dtype=F64)
    return logits, target, roll, offs, ids, probs, weights


# ---------------------------------------------------------------- _f


@pytest.mark.parametrize("corr,low,high,x,want", [
    (None, 0.5, 2.0, [0.1, 1.0, 7.0, 0.0], [1.0, 1.0, 1.0, 1.0]),
    ("tis", 0.5, 2.0, [0.1, 0.5, 1.3, 2.0, 7.0], [0.5, 0.5, 1.3, 2.0, 2.0]),
    ("tis", 0.0, 3.0, [0.0, 2.9, 3.5], [0.0, 2.9, 3.0]),
    # mis keeps the bounds themselves (≥ low, ≤ high), zero outside
    ("mis", 0.5, 2.0, [0.1, 0.5, 1.3, 2.0, 7.0, 0.4999], [0.0, 0.5, 1.3, 2.0, 0.0, 0.0]),
    ("mis", 0.0, 3.0, [0.0, 2.9, 3.0, 3.0001], [0.0, 2.9, 3.0, 0.0]),
])
def test_f_correction_rule(corr, low, high, x, want):
    cfg = LossConfig(correction=corr, correction_low=low, correction_high=high)
    r = torch.tensor(x, dtype=F64)
    got = _f(r, cfg)
    assert got.dtype == F64 and got.shape == r.shape
    assert got.tolist() == want
    assert got.tolist() == [ref_f(v, corr, low, high) for v in x]


# ---------------------------------------------------------------- segment_mean


@pytest.mark.parametrize("x,mask,seg,n_seg,want", [
    # one trained token divides by 1; a segment with none gets 0
    ([3.0, 5.0, 7.0, 1.0, 2.0], [0, 1, 1, 1, 0], [0, 0, 1, 1, 2], 3, [5.0, 5.0, 4.0, 4.0, 0.0]),
    # masked tokens neither add nor count; segments need not be contiguous in value
    ([1.0, 2.0, 4.0, -8.0, 16.0, 32.0], [1, 1, 1, 0, 1, 0], [0, 0, 0, 1, 1, 2], 3,
     [7 / 3, 7 / 3, 7 / 3, 16.0, 16.0, 0.0]),
    # an extra segment with no tokens at all is harmless
    ([2.0, -6.0], [1, 1], [1, 1], 3, [-2.0, -2.0]),
    # every token in one segment
    ([0.5, 1.5, 2.5, 3.5], [1, 1, 1, 1], [0, 0, 0, 0], 1, [2.0, 2.0, 2.0, 2.0]),
])
def test_segment_mean_table(x, mask, seg, n_seg, want):
    xt = torch.tensor(x, dtype=F64)
    got = segment_mean(xt, torch.tensor(mask, dtype=F64), torch.tensor(seg), n_seg)
    assert got.dtype == F64
    assert torch.allclose(got, torch.tensor(want, dtype=F64), rtol=0, atol=1e-14)


def test_segment_mean_random_against_loop():
    g = torch.Generator().manual_seed(11)
    n = 40
    x = torch.randn(n, generator=g, dtype=F64)
    mask = (torch.rand(n, generator=g) < 0.6).to(F64)
    seg = torch.sort(torch.randint(0, 7, (n,), generator=g)).values
    got = segment_mean(x, mask, seg, 8)
    for i in range(n):
        sel = (seg == seg[i]) & (mask > 0)
        want = float(x[sel].mean()) if bool(sel.any()) else 0.0
        assert float(got[i]) == pytest.approx(want, abs=1e-13)
    # differentiable in x, only through trained tokens
    xr = x.clone().requires_grad_(True)
    segment_mean(xr, mask, seg, 8).sum().backward()
    cnt = torch.zeros(8, dtype=F64).index_add(0, seg, mask)
    toks = torch.zeros(8, dtype=F64).index_add(0, seg, torch.ones(n, dtype=F64))
    want_g = mask * toks[seg] / torch.clamp(cnt[seg], min=1.0)
    assert torch.allclose(xr.grad, want_g, atol=1e-13)


# ---------------------------------------------------------------- policy_logprobs: full vocabulary


@pytest.mark.parametrize("objective", ["ppo", "gspo", "cispo", "reinforce"])
@pytest.mark.parametrize("T", [1.0, 0.7, 1.6])
def test_full_vocab_lp_no_spans(objective, T):
    g = torch.Generator().manual_seed(3)
    R, V = 5, 9
    raw = torch.randn(R, V, generator=g, dtype=F64) * 3
    logits = raw / T
    target = torch.randint(0, V, (R,), generator=g).to(torch.int32)
    roll = torch.randn(R, generator=g, dtype=F64)
    w = torch.randn(R, generator=g, dtype=F64)
    obj = Objective(objective=objective)
    lp, full, score, m = policy_logprobs(obj, logits, target, roll)
    assert score is None and m == {}
    assert full is not None and torch.equal(full, lp)
    _close(lp.detach(), ref_full_lp(logits, target))
    # the temperature is in the logits: softmax(raw / T)
    _close(lp.detach(), torch.log_softmax(raw / T, -1)[torch.arange(R), target.long()])
    got = _grad(lambda x: policy_logprobs(obj, x, target, roll)[0], logits, w)
    want = _grad(lambda x: ref_full_lp(x, target), logits, w)
    _close(got[1], want[1])


def test_full_vocab_when_spans_but_top_k_path():
    """Without score centering, spans under sc_path top-k do not renormalise:
    the full-vocabulary lp, returned twice."""
    g = torch.Generator().manual_seed(4)
    logits = torch.randn(4, 8, generator=g, dtype=F64)
    offs, ids, probs = make_spans(logits, 1.0, 0.5)
    target = torch.tensor([7, 6, 5, 4])
    obj = Objective(sc_path="top-k")
    for spans in [(offs, ids, probs), (offs, ids, None)]:
        lp, full, score, m = policy_logprobs(obj, logits, target, torch.zeros(4, dtype=F64), spans)
        assert score is None and m == {} and full is not None
        _close(lp, ref_full_lp(logits, target))
        _close(full, lp)


# ---------------------------------------------------------------- policy_logprobs: top-p replay


@pytest.mark.parametrize("T,top_p,top_k,shift", [
    (1.0, 0.9, None, 0.0),
    (0.6, 0.8, None, 0.0),
    (1.7, 0.95, None, 0.0),
    (1.0, 1e-9, None, 0.0),       # tiny top_p: the nucleus is the argmax alone
    (1.0, 0.999999, None, 0.0),   # near 1: (almost) the whole vocabulary
    (1.0, 1.0, None, 0.0),
    (0.8, 0.9, 1, 0.0),           # top_k 1
    (1.0, 0.99, 3, 0.0),
    (1.0, 0.9, None, 900.0),      # large logits: only a max-shifted logsumexp survives
    (1.0, 0.9, None, -900.0),
])
@pytest.mark.parametrize("seed", [0, 1])
def test_top_p_replay_against_plain_nucleus(T, top_p, top_k, shift, seed):
    g = torch.Generator().manual_seed(100 + seed)
    R, V = 7, 11
    raw = torch.randn(R, V, generator=g, dtype=F64) * 2
    sampler = raw + 0.3 * torch.randn(R, V, generator=g, dtype=F64)
    logits = raw / T + shift
    offs, ids, probs = make_spans(sampler, T, top_p, top_k)
    # targets: from the nucleus, except some rows sampled outside it (the
    # target is always kept)
    target = torch.empty(R, dtype=torch.int64)
    for i in range(R):
        S = ids[int(offs[i]):int(offs[i + 1])].tolist()
        target[i] = S[i % len(S)] if i % 2 == 0 else (V - 1 - i) % V
    roll = torch.zeros(R, dtype=F64)
    w = torch.randn(R, generator=g, dtype=F64)
    obj = Objective()
    lp, full, score, m = policy_logprobs(obj, logits, target.to(torch.int32), roll,
                                         (offs, ids.to(torch.int32), probs))
    assert full is None and score is None and m == {}
    want = ref_replay_lp(logits, target, offs, ids)
    assert torch.isfinite(want).all()
    _close(lp, want)
    # the renormalised lp is never below the full-vocabulary one
    assert (lp >= ref_full_lp(logits, target) - 1e-12).all()
    got = _grad(lambda x: policy_logprobs(obj, x, target, roll, (offs, ids, probs))[0], logits, w)
    want_g = _grad(lambda x: ref_replay_lp(x, target, offs, ids), logits, w)
    _close(got[1], want_g[1])


def test_top_p_replay_known_values():
    """Hand-checkable: logits 0,1,2,3; nucleus {3, 2}; target 1 outside it."""
    logits = torch.tensor([[0.0, 1.0, 2.0, 3.0], [0.0, 1.0, 2.0, 3.0], [5.0, 5.0, 5.0, 5.0]], dtype=F64)
    offs = torch.tensor([0, 2, 3, 5])
    ids = torch.tensor([3, 2, 3, 0, 1])
    target = torch.tensor([1, 3, 2])
    lp, full, _, _ = policy_logprobs(Objective(), logits, target, torch.zeros(3, dtype=F64), (offs, ids, None))
    assert full is None
    want = [1.0 - math.log(math.e ** 1 + math.e ** 2 + math.e ** 3),  # target added to the kept set
            0.0,                                                     # a one-token nucleus: lp 0
            -math.log(3.0)]                                          # ties: uniform on 3 kept
    assert lp.tolist() == pytest.approx(want, abs=1e-14)


def test_top_p_replay_empty_span_is_target_only():
    """A masked row (empty span) keeps only its target: lp 0, gradient 0."""
    g = torch.Generator().manual_seed(5)
    logits = torch.randn(3, 6, generator=g, dtype=F64)
    offs = torch.tensor([0, 2, 2, 3])
    ids = torch.tensor([1, 4, 5])
    target = torch.tensor([4, 2, 0])
    lp, _, _, _ = policy_logprobs(Objective(), logits, target, torch.zeros(3, dtype=F64), (offs, ids, None))
    _close(lp, ref_replay_lp(logits, target, offs, ids))
    assert float(lp[1]) == 0.0


# ---------------------------------------------------------------- policy_logprobs: score centering


@pytest.mark.parametrize("spans_kind", ["none", "no-probs"])
@pytest.mark.parametrize("path", ["top-p", "top-k"])
def test_score_centering_needs_spans_with_probs(spans_kind, path):
    obj = Objective(objective="reinforce", score_centering=True, sc_path=path)
    logits = torch.zeros(2, 4, dtype=F64)
    target = torch.tensor([0, 1])
    spans = None if spans_kind == "none" else (torch.tensor([0, 1, 2]), torch.tensor([0, 1]), None)
    with pytest.raises(ValueError) as e:
        policy_logprobs(obj, logits, target, torch.zeros(2, dtype=F64), spans)
    assert str(e.value) == ("score centering needs the recorded spans with probabilities "
                            "(top_p_offsets, top_p_ids, top_p_probs)")


SC_CASES = [
    # (path, corr, low, high, T, top_p, top_k, empty rows, logit shift)
    ("top-p", None, 0.0, 2.0, 1.0, 0.9, None, (), 0.0),
    ("top-p", "tis", 0.5, 2.0, 1.0, 0.9, None, (), 0.0),
    ("top-p", "mis", 0.5, 2.0, 1.0, 0.9, None, (), 0.0),
    ("top-p", "tis", 0.8, 1.25, 0.6, 0.8, None, (1,), 0.0),
    ("top-p", "mis", 0.8, 1.25, 1.5, 0.97, None, (0, 4), 0.0),
    ("top-p", None, 0.0, 2.0, 1.0, 1e-9, None, (), 0.0),
    ("top-p", "tis", 0.5, 2.0, 1.0, 0.9, None, (), 800.0),
    ("top-p", "mis", 0.5, 2.0, 1.0, 0.9, None, (), -800.0),
    ("top-k", None, 0.0, 2.0, 1.0, 1.0, 3, (), 0.0),
    ("top-k", "tis", 0.5, 2.0, 1.0, 1.0, 4, (), 0.0),
    ("top-k", "mis", 0.5, 2.0, 1.0, 1.0, 4, (), 0.0),
    ("top-k", "tis", 0.8, 1.25, 0.7, 1.0, 1, (2,), 0.0),
    ("top-k", "mis", 0.8, 1.25, 1.4, 0.95, 5, (0, 5), 0.0),
    ("top-k", "tis", 0.0, 3.0, 1.0, 1.0, 10, (), 0.0),  # the whole vocabulary: both masses 1
]


@pytest.mark.parametrize("path,corr,low,high,T,top_p,top_k,empty,shift", SC_CASES)
@pytest.mark.parametrize("seed", [0, 1])
def test_score_centering_against_definition(path, corr, low, high, T, top_p, top_k, empty, shift, seed):
    cfg = LossConfig(correction=corr, correction_low=low, correction_high=high)
    logits, target, roll, offs, ids, probs, w = _sc_case(seed, T=T, top_p=top_p, top_k=top_k,
                                                         empty=empty, shift=shift)
    want = ref_sc(logits, target, roll, offs, ids, probs, corr, low, high, path)
    # through policy_logprobs (the trainer's entry) and directly
    obj = Objective(objective="reinforce", score_centering=True, sc_path=path, base=cfg)
    lp, full, score, m = policy_logprobs(obj, logits, target, roll, (offs, ids, probs))
    assert full is None
    lp2, score2, m2 = score_centering_term(logits, target, roll, offs, ids, probs, cfg, path)
    for a, b in [(lp, lp2), (score, score2)]:
        _close(a, b, 0.0)
    assert set(m) == set(m2) == {"sc_correction", "sc_sampler_head_mass", "sc_train_head_mass"}
    _close(lp, want[0].detach())
    _close(score, want[1].detach())
    _close(m["sc_correction"], want[2])
    _close(m["sc_sampler_head_mass"], want[3])
    _close(m["sc_train_head_mass"], want[4])
    for v in m.values():
        assert not v.requires_grad
    for i in empty:
        assert float(m["sc_correction"][i]) == 0.0
        assert float(m["sc_sampler_head_mass"][i]) == 0.0 and float(m["sc_train_head_mass"][i]) == 0.0
    # gradients of the score (the loss is −A·score) and of lp
    got = _grad(lambda x: policy_logprobs(obj, x, target, roll, (offs, ids, probs))[2], logits, w)
    ref = _grad(lambda x: ref_sc(x, target, roll, offs, ids, probs, corr, low, high, path)[1], logits, w)
    _close(got[1], ref[1])
    got = _grad(lambda x: policy_logprobs(obj, x, target, roll, (offs, ids, probs))[0], logits, w)
    ref = _grad(lambda x: ref_sc(x, target, roll, offs, ids, probs, corr, low, high, path)[0], logits, w)
    _close(got[1], ref[1])


@pytest.mark.parametrize("path", ["top-p", "top-k"])
def test_score_centering_dtypes_and_index_types(path):
    """float32 probs and roll, int32 ids and target: the same values as
    int64/float64 (the probabilities are cast to the logits' dtype)."""
    cfg = LossConfig(correction="tis", correction_low=0.5, correction_high=2.0)
    logits, target, roll, offs, ids, probs, _ = _sc_case(7, top_k=4 if path == "top-k" else None)
    probs32 = probs.to(torch.float32)
    roll32 = roll.to(torch.float32)
    lp, score, m = score_centering_term(logits, target.to(torch.int32), roll32, offs.to(torch.int32),
                                        ids.to(torch.int32), probs32, cfg, path)
    want = ref_sc(logits, target, roll32.to(F64), offs, ids, probs32.to(F64), "tis", 0.5, 2.0, path)
    assert lp.dtype == score.dtype == F64
    for v in m.values():
        assert v.dtype == F64
    _close(lp, want[0].detach())
    _close(score, want[1].detach())
    _close(m["sc_correction"], want[2])
    _close(m["sc_sampler_head_mass"], want[3])


def test_score_centering_top_p_unnormalised_probs():
    """top-p normalises q on the span: recorded probabilities scaled by any
    constant give the same C and score; the head mass is what was recorded."""
    cfg = LossConfig(correction="mis", correction_low=0.5, correction_high=2.0)
    logits, target, roll, offs, ids, probs, _ = _sc_case(9)
    a = score_centering_term(logits, target, roll, offs, ids, probs, cfg, "top-p")
    b = score_centering_term(logits, target, roll, offs, ids, probs * 0.37, cfg, "top-p")
    _close(a[1], b[1])
    _close(a[2]["sc_correction"], b[2]["sc_correction"])
    _close(b[2]["sc_sampler_head_mass"], a[2]["sc_sampler_head_mass"] * 0.37)


def test_score_centering_top_p_known_values():
    """One row, span {0, 1} of logits (0, log 3): lp^S = (log ¼, log ¾);
    q = (½, ½); no correction: C = (½−¼)·log ¼ + (½−¾)·log ¾."""
    logits = torch.tensor([[0.0, math.log(3.0), 5.0]], dtype=F64)
    offs = torch.tensor([0, 2])
    ids = torch.tensor([0, 1])
    probs = torch.tensor([0.25, 0.25], dtype=F64)  # normalised on the span: ½, ½
    roll = torch.tensor([math.log(0.5)], dtype=F64)
    lp, score, m = score_centering_term(logits, torch.tensor([1]), roll, offs, ids, probs, LossConfig(), "top-p")
    C = 0.25 * math.log(0.25) - 0.25 * math.log(0.75)
    assert float(lp[0]) == pytest.approx(math.log(0.75), abs=1e-14)
    assert float(m["sc_correction"][0]) == pytest.approx(C, abs=1e-14)
    assert float(score[0]) == pytest.approx(math.log(0.75) - C, abs=1e-14)
    assert float(m["sc_sampler_head_mass"][0]) == pytest.approx(0.5, abs=1e-15)
    p_full = torch.softmax(logits[0], 0)
    assert float(m["sc_train_head_mass"][0]) == pytest.approx(float(p_full[0] + p_full[1]), abs=1e-14)
    # tis with a tight band: w_a = f(¾ / ½) = clamp(1.5, ·, 1.2); the ratios p/q = ½, 3/2 clamp too
    cfg = LossConfig(correction="tis", correction_low=0.9, correction_high=1.2)
    lp, score, m = score_centering_term(logits, torch.tensor([1]), roll, offs, ids, probs, cfg, "top-p")
    C = (0.5 * 0.9 - 0.25) * math.log(0.25) + (0.5 * 1.2 - 0.75) * math.log(0.75)
    assert float(m["sc_correction"][0]) == pytest.approx(C, abs=1e-14)
    assert float(score[0]) == pytest.approx(1.2 * math.log(0.75) - C, abs=1e-14)


def test_score_centering_top_k_known_values():
    """One row, uniform over 4 ids, head {2} with q = ½: P = ¼, Q = ½,
    ρ = (1−½)/(1−¼) = ⅔; no correction α = ρ·1; C = (½ − ⅔·¼)·log ¼."""
    logits = torch.zeros(1, 4, dtype=F64)
    offs = torch.tensor([0, 1])
    ids = torch.tensor([2])
    probs = torch.tensor([0.5], dtype=F64)
    roll = torch.tensor([math.log(0.25)], dtype=F64)
    lp, score, m = score_centering_term(logits, torch.tensor([3]), roll, offs, ids, probs, LossConfig(), "top-k")
    C = (0.5 - (2 / 3) * 0.25) * math.log(0.25)
    assert float(lp[0]) == pytest.approx(math.log(0.25), abs=1e-14)
    assert float(m["sc_correction"][0]) == pytest.approx(C, abs=1e-14)
    assert float(score[0]) == pytest.approx(math.log(0.25) - C, abs=1e-14)
    assert float(m["sc_sampler_head_mass"][0]) == 0.5
    assert float(m["sc_train_head_mass"][0]) == pytest.approx(0.25, abs=1e-15)
    # mis with 1/ρ = 1.5 outside [0.8, 1.25]: α = 0; p/q = ½ outside too: C = 0
    cfg = LossConfig(correction="mis", correction_low=0.8, correction_high=1.25)
    lp, score, m = score_centering_term(logits, torch.tensor([3]), roll, offs, ids, probs, cfg, "top-k")
    assert float(m["sc_correction"][0]) == 0.0
    assert float(score[0]) == pytest.approx(math.log(0.25), abs=1e-14)  # w_a = 1 inside
    # a head holding all the mass on both sides: the 1e-6 floors give ρ = 1
    probs = torch.full((4,), 0.25, dtype=F64)
    lp, score, m = score_centering_term(logits, torch.tensor([3]), roll, torch.tensor([0, 4]),
                                        torch.tensor([0, 1, 2, 3]), probs, LossConfig(), "top-k")
    assert float(m["sc_correction"][0]) == pytest.approx(0.0, abs=1e-14)
    assert float(score[0]) == pytest.approx(math.log(0.25), abs=1e-14)


def test_score_centering_top_k_rho_floor():
    """Sampler head mass 1 with trainer head mass < 1: ρ = 1e-6 / (1 − P)."""
    logits = torch.tensor([[0.0, 0.0, math.log(2.0)]], dtype=F64)  # p = ¼, ¼, ½
    offs = torch.tensor([0, 2])
    ids = torch.tensor([0, 1])
    probs = torch.tensor([0.5, 0.5], dtype=F64)
    roll = torch.tensor([math.log(0.5)], dtype=F64)
    cfg = LossConfig(correction="tis", correction_low=0.0, correction_high=1e9)
    _, _, m = score_centering_term(logits, torch.tensor([0]), roll, offs, ids, probs, cfg, "top-k")
    rho = 1e-6 / 0.5
    alpha = rho * min(1 / rho, 1e9)  # = 1
    C = 2 * (0.5 * 0.5 - alpha * 0.25) * math.log(0.25)
    assert float(m["sc_correction"][0]) == pytest.approx(C, abs=1e-14)
    cfg = LossConfig(correction="tis", correction_low=0.0, correction_high=2.0)
    _, _, m = score_centering_term(logits, torch.tensor([0]), roll, offs, ids, probs, cfg, "top-k")
    alpha = rho * 2.0
    C = 2 * (0.5 * 0.5 - alpha * 0.25) * math.log(0.25)
    assert float(m["sc_correction"][0]) == pytest.approx(C, rel=1e-12)


# ---------------------------------------------------------------- devices


def test_segment_mean_stays_on_the_input_device():
    """The segment sums are made on x's device (the trainer's is CUDA): on
    the meta device a CPU accumulator would be refused by index_add."""
    x = torch.empty(6, dtype=F64, device="meta")
    got = segment_mean(x, torch.empty(6, dtype=F64, device="meta"),
                       torch.empty(6, dtype=torch.int64, device="meta"), 3)
    assert got.device.type == "meta" and got.dtype == F64 and got.shape == (6,)


DEVICES = ["cpu", pytest.param("cuda", marks=pytest.mark.skipif(not torch.cuda.is_available(),
                                                                 reason="no CUDA device"))]


@pytest.mark.parametrize("device", DEVICES)
@pytest.mark.parametrize("path", ["top-p", "top-k"])
def test_on_device_matches_cpu_reference(device, path):
    """Every index and accumulator follows the logits' device: the same
    values on CUDA as the CPU reference (on a CPU-only machine this checks
    the CPU run; the device= arguments only matter on an accelerator)."""
    cfg = LossConfig(correction="tis", correction_low=0.5, correction_high=2.0)
    logits, target, roll, offs, ids, probs, _ = _sc_case(13, top_k=4 if path == "top-k" else None, empty=(1,))
    want = ref_sc(logits, target, roll, offs, ids, probs, "tis", 0.5, 2.0, path)
    d = torch.device(device)
    on = lambda *ts: tuple(t.to(d) for t in ts)  # noqa: E731
    lg, tg, rl, of, ii, pr = on(logits, target, roll, offs, ids, probs)
    obj = Objective(objective="reinforce", score_centering=True, sc_path=path, base=cfg)
    lp, _, score, m = policy_logprobs(obj, lg, tg, rl, (of, ii, pr))
    assert lp.device == score.device == d
    _close(lp.cpu(), want[0].detach())
    _close(score.cpu(), want[1].detach())
    _close(m["sc_correction"].cpu(), want[2])
    if path == "top-p":
        lp, full, _, _ = policy_logprobs(Objective(), lg, tg, rl, (of, ii, None))
        assert full is None and lp.device == d
        _close(lp.cpu(), ref_replay_lp(logits, target, offs, ids))
    seg = torch.tensor([0, 0, 1, 1, 1, 2])
    mask = torch.tensor([1.0, 0.0, 1.0, 1.0, 0.0, 0.0], dtype=F64)
    sm = segment_mean(roll.to(d), mask.to(d), seg.to(d), 3)
    assert sm.device == d
    _close(sm.cpu(), torch.tensor([roll[0], roll[0], (roll[2] + roll[3]) / 2, (roll[2] + roll[3]) / 2,
                                   (roll[2] + roll[3]) / 2, 0.0], dtype=F64))
