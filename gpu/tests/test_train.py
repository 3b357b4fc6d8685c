"""The trainer (docs/train.md §8–§11): gradients through its own micro-batch
path, score centering, the objectives against a reference, output layout,
bad plans, resume parity and torchrun parity."""

import json
import math
import os
import subprocess
import sys
from pathlib import Path

import pytest
import torch
from safetensors.torch import load_file

from kiln_gpu import train
from kiln_gpu.batches import load_micro_batch, load_plan
from kiln_gpu.loss import LossConfig
from kiln_gpu.objectives import Objective, micro_batch_loss, score_centering_term
from planio import segment, write_plan

VOCAB = 1000  # ids drawn below this: fast, and inside the tiny model's vocabulary


@pytest.fixture(scope="module")
def model64(tiny_checkpoint):
    from transformers import AutoModelForCausalLM

    return AutoModelForCausalLM.from_pretrained(tiny_checkpoint, dtype=torch.float64)


def step_grad(model, plan_path, obj):
    """The step's gradient through the trainer's own micro-batch path."""
    from kiln_gpu.batches import load_plan

    plan = load_plan(plan_path)
    model.zero_grad(set_to_none=True)
    total = 0.0
    for f in plan.steps[0].micro_batches:
        m = train.micro_batch_step(model, None, load_micro_batch(f), obj, plan.steps[0].divisor, plan.temperature,
                                   torch.device("cpu"), lambda: torch.autocast("cpu", enabled=False))
        total += m["loss"]
    return total, [p.grad.clone() for p in model.parameters()]


def test_split_rollout_across_micro_batches_same_gradient(model64, tiny_checkpoint, tmp_path):
    g = torch.Generator().manual_seed(1)
    r0 = [segment(g, VOCAB, 5, 6, 0, 0.7), segment(g, VOCAB, 4, 5, 0, 0.7, mask=[1, 0, 1, 1, 1])]
    r1 = [segment(g, VOCAB, 3, 7, 1, -1.2)]
    obj = Objective(base=LossConfig(correction="tis"))
    a = write_plan(tmp_path / "a", tiny_checkpoint, [[r0 + r1]], tmp_path / "oa", temperature=0.7)
    b = write_plan(tmp_path / "b", tiny_checkpoint, [[[r0[0], r1[0]], [r0[1]]]], tmp_path / "ob", temperature=0.7)
    la, ga = step_grad(model64, a, obj)
    lb, gb = step_grad(model64, b, obj)
    assert lb == pytest.approx(la, abs=1e-12)
    diff = max(float((x - y).abs().max()) for x, y in zip(ga, gb))
    scale = max(float(x.abs().max()) for x in ga)
    assert scale > 1e-6 and diff <= 1e-6 and diff <= 1e-8 * scale, (diff, scale)


def test_twenty_segments_weigh_as_one(model64, tiny_checkpoint, tmp_path):
    """A rollout cut into 20 one-token segments (same prefix, the response
    split) gets the same weight as the same tokens in one segment."""
    g = torch.Generator().manual_seed(2)
    ids = torch.randint(0, VOCAB, (25,), generator=g).tolist()
    roll = [-1.0] * 20
    one = {"prompt": ids[:5], "response": ids[5:], "mask": [1] * 20, "roll": roll, "adv": [0.5] * 20,
           "rollout": 0, "spans": None}
    many = [{"prompt": ids[:5 + i], "response": [ids[5 + i]], "mask": [1], "roll": [-1.0], "adv": [0.5],
             "rollout": 0, "spans": None} for i in range(20)]
    other = segment(g, VOCAB, 4, 3, 1, -1.0)
    obj = Objective()
    for red, same in (("rollout", True), ("sequence-mean", False)):
        a = write_plan(tmp_path / f"a{red}", tiny_checkpoint, [[[one, other]]], tmp_path / "o", loss={"reduction": red})
        b = write_plan(tmp_path / f"b{red}", tiny_checkpoint, [[many[:7], many[7:] + [other]]], tmp_path / "o",
                       loss={"reduction": red})
        _, ga = step_grad(model64, a, obj)
        _, gb = step_grad(model64, b, obj)
        diff = max(float((x - y).abs().max()) for x, y in zip(ga, gb))
        scale = max(float(x.abs().max()) for x in ga)
        if same:
            assert diff <= 1e-6 and diff <= 1e-8 * scale, (red, diff, scale)
        else:
            assert diff > 1e-3 * scale, (red, diff, scale)


