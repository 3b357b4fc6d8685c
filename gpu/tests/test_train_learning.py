"""Learning on CPU (docs/train.md §12): on a synthetic task whose reward is
whether the sampled answer contains a target string, a few GRPO steps of the
trainer on the tiny Qwen3 model raise the mean reward over a fixed eval set."""

import json

import torch

from kiln_gpu import train
from planio import write_plan

SEED = 0
CANDIDATES = list(range(32))  # byte-level ids '!' … '@' in Qwen3's vocabulary: '0' … '9' are 15 … 24
TARGET = "7"
ANSWER_TOKENS = 3
PROMPTS = [[9707, 11, 1879, 25], [785, 4226, 374, 25], [3838, 374, 279, 1372, 30], [22043, 264, 15723, 25]]


def sample(model, prompts, n, gen):
    """n answers per prompt, sampled from the model's softmax restricted to
    CANDIDATES (T = 1); returns [(prompt, answer ids, answer logprobs)]."""
    cand = torch.tensor(CANDIDATES)
    out = []
    with torch.no_grad():
        for p in prompts:
            seqs = torch.tensor([p] * n)
            lps = []
            for _ in range(ANSWER_TOKENS):
                z = model(input_ids=seqs).logits[:, -1, cand].double()
                logp = torch.log_softmax(z, -1)
                k = torch.multinomial(torch.exp(logp), 1, generator=gen)
                seqs = torch.cat([seqs, cand[k]], 1)
                lps.append(logp.gather(1, k))
            lp = torch.cat(lps, 1)
            out += [(p, seqs[i, len(p):].tolist(), lp[i].tolist()) for i in range(n)]
    return out


def reward(tok, answer):
    return float(TARGET in tok.decode(answer))


def mean_reward(model, tok):
    gen = torch.Generator().manual_seed(1234)  # the fixed eval set: same draws every time
    s = sample(model, PROMPTS, 64, gen)
    return sum(reward(tok, a) for _, a, _ in s) / len(s)


def test_grpo_raises_reward(tiny_checkpoint, tmp_path, capsys):
    from transformers import AutoModelForCausalLM, AutoTokenizer

    tok = AutoTokenizer.from_pretrained(tiny_checkpoint)
    assert tok.decode([22]) == TARGET
    torch.manual_seed(SEED)
    gen = torch.Generator().manual_seed(SEED)
    model = AutoModelForCausalLM.from_pretrained(tiny_checkpoint).eval()
    before = mean_reward(model, tok)
    ckpt = None
    for step in range(4):
        segs = []
        for gi, p in enumerate(PROMPTS):
            group = sample(model, [p], 8, gen)
            rs = torch.tensor([reward(tok, a) for _, a, _ in group])
            adv = (rs - rs.mean()) / (rs.std() + 1e-6)  # GRPO
            for j, (pr, a, lp) in enumerate(group):
                segs.append({"prompt": pr, "response": a, "mask": [1] * len(a), "roll": lp,
                             "adv": [float(adv[j])] * len(a), "rollout": gi * 8 + j, "spans": None})
        out = tmp_path / f"ckpt-{step}"
        plan = write_plan(tmp_path / f"b{step}", tiny_checkpoint, [[segs[:16], segs[16:]]], out, resume_from=ckpt,
                          optimizer={"lr": 3e-3}, seed=SEED)
        assert train.main(["--plan", str(plan)]) == 0
        ckpt = out
        model = AutoModelForCausalLM.from_pretrained(ckpt).eval()
    after = mean_reward(model, tok)
    with capsys.disabled():
        print(f"\nlearning: mean reward over the eval set {before:.3f} -> {after:.3f} (seed {SEED}, 4 GRPO steps)")
    (tmp_path / "result.json").write_text(json.dumps({"before": before, "after": after}))
    assert after >= before + 0.15, (before, after)
