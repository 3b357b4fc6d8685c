"""The on-policy identity at a temperature other than 1 (docs/train.md §2,
docs/train-stage.md §13): kiln_gpu.serve samples at T, the trainer trains
those tokens at T, and its logprob of every trained token is the sampler's."""

import json

import pytest
import torch

from kiln_gpu import train
from kiln_gpu.serve import Engine, Job, Sampling
from planio import write_plan

T = 0.7
N = 16
# a chat prompt (test_serve.PROMPT) and two of other lengths, so the
# trainer's right padding is exercised
PROMPTS = [[151644, 872, 198, 9707, 151645, 198, 151644, 77091, 198], [151644, 872, 198, 40, 151645, 198],
           [151644, 872, 198, 9707, 11, 1879, 0, 151645, 198, 151644, 77091, 198]]


@pytest.fixture(scope="module")
def sampled(tiny_checkpoint):
    """N tokens of each prompt sampled at T by the engine (incremental KV
    cache), with the logprobs it reports."""
    eng = Engine(str(tiny_checkpoint), seed=0)
    try:
        out = []
        for i, prompt in enumerate(PROMPTS):
            s = Sampling({"max_tokens": N, "temperature": T, "ignore_eos": True, "seed": 40 + i}, eng.max_model_len,
                         len(prompt))
            r = eng.submit(Job(prompt, s, 40 + i))
            assert len(r["out"]) == N
            out.append((prompt, r["out"], r["lps"]))
        return out
    finally:
        eng.queue.put(None)  # stops the worker


def test_trainer_logprobs_equal_sampled_at_temperature(tiny_checkpoint, sampled, tmp_path, capsys):
    segs = [{"prompt": p, "response": toks, "mask": [1] * N, "roll": lps, "adv": [1.0] * N, "rollout": i,
             "spans": None} for i, (p, toks, lps) in enumerate(sampled)]
    plan = write_plan(tmp_path / "b", tiny_checkpoint, [[segs]], tmp_path / "out", temperature=T,
                      optimizer={"lr": 1e-4})
    assert train.main(["--plan", str(plan)]) == 0
    step = [json.loads(x) for x in capsys.readouterr().out.splitlines()][1]
    # float32 on both sides: the engine's incremental forward against the
    # trainer's packed one differ by rounding only (about 3e-6 at T = 1)
    assert step["train_rollout_logprob_max_abs_diff"] <= 1e-5, step
    assert step["train_rollout_logprob_abs_diff"] <= 1e-5, step
    # the bound can tell T from 1: the same tokens' logprobs at T = 1 are far
    with torch.no_grad():
        from transformers import AutoModelForCausalLM

        m = AutoModelForCausalLM.from_pretrained(tiny_checkpoint)
        p, toks, lps = sampled[0]
        logits = m(input_ids=torch.tensor([p + toks])).logits[0, len(p) - 1:-1]
        at1 = torch.log_softmax(logits, -1).gather(-1, torch.tensor([toks]).T).squeeze(-1)
    assert float((at1 - torch.tensor(lps)).abs().max()) > 1e-2


def _sample(tiny_checkpoint, dtype: str):
    eng = Engine(str(tiny_checkpoint), seed=0, dtype=dtype)
    try:
        p = PROMPTS[2]
        s = Sampling({"max_tokens": N, "temperature": T, "ignore_eos": True, "seed": 7}, eng.max_model_len, len(p))
        r = eng.submit(Job(p, s, 7))
        return p, r["out"], r["lps"]
    finally:
        eng.queue.put(None)


def test_float64_engine_and_trainer_agree_where_float32_cannot(tiny_checkpoint, tmp_path, capsys):
    """--dtype float64 on both sides (docs/serve.md §4): the engine's
    logprobs equal an exact (float64, full-sequence) recomputation to
    rounding of float64, where a float32 engine's are visibly off it; and
    kiln-train's plan dtype reaches the trainer, whose float64 identity is
    then bounded by the float32 the rollout logprobs are stored in."""
    from transformers import AutoModelForCausalLM

    p, toks, lps = _sample(tiny_checkpoint, "float64")
    with torch.no_grad():
        m = AutoModelForCausalLM.from_pretrained(tiny_checkpoint, dtype=torch.float64)
        logits = m(input_ids=torch.tensor([p + toks])).logits[0, len(p) - 1:-1] / T
        exact = torch.log_softmax(logits, -1).gather(-1, torch.tensor([toks]).T).squeeze(-1)
    assert float((exact - torch.tensor(lps, dtype=torch.float64)).abs().max()) <= 1e-10
    p32, toks32, lps32 = _sample(tiny_checkpoint, "float32")
    assert toks32 == toks  # the same draws: the race is run on float32-rounded scores either way
    assert float((exact - torch.tensor(lps32, dtype=torch.float64)).abs().max()) > 1e-8

    segs = [{"prompt": p, "response": toks, "mask": [1] * N, "roll": lps, "adv": [1.0] * N, "rollout": 0,
             "spans": None}]
    plan = write_plan(tmp_path / "b", tiny_checkpoint, [[segs]], tmp_path / "out", temperature=T,
                      optimizer={"lr": 1e-4}, dtype="float64")
    assert train.main(["--plan", str(plan)]) == 0
    step = [json.loads(x) for x in capsys.readouterr().out.splitlines()][1]
    bound = max(abs(x) for x in lps) * 2.0 ** -24  # half a float32 step at the largest |logprob|, and rounding
    assert step["train_rollout_logprob_max_abs_diff"] <= bound, step