def _sc_setup(seed, V=12, R=5, path="top-p"):
    g = torch.Generator().manual_seed(seed)
    logits = torch.randn(R, V, generator=g, dtype=torch.float64)
    offs, ids, probs = [0], [], []
    for i in range(R):
        k = 4
        s = torch.randperm(V, generator=g)[:k]
        q = torch.rand(k, generator=g, dtype=torch.float64) + 0.1
        q = q / q.sum() * (0.7 if path == "top-k" else 1.0)
        ids += s.tolist()
        probs += q.tolist()
        offs.append(len(ids))
    return logits, torch.tensor(offs), torch.tensor(ids), torch.tensor(probs, dtype=torch.float64)


@pytest.mark.parametrize("objective,spans,entropy", [("ppo", False, 0.0), ("reinforce", False, 0.0),
                                                     ("ppo", True, 0.0), ("ppo", True, 0.01)])
def test_max_abs_logprob_diff_reads_the_loss_logprobs(objective, spans, entropy):
    """The step's max |lp − roll| (docs/train.md §3.3) is the same whether
    the metric recomputes the full-vocabulary logprobs or reads the loss's
    (LossOutput.full_lp, which saves a pass over the R × V logits); under
    top-p replay the loss's lp is on the nucleus, so it must not be read
    unless the full log-softmax was made anyway (the entropy term)."""
    from types import SimpleNamespace

    g = torch.Generator().manual_seed(7)
    R, V = 12, 50
    logits = torch.randn(R, V, generator=g) * 3
    target = torch.randint(0, V, (R,), generator=g)
    full = torch.log_softmax(logits, -1).gather(-1, target.unsqueeze(-1)).squeeze(-1)
    roll = full + torch.randn(R, generator=g) * 0.1
    mask = torch.ones(R)
    mask[3] = 0
    roll[3] = full[3] + 5.0  # an untrained token off by more than any trained one
    sp = None
    if spans:
        ids = torch.stack([target, (target + 1) % V], 1).reshape(-1)
        sp = (torch.arange(0, 2 * R + 1, 2), ids, None)
    out = micro_batch_loss(Objective(objective=objective, entropy_coef=entropy), logits, target, roll, torch.ones(R),
                           mask, torch.full((R,), float(R)), 1.0, torch.zeros(R, dtype=torch.long), 1, spans=sp)
    if spans and entropy == 0.0:
        assert out.full_lp is None
    else:
        assert torch.allclose(out.full_lp, full, atol=1e-6)
    mb = SimpleNamespace(loss_mask=mask, rollout_logprobs=roll)
    want = float((full - roll)[mask > 0].abs().max())
    cpu = torch.device("cpu")
    assert train.max_abs_logprob_diff(logits, target, mb, cpu, out.full_lp) == pytest.approx(want, abs=1e-6)
    assert train.max_abs_logprob_diff(logits, target, mb, cpu) == pytest.approx(want, abs=1e-6)


@pytest.mark.parametrize("path", ["top-p", "top-k"])
@pytest.mark.parametrize("corr", [None, "tis", "mis"])
def test_score_centering_expected_gradient_is_zero(path, corr):
    """Σ_a q_a ∇ℓ_a = 0 for a constant advantage (spec §4.4)."""
    cfg = LossConfig(correction=corr, correction_low=0.5, correction_high=2.0)
    logits, offs, ids, probs = _sc_setup(3, path=path)
    R = logits.shape[0]
    p_full = torch.softmax(logits, -1)
    for i in range(R):
        s_ids = ids[offs[i]:offs[i + 1]]
        s_q = probs[offs[i]:offs[i + 1]]
        # the sampler's distribution of token i: the span (normalised on it
        # for top-p); for top-k the head plus the tail modelled as ρ·p (spec §4.4)
        dist = {}
        if path == "top-p":
            dist = {a: qa / float(s_q.sum()) for a, qa in zip(s_ids.tolist(), s_q.tolist())}
        else:
            rho = (1 - float(s_q.sum())) / (1 - float(p_full[i, s_ids].sum()))
            dist = {v: rho * float(p_full[i, v]) for v in range(logits.shape[1])}
            dist.update({a: qa for a, qa in zip(s_ids.tolist(), s_q.tolist())})
        assert sum(dist.values()) == pytest.approx(1.0, abs=1e-12)
        total = torch.zeros_like(logits)
        for a, qa in dist.items():
            x = logits.clone().requires_grad_(True)
            target = torch.zeros(R, dtype=torch.long)
            target[i] = a
            roll = torch.zeros(R, dtype=torch.float64)
            roll[i] = torch.log(torch.tensor(qa, dtype=torch.float64))
            _, score, _ = score_centering_term(x, target, roll, offs, ids, probs, cfg, path)
            (-1.3 * score[i]).backward()
            total += qa * x.grad
        assert float(total.abs().max()) <= 1e-12, (path, corr, i)


