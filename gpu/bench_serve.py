"""serve.py's decode throughput beside a bare transformers loop (docs/serve.md §5).

Both generate the same batch on the tiny Qwen3 checkpoint: 16 fixed
prompts of 16 to 61 tokens, 32 output tokens each (ignore_eos, temperature
1, no top-k/top-p: the whole-vocabulary path), 512 tokens a round.

- serve: python -m kiln_gpu.serve in its own process (--max-batch 16), 16
  concurrent POST /inference/v1/generate requests over HTTP, timed from
  the first send to the last reply;
- bare: the model in this process, one left-padded prefill of the 16
  prompts (attention mask, logits_to_keep=1), then a DynamicCache decode
  loop, each step log_softmax and torch.multinomial over the batch.

The two alternate in rounds on the same cores, the order swapped every
round, so a neighbour's load hits both alike. Prints each round's tokens/s,
the median of the per-round ratios serve/bare (goal >= 0.8) with its
spread, and the load average. --serve-py FILE runs another serve.py (e.g.
the previous version, saved from git) for a before/after figure.

    cd gpu && python bench_serve.py [--rounds 5] [--serve-py FILE]
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
import tempfile
import threading
import time
import urllib.request
from pathlib import Path

import torch

from kiln_gpu.tiny import build, default_tokenizer_dir

N, MAX_TOKENS = 16, 32


def prompts() -> list[list[int]]:
    g = torch.Generator().manual_seed(0)
    return [torch.randint(1000, 50000, (16 + 3 * i,), generator=g).tolist() for i in range(N)]


def start_server(ckpt: Path, work: Path, serve_py: str | None) -> tuple[subprocess.Popen, str]:
    port_file = work / "port"
    mod = [serve_py] if serve_py else ["-m", "kiln_gpu.serve"]
    p = subprocess.Popen([sys.executable, *mod, "--model", str(ckpt), "--port", "0", "--port-file", str(port_file),
                          "--max-batch", str(N)], cwd=Path(__file__).resolve().parent,
                         stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    t0 = time.time()
    while not port_file.exists():
        if p.poll() is not None or time.time() - t0 > 300:
            raise SystemExit(f"serve.py did not start (exit {p.poll()})")
        time.sleep(0.2)
    return p, f"http://127.0.0.1:{port_file.read_text().strip()}"


def post(base: str, body: dict) -> dict:
    req = urllib.request.Request(base + "/inference/v1/generate", data=json.dumps(body).encode(),
                                 headers={"Content-Type": "application/json"})
    with urllib.request.urlopen(req, timeout=600) as r:
        return json.loads(r.read())


def serve_round(base: str, ps: list[list[int]], round_: int) -> tuple[float, int]:
    out = [None] * len(ps)

    def one(i):
        out[i] = post(base, {"token_ids": ps[i], "sampling_params": {
            "max_tokens": MAX_TOKENS, "temperature": 1.0, "ignore_eos": True, "seed": 1000 * round_ + i}})

    ts = [threading.Thread(target=one, args=(i,)) for i in range(len(ps))]
    t0 = time.perf_counter()
    for t in ts:
        t.start()
    for t in ts:
        t.join()
    dt = time.perf_counter() - t0
    return dt, sum(r["usage"]["completion_tokens"] for r in out)


@torch.no_grad()
def bare_round(model, ps: list[list[int]], round_: int) -> tuple[float, int]:
    from transformers import DynamicCache

    g = torch.Generator().manual_seed(round_)
    t0 = time.perf_counter()
    width = max(len(p) for p in ps)
    ids = torch.zeros(len(ps), width, dtype=torch.long)
    mask = torch.zeros_like(ids)
    for i, p in enumerate(ps):
        ids[i, width - len(p):] = torch.tensor(p)
        mask[i, width - len(p):] = 1
    pos = (mask.cumsum(-1) - 1).clamp(min=0)
    cache = DynamicCache()
    o = model(input_ids=ids, attention_mask=mask, position_ids=pos, cache=cache, use_cache=True, logits_to_keep=1)
    n = 0
    for step in range(MAX_TOKENS):
        probs = torch.log_softmax(o.logits[:, -1].float(), dim=-1).exp()
        tok = torch.multinomial(probs, 1, generator=g)
        n += tok.numel()
        if step == MAX_TOKENS - 1:
            break
        mask = torch.cat([mask, torch.ones(len(ps), 1, dtype=torch.long)], dim=1)
        pos = pos[:, -1:] + 1
        o = model(input_ids=tok, attention_mask=mask, position_ids=pos, cache=o.cache, use_cache=True)
    return time.perf_counter() - t0, n


def main(argv=None) -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--rounds", type=int, default=5)
    p.add_argument("--serve-py", help="run this serve.py file instead of kiln_gpu.serve")
    a = p.parse_args(argv)
    tok = default_tokenizer_dir()
    if tok is None:
        print("the Qwen3 tokenizer is not installed: run scripts/install-gpu-deps.sh", file=sys.stderr)
        return 2
    from transformers import AutoModelForCausalLM

    ps = prompts()
    with tempfile.TemporaryDirectory() as d:
        work = Path(d)
        ckpt = build(work / "tiny", tok, seed=0)
        srv, base = start_server(ckpt, work, a.serve_py)
        try:
            model = AutoModelForCausalLM.from_pretrained(str(ckpt), dtype=torch.float32).eval()
            load0 = os.getloadavg()
            serve_round(base, ps, 0)  # warm both
            bare_round(model, ps, 0)
            rows = []
            for r in range(1, a.rounds + 1):
                order = ["serve", "bare"] if r % 2 else ["bare", "serve"]
                got = {}
                for which in order:
                    dt, n = serve_round(base, ps, r) if which == "serve" else bare_round(model, ps, r)
                    assert n == N * MAX_TOKENS, n
                    got[which] = n / dt
                rows.append(got)
                print(f"round {r}: serve {got['serve']:.1f} tok/s, bare {got['bare']:.1f} tok/s, "
                      f"ratio {got['serve'] / got['bare']:.2f}", flush=True)
            load1 = os.getloadavg()
        finally:
            srv.terminate()
            srv.wait(30)
    ratios = [g["serve"] / g["bare"] for g in rows]
    print(f"serve.py{' (' + a.serve_py + ')' if a.serve_py else ''}: {N} concurrent requests x {MAX_TOKENS} tokens, "
          f"tiny Qwen3, {torch.get_num_threads()} torch threads, {os.cpu_count()} cores")
    print(f"median tokens/s: serve {statistics.median(g['serve'] for g in rows):.1f}, "
          f"bare {statistics.median(g['bare'] for g in rows):.1f}")
    print(f"ratio serve/bare: median {statistics.median(ratios):.2f}, spread {min(ratios):.2f}-{max(ratios):.2f} "
          f"over {len(ratios)} rounds (goal >= 0.8)")
    print(f"load average (1 min) before/after: {load0[0]:.1f} / {load1[0]:.1f}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
