"""The trainer's CPU step time beside a bare PyTorch loop (docs/train.md §12).

Both do the same work on the same packed micro-batch files of the tiny Qwen3
checkpoint: read the file, one forward over the right-padded segments, the
LM head on the response rows (both: the trainer's direct path and the bare
loop index the hidden states before the head), the loss reduced per
rollout, backward, gradient clipping, AdamW. The bare loop's loss is −A·lp;
the trainer's is its objective (PPO clip here) plus the metrics every step
reports, max_abs_logprob_diff included.

The two alternate in rounds on the same cores, the order swapped every
round, so a neighbour's load hits both alike: a round is one trainer run of
a two-step plan (its first step warms up; the second step's own time_s is
the figure) and one bare step on the same micro-batches by a model and
optimizer kept across rounds (warmed once). Prints the median of the
per-round ratios trainer/bare (goal ≤ 1.15) with its spread, the median
times, and what max_abs_logprob_diff costs a step (timed apart on the same
micro-batches, reading the loss's logprobs as the trainer does, and
recomputing them as it did before) as a share of the trainer's step.

    cd gpu && python bench_train.py [--rounds 5]
"""

from __future__ import annotations

import argparse
import contextlib
import io
import json
import shutil
import statistics
import sys
import tempfile
import time
from contextlib import redirect_stdout
from pathlib import Path

import torch
from safetensors.torch import load_file

sys.path.insert(0, str(Path(__file__).resolve().parent / "tests"))

from kiln_gpu import train  # noqa: E402
from kiln_gpu.tiny import build  # noqa: E402
from planio import segment, write_plan  # noqa: E402


def bare_step(model, opt, files, divisor):
    t0 = time.perf_counter()
    opt.zero_grad(set_to_none=True)
    for f in files:
        t = load_file(str(f))
        off = t["seq_offsets"].tolist()
        rl = t["response_lengths"].tolist()
        lens = [b - a for a, b in zip(off, off[1:])]
        ids = torch.zeros(len(lens), max(lens), dtype=torch.long)
        att = torch.zeros_like(ids)
        for i, (a, n) in enumerate(zip(off, lens)):
            ids[i, :n] = t["tokens"][a:a + n].long()
            att[i, :n] = 1
        rows = torch.cat([torch.full((r,), i) for i, r in enumerate(rl)])
        cols = torch.cat([torch.arange(n - r - 1, n - 1) for n, r in zip(lens, rl)])
        h = model.model(input_ids=ids, attention_mask=att).last_hidden_state
        lp = torch.log_softmax(model.lm_head(h[rows, cols]), -1).gather(-1, ids[rows, cols + 1].unsqueeze(-1))[:, 0]
        d = torch.repeat_interleave(t["denominators"], torch.tensor(rl))
        loss = (-t["advantages"] * lp * t["loss_mask"] / d).sum() / divisor
        loss.backward()
    torch.nn.utils.clip_grad_norm_(model.parameters(), 1.0)
    opt.step()
    return time.perf_counter() - t0


def diff_cost(model, files) -> tuple[float, float]:
    """Seconds max_abs_logprob_diff takes over one step's micro-batches, on
    logits computed the trainer's way (not timed): reading the loss's
    full-vocabulary logprobs as the trainer does (LossOutput.full_lp), and
    recomputing them from the logits (the top-p replay path, and every step
    before 2026-12-03)."""
    from kiln_gpu.batches import load_micro_batch

    read = recompute = 0.0
    cpu = torch.device("cpu")
    with torch.no_grad():
        for f in files:
            mb = load_micro_batch(f)
            logits, target = train.response_logits(model, mb, 1.0, cpu, contextlib.nullcontext)
            full = torch.log_softmax(logits, -1).gather(-1, target.unsqueeze(-1)).squeeze(-1)  # the loss's
            t0 = time.perf_counter()
            train.max_abs_logprob_diff(logits, target, mb, cpu, full)
            t1 = time.perf_counter()
            train.max_abs_logprob_diff(logits, target, mb, cpu)
            read, recompute = read + t1 - t0, recompute + time.perf_counter() - t1
    return read, recompute


def main(argv=None) -> int:
    ap = argparse.ArgumentParser()
    ap.add_argument("--rounds", type=int, default=5)
    a = ap.parse_args(argv)
    from transformers import AutoModelForCausalLM

    torch.manual_seed(0)
    with tempfile.TemporaryDirectory() as d:
        d = Path(d)
        ckpt = build(d / "tiny")
        g = torch.Generator().manual_seed(0)
        steps = []
        for _ in range(2):  # warm-up, measured
            segs = [segment(g, 150000, 32, 48, r, 1.0 if r % 2 else -1.0) for r in range(8)]
            steps.append([segs[:4], segs[4:]])
        plan = write_plan(d / "b", ckpt, steps, d / "out", optimizer={"lr": 1e-4})
        p = json.loads(plan.read_text())
        files = [[plan.parent / m for m in st["micro_batches"]] for st in p["steps"]]

        def kiln_step() -> tuple[float, int]:
            shutil.rmtree(d / "out", ignore_errors=True)  # the trainer writes a new directory
            buf = io.StringIO()
            with redirect_stdout(buf):
                assert train.main(["--plan", str(plan)]) == 0
            ev = [json.loads(x) for x in buf.getvalue().splitlines() if '"step"' in x]
            return ev[-1]["time_s"], ev[-1]["tokens"]

        model = AutoModelForCausalLM.from_pretrained(ckpt, dtype=torch.float32).train()
        opt = torch.optim.AdamW(model.parameters(), lr=1e-4, foreach=False)
        bare_step(model, opt, files[0], p["steps"][0]["divisor"])  # warm-up

        def bare() -> float:
            return bare_step(model, opt, files[1], p["steps"][1]["divisor"])

        t_kiln, t_bare, ratios = [], [], []
        tokens = 0
        for r in range(a.rounds):
            if r % 2 == 0:
                (k, tokens), b = kiln_step(), bare()
            else:
                b = bare()
                k, tokens = kiln_step()
            t_kiln.append(k)
            t_bare.append(b)
            ratios.append(k / b)
            print(f"round {r}: trainer {k * 1e3:.0f} ms, bare {b * 1e3:.0f} ms, ratio {k / b:.3f}", flush=True)
        costs = [diff_cost(model, files[1]) for _ in range(3)]
        t_diff = statistics.median(c[0] for c in costs)
        t_recompute = statistics.median(c[1] for c in costs)
    km, bm = statistics.median(t_kiln), statistics.median(t_bare)
    print(f"trainer step {km * 1e3:.0f} ms, bare loop {bm * 1e3:.0f} ms (medians); "
          f"ratio median {statistics.median(ratios):.3f} (min {min(ratios):.3f}, max {max(ratios):.3f}, "
          f"{a.rounds} alternating rounds; goal <= 1.15); max_abs_logprob_diff {t_diff * 1e3:.1f} ms a step, "
          f"{100 * t_diff / km:.2f}% of the trainer's step (recomputed from the logits: {t_recompute * 1e3:.1f} ms) "
          f"({tokens} tokens/step, 2 micro-batches, tiny Qwen3, CPU, {torch.get_num_threads()} threads)")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