@pytest.mark.parametrize("path", ["top-p", "top-k"])
@pytest.mark.parametrize("corr", [None, "tis"])
def test_score_centering_matching_distributions_zero_correction(path, corr):
    """q = the trainer's p on the span ⇒ C = 0 and the gradient is REINFORCE's."""
    cfg = LossConfig(correction=corr)
    logits, offs, ids, _ = _sc_setup(4, path=path)
    R = logits.shape[0]
    lens = offs[1:] - offs[:-1]
    row = torch.repeat_interleave(torch.arange(R), lens)
    if path == "top-p":
        z = logits[row, ids]
        q = torch.cat([torch.softmax(z[offs[i]:offs[i + 1]], 0) for i in range(R)])
    else:
        q = torch.softmax(logits, -1)[row, ids]
    target = ids[offs[:-1]]
    x = logits.clone().requires_grad_(True)
    lp, score, m = score_centering_term(x, target, lp_roll := torch.log(q[offs[:-1]]), offs, ids, q, cfg, path)
    assert float(m["sc_correction"].abs().max()) <= 1e-12
    (-(score * 0.8)).sum().backward()
    y = logits.clone().requires_grad_(True)
    if path == "top-p":
        ref = torch.stack([torch.log_softmax(y[i, ids[offs[i]:offs[i + 1]]], 0)[0] for i in range(R)])
    else:
        ref = torch.log_softmax(y, -1)[torch.arange(R), target]
    (-(ref * 0.8)).sum().backward()
    assert float((x.grad - y.grad).abs().max()) <= 1e-12
    assert torch.allclose(lp.detach(), lp_roll)


def _reference(obj, logits, target, roll, adv, mask, denom, divisor, seg):
    """docs/train.md §3, §4, §8 per token, with hand-derived gradients with
    respect to the logits: ∂lp_t/∂z_t = onehot(target_t) − softmax(z_t)."""
    c = obj.base
    p = torch.softmax(logits, -1)
    lp = torch.log(p[torch.arange(len(target)), target])
    onehot = torch.nn.functional.one_hot(target, logits.shape[-1]).to(logits.dtype)
    dlp = onehot - p
    rho = torch.exp(lp - roll)
    if c.correction == "tis":
        w = rho.clamp(c.correction_low, c.correction_high)
    elif c.correction == "mis":
        w = torch.where((rho >= c.correction_low) & (rho <= c.correction_high), rho, torch.zeros_like(rho))
    else:
        w = torch.ones_like(rho)
    k = mask / denom.clamp(min=1) / divisor
    # on-policy: r = 1, so every objective's value is −A·w and (inside the
    # clip range, where 1 always is) its gradient −A·w·∂lp; CISPO and
    # REINFORCE have no ratio: value −A·w·lp, same gradient; GSPO's ratio is
    # the segment mean, so its gradient spreads over the segment's tokens
    value = float((-adv * w * k * (lp if obj.objective in ("cispo", "reinforce") else 1.0)).sum())
    if obj.objective == "gspo":
        n = torch.zeros(int(seg.max()) + 1, dtype=logits.dtype).index_add(0, seg, mask)
        coef = torch.zeros_like(n).index_add(0, seg, -adv * w * k)
        gz = (coef[seg] * mask / n.clamp(min=1)[seg]).unsqueeze(-1) * dlp
    else:
        gz = (-adv * w * k).unsqueeze(-1) * dlp
    return value, gz


@pytest.mark.parametrize("seed", range(12))
def test_differential_against_reference(seed):
    g = torch.Generator().manual_seed(100 + seed)
    objective = ["ppo", "gspo", "cispo", "reinforce"][seed % 4]
    corr = [None, "tis", "mis"][seed % 3]
    obj = Objective(objective=objective, base=LossConfig(eps_clip=0.2, eps_clip_high=0.28,
                                                         eps_clip_c=3.0 if objective == "ppo" else None,
                                                         correction=corr, correction_low=0.3, correction_high=2.0))
    R, V, S = 17, 9, 4
    logits = torch.randn(R, V, generator=g, dtype=torch.float64) * 2
    target = torch.randint(0, V, (R,), generator=g)
    seg = torch.sort(torch.randint(0, S, (R,), generator=g)).values
    roll = torch.log(torch.softmax(logits, -1)[torch.arange(R), target]) + torch.randn(R, generator=g,
                                                                                       dtype=torch.float64)
    adv = torch.randn(R, generator=g, dtype=torch.float64)
    mask = (torch.rand(R, generator=g) > 0.2).to(torch.float64)
    denom = torch.rand(S, generator=g, dtype=torch.float64)[seg] * 10
    x = logits.clone().requires_grad_(True)
    out = micro_batch_loss(obj, x, target, roll, adv, mask, denom, 3.0, seg, S)
    out.loss.backward()
    want, gz = _reference(obj, logits, target, roll, adv, mask, denom, 3.0, seg)
    assert out.metrics["loss"] == pytest.approx(want, abs=1e-12)
    assert float((x.grad - gz).abs().max()) <= 1e-12


