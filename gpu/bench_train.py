"""The trainer's CPU step time beside a bare PyTorch loop (docs/train.md §12).

Both do the same work on the same packed micro-batch files of the tiny Qwen3
checkpoint: read the file, one forward over the right-padded segments, the
LM head on the response rows, −A·lp reduced per rollout, backward, gradient
clipping, AdamW. The trainer's time is its own step event's time_s; the
baseline is timed the same way. Prints both and the ratio (goal ≤ 1.15).

    cd gpu && python bench_train.py [--steps 3]
"""

from __future__ import annotations

import argparse
import io
import json
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


def main(argv=None) -> int:
    ap = argparse.ArgumentParser()
    ap.add_argument("--steps", type=int, default=3)
    a = ap.parse_args(argv)
    from transformers import AutoModelForCausalLM

    torch.manual_seed(0)
    with tempfile.TemporaryDirectory() as d:
        d = Path(d)
        ckpt = build(d / "tiny")
        g = torch.Generator().manual_seed(0)
        steps = []
        for s in range(a.steps + 1):  # the first is warm-up
            segs = [segment(g, 150000, 32, 48, r, 1.0 if r % 2 else -1.0) for r in range(8)]
            steps.append([segs[:4], segs[4:]])
        plan = write_plan(d / "b", ckpt, steps, d / "out", optimizer={"lr": 1e-4})
        buf = io.StringIO()
        with redirect_stdout(buf):
            assert train.main(["--plan", str(plan)]) == 0
        ev = [json.loads(x) for x in buf.getvalue().splitlines() if '"step"' in x]
        t_kiln = sum(e["time_s"] for e in ev[1:]) / a.steps
        model = AutoModelForCausalLM.from_pretrained(ckpt, dtype=torch.float32).train()
        opt = torch.optim.AdamW(model.parameters(), lr=1e-4, foreach=False)
        p = json.loads(plan.read_text())
        times = [bare_step(model, opt, [plan.parent / m for m in st["micro_batches"]], st["divisor"])
                 for st in p["steps"]]
        t_bare = sum(times[1:]) / a.steps
        tokens = ev[0]["tokens"]
    print(f"trainer step {t_kiln * 1e3:.0f} ms, bare loop {t_bare * 1e3:.0f} ms, ratio {t_kiln / t_bare:.3f} "
          f"(goal <= 1.15; {tokens} tokens/step, 2 micro-batches, tiny Qwen3, CPU, {torch.get_num_threads()} threads)")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