@pytest.mark.parametrize("objective", ["ppo", "reinforce"])
@pytest.mark.parametrize("corr,w_want", [("tis", [1.2, 1.1, 0.5]), ("mis", [0.0, 1.1, 0.5])])
def test_micro_batch_loss_applies_a_non_default_correction_high(objective, corr, w_want):
    """micro_batch_loss hands cfg.correction_high to rollout_correction (a
    mutation survivor passed the default 2.0 instead, which every other test
    uses): with a bound of 1.2 a rollout ratio of 1.5 is clipped (tis) or
    dropped (mis). On-policy (old = sg(lp)), so PPO's token loss is −A·w and
    REINFORCE's −A·w·lp. Also pins the metrics dict's exact keys."""
    g = torch.Generator().manual_seed(5)
    R, V = 3, 7
    logits = torch.randn(R, V, generator=g, dtype=torch.float64)
    target = torch.tensor([2, 5, 0])
    lp = torch.log_softmax(logits, -1)[torch.arange(R), target]
    roll = lp - torch.log(torch.tensor([1.5, 1.1, 0.5], dtype=torch.float64))
    adv = torch.tensor([1.0, 2.0, -1.0], dtype=torch.float64)
    ones = torch.ones(R, dtype=torch.float64)
    seg = torch.zeros(R, dtype=torch.long)
    obj = Objective(objective=objective, base=LossConfig(correction=corr, correction_low=0.0, correction_high=1.2))
    out = micro_batch_loss(obj, logits, target, roll, adv, ones, ones, 1.0, seg, 1)
    w = torch.tensor(w_want, dtype=torch.float64)
    want = float((-adv * w * (lp if objective == "reinforce" else 1.0)).sum())
    assert out.loss.item() == pytest.approx(want, abs=1e-12)
    assert out.metrics["pg_loss"] == pytest.approx(want, abs=1e-12)
    assert out.metrics["tis"] == pytest.approx(sum(w_want), abs=1e-12)
    assert out.metrics["tis_clipfrac"] == pytest.approx(1.0, abs=1e-12)  # only the 1.5 changed
    assert set(out.metrics) == {"loss", "pg_loss", "pg_clipfrac", "ppo_kl", "train_rollout_logprob_abs_diff",
                                "kl_loss", "entropy", "tis", "tis_clipfrac"}


def _run(plan):
    return train.main(["--plan", str(plan)])


def test_output_layout_loads_and_index_is_consistent(tiny_checkpoint, tmp_path, capsys):
    from transformers import AutoModelForCausalLM, AutoTokenizer

    g = torch.Generator().manual_seed(7)
    segs = [segment(g, VOCAB, 4, 5, r, a) for r, a in ((0, 1.0), (1, -1.0))]
    out = tmp_path / "out"
    p = write_plan(tmp_path / "b", tiny_checkpoint, [[segs]], out, max_shard_bytes=20_000_000)
    assert _run(p) == 0
    events = [json.loads(x) for x in capsys.readouterr().out.splitlines()]
    assert [e["event"] for e in events] == ["start", "step", "saved"]
    step = events[1]
    for k in ("loss", "pg_loss", "pg_clipfrac", "ppo_kl", "train_rollout_logprob_abs_diff", "grad_norm", "kl_loss",
              "entropy", "tokens", "tokens_per_s", "mfu", "time_s"):
        assert k in step, k
    assert step["mfu"] is None and step["tokens"] == 18
    names = sorted(x.name for x in out.iterdir())
    assert "model-00001-of-00002.safetensors" in names and "model-00002-of-00002.safetensors" in names
    for f in ("config.json", "generation_config.json", "tokenizer.json", "tokenizer_config.json", "metrics.jsonl",
              "optimizer.pt", "trainer_state.json", "model.safetensors.index.json"):
        assert f in names
    idx = json.loads((out / "model.safetensors.index.json").read_text())
    total = 0
    seen = set()
    for shard in sorted(set(idx["weight_map"].values())):
        t = load_file(str(out / shard))
        for k, v in t.items():
            assert idx["weight_map"][k] == shard
            total += v.numel() * v.element_size()
            seen.add(k)
    assert seen == set(idx["weight_map"]) and total == idx["metadata"]["total_size"]
    m = AutoModelForCausalLM.from_pretrained(out)
    assert AutoTokenizer.from_pretrained(out).apply_chat_template([{"role": "user", "content": "hi"}], tokenize=False)
    base = AutoModelForCausalLM.from_pretrained(tiny_checkpoint)
    moved = max(float((a - b).abs().max()) for a, b in zip(m.parameters(), base.parameters()))
    assert moved > 0
    assert json.loads((out / "metrics.jsonl").read_text().splitlines()[0])["loss"] == step["loss"]


@pytest.mark.parametrize("damage, field", [
    (lambda p: p.update(format="x"), "format"),
    (lambda p: p["steps"][0].update(micro_batches=["nope.safetensors"]), "micro_batches[0]"),
    (lambda p: p["loss"].update(objective="dpo"), "objective"),
    (lambda p: p.update(temperature=0), "temperature"),
    (lambda p: p["optimizer"].pop("lr"), "optimizer.lr"),
])
def test_bad_plan_exits_2_naming_the_field(tiny_checkpoint, tmp_path, caplog, damage, field):
    g = torch.Generator().manual_seed(8)
    p = write_plan(tmp_path / "b", tiny_checkpoint, [[[segment(g, VOCAB, 3, 3, 0, 1.0)]]], tmp_path / "out")
    raw = json.loads(p.read_text())
    damage(raw)
    p.write_text(json.dumps(raw))
    assert _run(p) == 2
    assert field in caplog.text and str(p) in caplog.text
    assert not (tmp_path / "out").exists()


def test_bad_micro_batch_exits_2(tiny_checkpoint, tmp_path, caplog):
    g = torch.Generator().manual_seed(8)
    p = write_plan(tmp_path / "b", tiny_checkpoint, [[[segment(g, VOCAB, 3, 3, 0, 1.0)]]], tmp_path / "out")
    f = tmp_path / "b" / "step-00000" / "mb-00000.safetensors"
    t = load_file(str(f))
    t["advantages"] = t["advantages"][:-1]
    from safetensors.torch import save_file

    save_file(t, str(f))
    assert _run(p) == 2
    assert "advantages" in caplog.text and "mb-00000" in caplog.text
    assert not (tmp_path / "out").exists()


def _params(d):
    out = {}
    for f in sorted(Path(d).glob("model-*.safetensors")):
        out.update(load_file(str(f)))
    return out


def _two_steps(tmp_path):
    g = torch.Generator().manual_seed(9)
    s0 = [segment(g, VOCAB, 4, 5, 0, 1.0), segment(g, VOCAB, 3, 4, 1, -1.0), segment(g, VOCAB, 5, 3, 1, -1.0)]
    s1 = [segment(g, VOCAB, 4, 6, 0, -0.5), segment(g, VOCAB, 4, 4, 1, 0.5)]
    return [[s0[:2], s0[2:]], [s1]]


@pytest.mark.parametrize("loss", [{"objective": "ppo", "old_logprobs": "rollout"},
                                  {"objective": "reinforce", "correction": "tis"}])
def test_resume_parity(tiny_checkpoint, tmp_path, loss):
    """Bit for bit when the loss does not depend on the run's starting
    weights: rollout logprobs as PPO's old policy, or REINFORCE (no ratio).
    With recomputed old logprobs a resumed run is a new run with a new old
    policy (docs/train.md §13)."""
    steps = _two_steps(tmp_path)
    kw = dict(loss=loss, optimizer={"lr": 1e-2, "weight_decay": 0.01})
    assert _run(write_plan(tmp_path / "full", tiny_checkpoint, steps, tmp_path / "o-full", **kw)) == 0
    assert _run(write_plan(tmp_path / "p0", tiny_checkpoint, steps[:1], tmp_path / "o-0", **kw)) == 0
    assert _run(write_plan(tmp_path / "p1", tiny_checkpoint, steps[1:], tmp_path / "o-1", resume_from=tmp_path / "o-0",
                           **kw)) == 0
    a, b = _params(tmp_path / "o-full"), _params(tmp_path / "o-1")
    assert a.keys() == b.keys()
    assert all(torch.equal(a[k], b[k]) for k in a)
    last = lambda d: json.loads((d / "metrics.jsonl").read_text().splitlines()[-1])  # noqa: E731
    assert last(tmp_path / "o-full")["loss"] == last(tmp_path / "o-1")["loss"]
    assert json.loads((tmp_path / "o-1" / "trainer_state.json").read_text())["global_step"] == 2
    # and a run without the resumed optimizer state differs (the test can fail)
    assert _run(write_plan(tmp_path / "p1b", tiny_checkpoint, steps[1:], tmp_path / "o-1b", **kw)) == 0
    c = _params(tmp_path / "o-1b")
    assert any(not torch.equal(a[k], c[k]) for k in a)


def test_resume_takes_the_plans_hyperparameters(tiny_checkpoint, tmp_path):
    """A resumed run keeps the saved moments but trains at its own plan's
    lr: at lr 0 the weights come out as they went in (torch's
    load_state_dict alone would bring back the saved lr, 1e-2)."""
    steps = _two_steps(tmp_path)
    assert _run(write_plan(tmp_path / "p0", tiny_checkpoint, steps[:1], tmp_path / "o-0",
                           optimizer={"lr": 1e-2})) == 0
    assert _run(write_plan(tmp_path / "p1", tiny_checkpoint, steps[1:], tmp_path / "o-1", resume_from=tmp_path / "o-0",
                           optimizer={"lr": 0.0})) == 0
    a, b = _params(tmp_path / "o-0"), _params(tmp_path / "o-1")
    assert all(torch.equal(a[k], b[k]) for k in a)
    assert json.loads((tmp_path / "o-1" / "trainer_state.json").read_text())["global_step"] == 2


class _Payload:
    """Pickles as a call to os.system: what a hostile store could plant."""

    def __init__(self, cmd):
        self.cmd = cmd

    def __reduce__(self):
        return (os.system, (self.cmd,))


@pytest.mark.parametrize("where", ["optimizer", "top"])
def test_resume_refuses_pickle_with_code(tiny_checkpoint, tmp_path, caplog, where):
    """A checkpoint whose optimizer.pt is a crafted pickle (its bytes
    intact, so every sha256 in the store is valid) is refused with exit 2
    and a message naming the file, and its payload never runs
    (docs/train.md §10)."""
    import shutil

    ckpt = tmp_path / "ckpt"
    shutil.copytree(tiny_checkpoint, ckpt)
    marker = tmp_path / "pwned"
    payload = _Payload(f"touch {marker}")
    state = {"optimizer": {"state": {}, "param_groups": []}, "step": 1, "rng": {"cpu": torch.get_rng_state()}}
    if where == "optimizer":
        state["optimizer"] = payload
    else:
        state = payload
    torch.save(state, ckpt / "optimizer.pt")
    g = torch.Generator().manual_seed(8)
    p = write_plan(tmp_path / "b", tiny_checkpoint, [[[segment(g, VOCAB, 3, 3, 0, 1.0)]]], tmp_path / "out",
                   resume_from=ckpt)
    assert _run(p) == 2
    assert not marker.exists(), "the checkpoint's pickle payload ran"
    assert "refused" in caplog.text and str(ckpt / "optimizer.pt") in caplog.text and "system" in caplog.text
    assert not (tmp_path / "out").exists()


def test_resume_refuses_malformed_optimizer_state(tiny_checkpoint, tmp_path, caplog):
    """Plain data of the wrong shape is refused too, naming what is wrong."""
    import shutil

    ckpt = tmp_path / "ckpt"
    shutil.copytree(tiny_checkpoint, ckpt)
    torch.save({"optimizer": {}, "step": "7", "rng": {"cpu": torch.get_rng_state()}}, ckpt / "optimizer.pt")
    g = torch.Generator().manual_seed(8)
    p = write_plan(tmp_path / "b", tiny_checkpoint, [[[segment(g, VOCAB, 3, 3, 0, 1.0)]]], tmp_path / "out",
                   resume_from=ckpt)
    assert _run(p) == 2
    assert "step '7' is not a non-negative integer" in caplog.text


def test_torchrun_two_processes_equal_one(tiny_checkpoint, tmp_path, capsys):
    """Two CPU ranks train the plan one process trains: the same summed
    gradient (its norm, before clipping, is reported per step and depends
    on the gradient's scale, which Adam's update does not: averaging
    instead of summing halves it), the same metrics, the same parameters.
    Two steps, so step 2 trains against old logprobs each rank recomputed
    for its own micro-batches."""
    steps = _two_steps(tmp_path)
    # float64: Adam's first update is about lr·g/|g|, so a gradient near eps
    # summed in another order moves its weight by up to lr in float32
    one = write_plan(tmp_path / "one", tiny_checkpoint, steps, tmp_path / "o-one", dtype="float64",
                     optimizer={"lr": 1e-2})
    two = write_plan(tmp_path / "two", tiny_checkpoint, steps, tmp_path / "o-two", dtype="float64",
                     optimizer={"lr": 1e-2})
    assert _run(one) == 0
    ev1 = [json.loads(x) for x in capsys.readouterr().out.splitlines()][1:3]
    torchrun = Path(sys.executable).parent / "torchrun"
    env = dict(os.environ, PYTHONPATH=str(Path(__file__).resolve().parents[1]), OMP_NUM_THREADS="1")
    r = subprocess.run([str(torchrun), "--nproc-per-node", "2", "--master-port", "29517", "-m", "kiln_gpu.train",
                        "--plan", str(two)], env=env, capture_output=True, text=True, timeout=300)
    assert r.returncode == 0, r.stderr[-3000:]
    ev2 = [json.loads(x) for x in r.stdout.splitlines()][1:3]
    assert [e["event"] for e in ev2] == ["step", "step"]
    for a, b in zip(ev1, ev2):
        assert b["grad_norm"] == pytest.approx(a["grad_norm"], rel=1e-9), (a["grad_norm"], b["grad_norm"])
        for k in ("loss", "ppo_kl", "pg_clipfrac", "train_rollout_logprob_max_abs_diff"):
            assert b[k] == pytest.approx(a[k], rel=1e-9, abs=1e-12), (k, a[k], b[k])
    assert ev1[1]["ppo_kl"] != 0.0  # step 2 has a ratio to train against
    a, b = _params(tmp_path / "o-one"), _params(tmp_path / "o-two")
    base = _params(tiny_checkpoint) if list(Path(tiny_checkpoint).glob("model-*")) else load_file(
        str(Path(tiny_checkpoint) / "model.safetensors"))
    assert max(float((a[k] - b[k]).abs().max()) for k in a) <= 1e-5
    assert max(float((a[k] - base[k]).abs().max()) for k in a) > 1e-4


def test_score_centering_kl_entropy_plan_trains(tiny_checkpoint, tmp_path, capsys):
    """A plan with recorded nuclei, SC REINFORCE with TIS, a KL term (the
    reference model is loaded) and an entropy term runs end to end."""
    g = torch.Generator().manual_seed(11)
    segs = []
    for r in range(2):
        s = segment(g, VOCAB, 4, 3, r, 1.0 if r else -1.0)
        s["spans"] = [([tok, tok + 1, tok + 2], [0.6, 0.3, 0.1]) for tok in s["response"]]
        s["roll"] = [float(torch.log(torch.tensor(0.6)))] * 3
        segs.append(s)
    p = write_plan(tmp_path / "b", tiny_checkpoint, [[segs]], tmp_path / "out",
                   loss={"objective": "reinforce", "score_centering": True, "correction": "tis",
                         "kl_coef": 0.1, "entropy_coef": 0.01})
    assert _run(p) == 0
    step = [json.loads(x) for x in capsys.readouterr().out.splitlines()][1]
    assert step["kl_loss"] == pytest.approx(0.0, abs=1e-6)  # the policy is the reference at step 0
    assert step["entropy"] > 0 and "sc_correction" in step and step["sc_sampler_head_mass"] == pytest.approx(1.0)
    assert math.isfinite(step["grad_norm"]) and step["grad_norm"] > 0


def test_failure_mid_step_exits_1_and_leaves_no_out(tiny_checkpoint, tmp_path):
    """A token id beyond the embedding fails the forward pass: exit 1, and
    neither out nor a finished temporary directory is left as out."""
    g = torch.Generator().manual_seed(12)
    s = segment(g, VOCAB, 3, 3, 0, 1.0)
    s["response"][1] = 10_000_000
    p = write_plan(tmp_path / "b", tiny_checkpoint, [[[s]]], tmp_path / "out")
    assert _run(p) == 1
    assert not (tmp_path / "out").exists()


# -- PPO's old policy over several optimizer steps (docs/train.md §13)


def _hf_logprobs(model, segs, temperature):
    """Each segment alone through the plain HF forward, full vocabulary: an
    independent path from the trainer's packed, right-padded one."""
    out = []
    with torch.no_grad():
        for s in segs:
            ids = torch.tensor([s["prompt"] + s["response"]])
            n, r = ids.shape[1], len(s["response"])
            logits = model(input_ids=ids).logits[0, n - r - 1:n - 1].double() / temperature
            out.append(torch.log_softmax(logits, -1).gather(-1, torch.tensor([s["response"]]).T).squeeze(-1))
    return out


def _step_reference(objective, segs, old, new, eps_lo, eps_hi, correction=None):
    """One step's loss, ppo_kl and pg_clipfrac written from docs/train.md
    §3.1, §3.2, §4, §8.1 (rollout reduction) on given old and new logprobs."""
    D: dict[int, float] = {}
    for s in segs:
        D[s["rollout"]] = D.get(s["rollout"], 0.0) + sum(s["mask"])
    G = len(D)
    loss = kl = clip = 0.0
    for s, o, n in zip(segs, old, new):
        m = torch.tensor(s["mask"], dtype=torch.float64)
        A = torch.tensor(s["adv"], dtype=torch.float64)
        roll = torch.tensor(s["roll"], dtype=torch.float64)
        lr = n - o
        if objective == "gspo":  # the segment's mean log ratio on each token
            lr = torch.full_like(n, float((m * lr).sum() / m.sum()))
        r = torch.exp(lr)
        rc = r.clamp(1 - eps_lo, 1 + eps_hi)
        if objective == "cispo":
            ell, c = -rc * A * n, (rc != r).double()
        else:
            ell, c = torch.maximum(-r * A, -rc * A), (-rc * A > -r * A).double()
        w = torch.exp(o - roll).clamp(0.0, 2.0) if correction == "tis" else torch.ones_like(n)
        k = m / D[s["rollout"]] / G
        loss += float((ell * w * k).sum())
        kl += float(((o - n) * k).sum())
        clip += float((c * k).sum())
    return loss, kl, clip


@pytest.mark.parametrize("objective, old_mode, correction", [
    ("ppo", "recompute", None), ("gspo", "recompute", "tis"), ("cispo", "recompute", None), ("ppo", "rollout", None),
])
def test_two_steps_on_one_batch_clip_against_reference(tiny_checkpoint, tmp_path, objective, old_mode, correction):
    """Two optimizer steps on the same rollouts at a large learning rate:
    step 2's ratio is the model after step 1 against the old policy
    (the weights before step 1, or the rollout logprobs), so it clips, and
    the trainer's loss, ppo_kl and pg_clipfrac equal the formulas
    evaluated on logprobs computed here with the HF model: the base's (old)
    and those of the model after step 1 (a one-step run of the same plan)."""
    from transformers import AutoModelForCausalLM

    g = torch.Generator().manual_seed(21)
    segs = [segment(g, VOCAB, 4, 6, 0, 1.0), segment(g, VOCAB, 3, 5, 1, -1.0), segment(g, VOCAB, 5, 4, 1, -1.0),
            segment(g, VOCAB, 3, 6, 2, 0.5, mask=[1, 1, 0, 1, 1, 1])]
    T, lo, hi = 0.8, 0.1, 0.15  # not the default ε: a trainer that ignores the plan's ε fails
    for s in segs:  # rollout logprobs near the model's (the tiny model's are about −12)
        s["roll"] = [-12.0 + 0.05 * i for i in range(len(s["response"]))]
    step = [segs[:2], segs[2:]]
    kw = dict(loss={"objective": objective, "eps_clip": lo, "eps_clip_high": hi, "correction": correction,
                    "old_logprobs": old_mode},
              optimizer={"lr": 3e-2, "grad_clip": 0.0}, temperature=T, dtype="float64")
    two = train.run(load_plan(write_plan(tmp_path / "two", tiny_checkpoint, [step, step], tmp_path / "o2", **kw)),
                    train.Dist())
    one = train.run(load_plan(write_plan(tmp_path / "one", tiny_checkpoint, [step], tmp_path / "o1", **kw)),
                    train.Dist())
    ev = [json.loads(x) for x in two.lines]
    assert json.loads(one.lines[0])["loss"] == ev[0]["loss"]
    base = AutoModelForCausalLM.from_pretrained(tiny_checkpoint, dtype=torch.float64)
    start = _hf_logprobs(base, segs, T)
    after1 = _hf_logprobs(one.model, segs, T)
    old = [torch.tensor(s["roll"], dtype=torch.float64) for s in segs] if old_mode == "rollout" else start
    for i, new in enumerate((start, after1)):
        loss, kl, clip = _step_reference(objective, segs, old, new, lo, hi, correction)
        got = ev[i]
        assert got["loss"] == pytest.approx(loss, abs=1e-6), (i, got["loss"], loss)
        assert got["ppo_kl"] == pytest.approx(kl, abs=1e-6), (i, got["ppo_kl"], kl)
        assert got["pg_clipfrac"] == pytest.approx(clip, abs=1e-9), (i, got["pg_clipfrac"], clip)
    if old_mode == "recompute":  # step 1: the old policy is the current one, exactly
        assert ev[0]["ppo_kl"] == 0.0 and ev[0]["pg_clipfrac"] == 0.0
    assert ev[1]["pg_clipfrac"] > 0.05 and abs(ev[1]["ppo_kl"]) > 1e-3, ev[1]
