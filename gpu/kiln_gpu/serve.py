"""kiln's small policy server: the engine API kiln's client speaks (docs/serve.md).

    python -m kiln_gpu.serve --model DIR [--host 127.0.0.1] [--port N|0]
        [--port-file F] [--seed S] [--max-batch N] [--served-model-name NAME]
        [--max-model-len N] [--device cpu|cuda] [--dtype float32|float64]
        [--tokenizer-only]
        [--api-key KEY] [--max-logprobs N] [--max-body-bytes N]
        [--max-connections N] [--request-timeout S]
        [--allow-request-chat-template]

Routes (docs/serve.md §2): GET /health, /version, /v1/models, /is_paused,
/weight_info; POST /tokenize, /detokenize, /inference/v1/generate,
/v1/completions, /pause, /resume, /collective_rpc (method reload_weights),
/update_weight_version. JSON shapes and
error statuses follow vLLM's for every field kiln's engine client reads
(docs/engine-wire.md §3, §5, §6).

Logprobs are processed logprobs: log_softmax(logits / T) of the model's
logits in --dtype (float32 by default; T = 1 for greedy), the quantity the trainer recomputes
(docs/serve.md §4). One scheduler thread runs the model: HTTP threads
queue requests to it, and it decodes the running ones (up to --max-batch)
as one batch, one forward per token, each request with its own seeded
sampler (docs/serve.md §3, §5).

--tokenizer-only loads the checkpoint's tokenizer and config, never its
weights, and serves the GETs, /tokenize and /detokenize through the same
code as the full server; every generation route answers 503. It is the
renderer of a replay, which needs no GPU (docs/serve.md §9).

Limits (docs/serve.md §10) keep one client on a shared node from taking the
server down or steering it: --api-key guards every route but /health, and
bodies, connections, slow clients, logprobs and request-supplied chat
templates are bounded or refused.
"""

from __future__ import annotations

import argparse
import hashlib
import hmac
import json
import math
import os
import queue
import socket
import sys
import threading
import time
import uuid
from http import HTTPStatus
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path
from typing import Any, Optional
from urllib.parse import parse_qs, urlparse

import torch

VERSION = "kiln-serve 0.1"
GREEDY_EPS = 1e-5  # vLLM's _SAMPLING_EPS: a temperature below is greedy


class APIError(Exception):
    """A request error answered as vLLM's error envelope (docs/serve.md §2.8)."""

    def __init__(self, status: int, message: str, typ: str = "BadRequestError"):
        super().__init__(message)
        self.status = status
        self.message = message
        self.typ = typ


def bad(msg: str) -> APIError:
    return APIError(400, msg)


# ---------------------------------------------------------------- sampling


class Sampling:
    """The sampling_params kiln_gpu.serve honours, validated (docs/serve.md §3)."""

    def __init__(self, d: dict, max_model_len: int, prompt_len: int, max_logprobs: int = 20):
        if not isinstance(d, dict):
            raise bad("sampling_params must be an object")

        def num(key, default, lo=None, hi=None, kind=float):
            v = d.get(key)
            if v is None:
                return default
            if isinstance(v, bool) or not isinstance(v, (int, float)) or (kind is int and not isinstance(v, int)):
                raise bad(f"{key} must be a{'n integer' if kind is int else ' number'}, got {v!r}")
            if (lo is not None and v < lo) or (hi is not None and v > hi):
                raise bad(f"{key} must be in [{lo}, {hi}], got {v}")
            return kind(v)

        self.max_tokens = num("max_tokens", 16, 1, None, int)
        self.temperature = num("temperature", 1.0, 0.0, 2.0)
        self.top_p = num("top_p", 1.0, 0.0, 1.0)
        if self.top_p <= 0:
            raise bad(f"top_p must be in (0, 1], got {self.top_p}")
        self.top_k = num("top_k", 0, -1, None, int)
        self.min_p = num("min_p", 0.0, 0.0, 1.0)
        self.seed = d.get("seed")
        if self.seed is not None and (isinstance(self.seed, bool) or not isinstance(self.seed, int)):
            raise bad(f"seed must be an integer, got {self.seed!r}")
        self.min_tokens = num("min_tokens", 0, 0, None, int)
        if self.min_tokens > self.max_tokens:
            raise bad(f"min_tokens must be less than or equal to max_tokens={self.max_tokens}, got {self.min_tokens}")
        self.logprobs = num("logprobs", 0, -1, None, int)
        if self.logprobs == -1:
            raise bad("logprobs=-1 (the full vocabulary) is not supported by kiln_gpu.serve")
        if self.logprobs > max_logprobs:  # vLLM's check and message (--max-logprobs)
            raise bad(f"Requested sample logprobs of {self.logprobs}, which is greater than max allowed: {max_logprobs}")
        ids = d.get("stop_token_ids") or []
        if not isinstance(ids, list) or not all(isinstance(i, int) and not isinstance(i, bool) and i >= 0 for i in ids):
            raise bad("stop_token_ids must be a list of non-negative integers")
        self.stop_token_ids = list(ids)
        stop = d.get("stop") or []
        if isinstance(stop, str):
            stop = [stop]
        if not isinstance(stop, list) or not all(isinstance(s, str) for s in stop):
            raise bad("stop must be a string or a list of strings")
        self.stop = [s for s in stop if s]
        self.include_stop_str_in_output = bool(d.get("include_stop_str_in_output", False))
        self.ignore_eos = bool(d.get("ignore_eos", False))
        for key, neutral in (("presence_penalty", 0.0), ("frequency_penalty", 0.0), ("repetition_penalty", 1.0)):
            v = d.get(key)
            if v is not None and v != neutral:
                raise bad(f"{key}={v} is not supported by kiln_gpu.serve (only {neutral}); see docs/serve.md §3")
        if d.get("logit_bias"):
            raise bad("logit_bias is not supported by kiln_gpu.serve; see docs/serve.md §3")
        self.return_sampling_mask = bool(d.get("return_sampling_mask", False))
        self.return_sampling_mask_logprobs = bool(d.get("return_sampling_mask_logprobs", False))
        if prompt_len + self.max_tokens > max_model_len:
            raise bad(
                f"This model's maximum context length is {max_model_len} tokens. However, you requested "
                f"{prompt_len + self.max_tokens} tokens ({prompt_len} in the messages, {self.max_tokens} in the "
                f"completion). Please reduce the length of the messages or completion."
            )

    @property
    def greedy(self) -> bool:
        return self.temperature < GREEDY_EPS


def processed_logprobs(logits: torch.Tensor, temps: torch.Tensor) -> torch.Tensor:
    """log_softmax(logits / T) in float32 (float64 logits stay float64),
    row by row: logits [B, V], temps [B] with T = 1 for a greedy row
    (docs/serve.md §4)."""
    x = logits if logits.dtype == torch.float64 else logits.float()
    return torch.log_softmax(x / temps.to(x.dtype).unsqueeze(-1), dim=-1)


def request_seed(server_seed: int, request_id: str) -> int:
    """The seed of a request that sends none but names itself: a function
    of the server's --seed and its request_id alone (docs/serve.md §3)."""
    h = hashlib.blake2b(f"{server_seed}:{request_id}".encode(), digest_size=8).digest()
    return int.from_bytes(h, "little") >> 1


def ranked(logp: torch.Tensor, ids: torch.Tensor) -> torch.Tensor:
    """ids by descending logp, ties by ascending id: the nucleus order of
    the sampling_mask reply (docs/serve.md §3)."""
    ids = ids.sort().values
    return ids[torch.sort(logp[ids], descending=True, stable=True).indices]


def nucleus(logp: torch.Tensor, s: Sampling) -> Optional[torch.Tensor]:
    """The ids the sampler may draw from, in ascending id order, or None for
    the whole vocabulary: top-k, then min-p, then top-p over the processed
    distribution (docs/serve.md §3). Top-p keeps the smallest prefix by
    descending probability whose mass (renormalised over the ids top-k and
    min-p left) reaches top_p, the token that crosses it included, as vLLM's
    sampler does. Never sorts the vocabulary: torch.topk of k ids, and for
    top-p alone a topk that widens until its mass reaches top_p."""
    v = logp.numel()
    k = s.top_k if 0 < s.top_k < v else v
    if k == v and s.min_p <= 0 and s.top_p >= 1:
        return None
    if k < v or s.min_p > 0:
        if k < v:
            vals, ids = torch.topk(logp, k)
        else:
            # a loose cut in log space, then vLLM's test on the probabilities
            ids = torch.nonzero(logp >= logp.max() + math.log(s.min_p) - 1e-4).squeeze(-1)
            vals, order = torch.sort(logp[ids], descending=True, stable=True)
            ids = ids[order]
        probs = vals.exp()
        if s.min_p > 0:
            n = int((probs >= s.min_p * probs[0]).sum().item())
            vals, ids, probs = vals[:n], ids[:n], probs[:n]
        if s.top_p < 1:
            ids = ids[:top_p_count(probs, probs.sum(), s.top_p)]
        return ids.sort().values
    # top-p over the whole vocabulary: the prefix from a widening topk
    total = logp.exp().sum()
    m = min(v, 64)
    while True:
        vals, ids = torch.topk(logp, m)
        probs = vals.exp()
        if m == v or float(probs.sum() / total) >= s.top_p:
            return ids[:top_p_count(probs, total, s.top_p)].sort().values
        m = min(v, m * 8)


def top_p_count(probs: torch.Tensor, total: torch.Tensor, top_p: float) -> int:
    """How many of probs (descending) top-p keeps: those whose preceding
    mass, over total, is below top_p; at least one."""
    before = torch.cumsum(probs / total, dim=0) - probs / total
    return max(1, int((before < top_p).sum().item()))


def race_scores(logp: torch.Tensor, u: torch.Tensor) -> torch.Tensor:
    """The exponential race's scores (Gumbel-max): logp − log E with
    E = −log u, u uniform in [0, 1) (rows alike: [.., V]). The id with the
    highest score among a set wins with its probability renormalised over
    the set, as torch.multinomial draws one sample (docs/serve.md §3). A
    float change of logp flips the winner only at a near tie of two
    scores, unlike an inverse CDF over ~10⁵ near-equal masses, so batched
    and alone decoding draw the same ids. u is overwritten."""
    return logp.float() - u.log_().neg_().log_()


def draw(logp: torch.Tensor, ids: Optional[torch.Tensor], u: torch.Tensor) -> int:
    """The race's winner among ids (None: the whole vocabulary) for one
    row of uniforms u."""
    score = race_scores(logp, u.clone())
    if ids is None:
        return int(torch.argmax(score).item())
    return int(ids[torch.argmax(score[ids])].item())


class Stepper:
    """One request's sampler: its Sampling and its generator. The
    uniforms of the request's n-th sampled token are the n-th block of V
    (vocabulary size) torch.rand float32 values of a CPU torch.Generator
    seeded with the request's seed (docs/serve.md §3): a function of the
    seed, the position and the id, never of what else the server runs or
    batches."""

    def __init__(self, s: Sampling, seed: int):
        self.s = s
        self.gen = torch.Generator(device="cpu")
        self.gen.manual_seed(seed & 0xFFFFFFFFFFFFFFFF)

    def choose(self, logp: torch.Tensor, banned: list[int]) -> tuple[int, Optional[torch.Tensor]]:
        """choose_rows for one row."""
        return choose_rows(logp.unsqueeze(0), [self], [banned])[0]


def choose_rows(logp: torch.Tensor, steppers: list[Stepper], banned: list[list[int]]
                ) -> list[tuple[int, Optional[torch.Tensor]]]:
    """Each row's (token id, nucleus ids in ascending order or None when
    greedy or the whole vocabulary) from the processed logprobs [B, V]:
    the uniforms are drawn row by row from each request's own generator,
    the race is scored for all rows at once. banned ids (min_tokens) are
    removed from the draw, never from the reported logprobs."""
    if any(banned):
        logp = logp.clone()
        for i, b in enumerate(banned):
            if b:
                logp[i, b] = float("-inf")
    out: list = [None] * len(steppers)
    greedy = [i for i, st in enumerate(steppers) if st.s.greedy]
    sampled = [i for i, st in enumerate(steppers) if not st.s.greedy]
    if greedy:
        for i, t in zip(greedy, logp[greedy].argmax(dim=-1).tolist()):
            out[i] = (t, None)
    if sampled:
        u = torch.empty(len(sampled), logp.shape[-1])
        for r, i in enumerate(sampled):
            torch.rand(logp.shape[-1], generator=steppers[i].gen, out=u[r])
        score = race_scores(logp[sampled], u)
        best = score.argmax(dim=-1).tolist()
        for r, i in enumerate(sampled):
            ids = nucleus(logp[i], steppers[i].s)
            out[i] = (best[r], None) if ids is None else (int(ids[torch.argmax(score[r, ids])].item()), ids)
    return out


# ---------------------------------------------------------- demonstrations


class Demonstrations:
    """Forced decoding (docs/serve.md §11): a JSONL file of demonstrations,
    one object a line, {"match": TEXT, "turns": [TEXT, ...]} (other keys, such
    as a task id, are kept for the reader and ignored). A generation request
    gets the tokens of one demonstration turn instead of sampled ones: the
    demonstration whose match occurs in the decoded prompt (exactly one must),
    turn n when the prompt already holds n assistant turns, counted as the
    occurrences of marker (the chat template's assistant header; the
    generation prompt's own is not counted). A prompt no demonstration
    matches is sampled as usual (a client's probe, such as kiln-rollout's
    before a run; a line on stderr says so), one that several match is a
    400. A turn is tokenized as the
    tokenizer encodes its text, special tokens such as <|im_end|> included,
    so it ends where the policy would stop; each token is reported with the
    model's own processed logprob (§4), so a demonstration trains like any
    sampled turn."""

    def __init__(self, path: str, tokenizer, marker: str = "<|im_start|>assistant"):
        self.path = str(path)
        self.tokenizer = tokenizer
        self.marker = marker
        self.demos: list[tuple[str, list[list[int]]]] = []
        with open(path, encoding="utf-8") as f:
            for n, line in enumerate(f, 1):
                if not line.strip():
                    continue
                where = f"--demonstrations {self.path!r} line {n}"
                try:
                    d = json.loads(line)
                except ValueError as ex:
                    raise ValueError(f"{where}: not JSON: {ex}") from None
                if not isinstance(d, dict):
                    raise ValueError(f"{where}: want an object with match and turns")
                m, turns = d.get("match"), d.get("turns")
                if not isinstance(m, str) or not m:
                    raise ValueError(f"{where}: match must be a non-empty string (text of the prompt)")
                if not isinstance(turns, list) or not turns or not all(isinstance(t, str) and t for t in turns):
                    raise ValueError(f"{where}: turns must be a non-empty list of non-empty strings")
                if any(m == old for old, _ in self.demos):
                    raise ValueError(f"{where}: match {m!r} repeats an earlier line's")
                self.demos.append((m, [tokenizer.encode(t, add_special_tokens=False) for t in turns]))
        if not self.demos:
            raise ValueError(f"--demonstrations {self.path!r}: no demonstrations in the file")

    def tokens(self, prompt: list[int]) -> Optional[list[int]]:
        """The forced tokens of the demonstration turn prompt asks for, None
        when no demonstration matches; a 400 naming the prompt's problem
        when several do or the turn is past the demonstration's."""
        text = self.tokenizer.decode(prompt)
        hits = [(m, turns) for m, turns in self.demos if m in text]
        if not hits:
            print(f"kiln_gpu.serve: forced decoding: no demonstration matches a prompt of {len(prompt)} tokens; "
                  "sampled as usual", file=sys.stderr, flush=True)
            return None
        if len(hits) > 1:
            raise bad(f"forced decoding (--demonstrations {self.path!r}): {len(hits)} demonstrations match "
                      f"({', '.join(repr(m) for m, _ in hits)}) in the prompt; "
                      "give each demonstration a match found in its task's prompt only")
        m, turns = hits[0]
        n = text.count(self.marker) - 1
        if not 0 <= n < len(turns):
            raise bad(f"forced decoding: demonstration {m!r} has {len(turns)} turn(s); the prompt holds "
                      f"{max(n, 0)} assistant turn(s) ({self.marker!r}) and asks for turn {n + 1}")
        return turns[n]


# ------------------------------------------------------------------ engine


def check_model_dir(path) -> None:
    """A checkpoint directory the server can load: config.json and a
    tokenizer (docs/serve.md §1); else FileNotFoundError saying what to do."""
    p = Path(path)
    if not p.is_dir():
        raise FileNotFoundError(f"--model {str(path)!r} is not a directory (want a Hugging Face checkpoint directory)")
    if not (p / "config.json").is_file():
        raise FileNotFoundError(f"--model {str(path)!r} has no config.json: not a Hugging Face checkpoint directory")
    if not (p / "tokenizer_config.json").is_file() or not any((p / f).is_file() for f in ("tokenizer.json", "vocab.json", "tokenizer.model")):
        raise FileNotFoundError(
            f"--model {str(path)!r} has no tokenizer (want tokenizer_config.json and tokenizer.json): "
            "copy the base model's tokenizer files in (python -m kiln_gpu.tiny writes both)")


TOKENIZER_ONLY = ("serve.py --tokenizer-only does not generate; it is a replay renderer: "
                  "{route} needs the server started without --tokenizer-only (docs/serve.md §9)")


class Renderer:
    """A checkpoint's tokenizer, chat template and config, and no weights:
    what /tokenize, /detokenize and the GETs read (docs/serve.md §2, §7).
    Served alone by --tokenizer-only (docs/serve.md §9); Engine adds the
    model, so both modes render through the same Server code."""

    generates = False  # Server refuses the generation routes (503)

    def __init__(self, model_dir: str, served_name: Optional[str] = None, max_model_len: Optional[int] = None):
        from transformers import AutoConfig, AutoTokenizer

        check_model_dir(model_dir)
        self.model_dir = str(model_dir)
        self.served_name = served_name or self.model_dir
        self.tokenizer = AutoTokenizer.from_pretrained(self.model_dir)
        # config.json only (no weights): the context length and vocabulary
        # the full server reads from the loaded model's config, the same
        # object (docs/serve.md §9).
        self.config = AutoConfig.from_pretrained(self.model_dir)
        self.max_model_len = int(max_model_len or getattr(self.config, "max_position_embeddings", 4096))
        self.weight_version = 0
        self.weights_path = self.model_dir
        self.paused = False

    @property
    def vocab_size(self) -> int:
        """The model's vocabulary (the embedding rows), at least the
        tokenizer's: the ids /detokenize accepts."""
        return max(len(self.tokenizer), int(getattr(self.config, "vocab_size", 0) or 0))


class Job:
    def __init__(self, prompt: list[int], s: Sampling, seed: int):
        self.prompt = prompt
        self.s = s
        self.seed = seed
        self.done = threading.Event()
        self.result: Any = None
        self.error: Optional[BaseException] = None


class Seq:
    """One admitted request in the running batch: its sampler, what it has
    emitted, and why it stopped (docs/serve.md §3, §5)."""

    def __init__(self, job: Job, eos_ids: list[int]):
        self.job = job
        self.s = s = job.s
        self.step = Stepper(s, job.seed)
        self.stops = set(s.stop_token_ids)
        self.eos = set() if s.ignore_eos else set(eos_ids)
        self.out: list[int] = []
        self.lps: list[float] = []
        self.tops: list[list[tuple[int, float]]] = []
        self.masks: list[list[int]] = []
        self.mask_lps: list[list[float]] = []
        self.versions: list[int] = []  # the weights version of each token's forward
        self.finish: Optional[str] = None
        self.stop_reason: Any = None
        # a demonstration turn's tokens (forced decoding, §11), or None
        self.forced: Optional[list[int]] = None

    @property
    def temperature(self) -> float:
        return 1.0 if self.s.greedy else self.s.temperature

    @property
    def position(self) -> int:
        """The position of the last emitted token, the next forward's input."""
        return len(self.job.prompt) + len(self.out) - 1

    def banned(self) -> list[int]:
        """The ids min_tokens keeps out of the next draw."""
        return sorted(self.eos | self.stops) if len(self.out) < self.s.min_tokens else []

    def emit(self, logp: torch.Tensor, tok: int, nuc: Optional[torch.Tensor], version: int, tokenizer) -> bool:
        """Records the chosen token with its processed logprobs row (and
        nucleus); True when the request is finished."""
        s = self.s
        self.out.append(tok)
        self.lps.append(float(logp[tok].item()))
        self.versions.append(version)
        if s.logprobs > 0:
            top = torch.topk(logp, min(s.logprobs, logp.numel()))
            row = [(tok, float(logp[tok].item()))]
            row += [(int(t), float(v)) for v, t in zip(top.values.tolist(), top.indices.tolist()) if int(t) != tok]
            self.tops.append(row)  # k entries when tok is among the top k, else k+1
        if s.return_sampling_mask:
            if s.greedy:
                m = torch.tensor([tok])
            else:
                m = ranked(logp, torch.arange(logp.numel()) if nuc is None else nuc)
            self.masks.append(m.tolist())
            if s.return_sampling_mask_logprobs:
                self.mask_lps.append(logp[m].tolist())
        if len(self.out) >= s.min_tokens:
            if tok in self.stops:
                self.finish, self.stop_reason = "stop", tok
            elif tok in self.eos:
                self.finish = "stop"
            elif s.stop:
                text = tokenizer.decode(self.out)
                hit = next((st for st in s.stop if st in text), None)
                if hit is not None:
                    self.finish, self.stop_reason = "stop", hit
        if self.finish is None and self.forced is not None and len(self.out) >= len(self.forced):
            self.finish = "stop"  # the demonstration turn ended (§11)
        if self.finish is None and len(self.out) >= s.max_tokens:
            self.finish = "length"
        return self.finish is not None

    def result(self) -> dict:
        return dict(out=self.out, lps=self.lps, tops=self.tops, masks=self.masks, mask_lps=self.mask_lps,
                    finish=self.finish, stop_reason=self.stop_reason, versions=self.versions,
                    version=self.versions[-1] if self.versions else None)


# -- the running batch's KV cache: a transformers DynamicCache whose rows are
# left-padded to one length, with a [B, T] attention mask (1 real, 0 pad)


def batchable(cache) -> bool:
    """A cache whose layers are plain DynamicLayers (keys, values [B, H, T,
    D]): the rows can be padded, joined and dropped. Others (sliding
    windows) run one request at a time."""
    from transformers.cache_utils import DynamicLayer

    return all(type(layer) is DynamicLayer for layer in getattr(cache, "layers", [None]))


def pad_cache_left(cache, n: int) -> None:
    if n > 0:
        for layer in cache.layers:
            layer.keys = torch.nn.functional.pad(layer.keys, (0, 0, n, 0))
            layer.values = torch.nn.functional.pad(layer.values, (0, 0, n, 0))


def join_caches(a, b) -> None:
    """Appends b's rows to a's (the same length)."""
    for la, lb in zip(a.layers, b.layers):
        la.keys = torch.cat([la.keys, lb.keys], dim=0)
        la.values = torch.cat([la.values, lb.values], dim=0)


def keep_cache(cache, rows: torch.Tensor, start: int) -> None:
    """Keeps the given rows and the positions from start on."""
    for layer in cache.layers:
        layer.keys = layer.keys[rows, :, start:]
        layer.values = layer.values[rows, :, start:]


class Batch:
    """The running requests, decoded together: one forward per step over
    every row, each row's own tokens alone visible to it through the
    attention mask, its own positions through position_ids."""

    def __init__(self):
        self.rows: list[Seq] = []
        self.cache = None
        self.mask: Optional[torch.Tensor] = None

    def __len__(self) -> int:
        return len(self.rows)

    def join(self, seq: Seq, cache) -> None:
        """Adds a prefilled request: its cache holds the prompt; its first
        token is emitted and is the next step's input."""
        n = cache.get_seq_length()
        mask = torch.ones(1, n, dtype=torch.long, device=cache.layers[0].keys.device)
        if not self.rows:
            self.rows, self.cache, self.mask = [seq], cache, mask
            return
        t = self.mask.shape[1]
        pad_cache_left(cache, t - n)
        pad_cache_left(self.cache, n - t)
        z = lambda rows, k: torch.zeros(rows, k, dtype=torch.long, device=mask.device)  # noqa: E731
        mask = torch.cat([z(1, max(0, t - n)), mask], dim=1)
        self.mask = torch.cat([z(len(self.rows), max(0, n - t)), self.mask], dim=1)
        join_caches(self.cache, cache)
        self.mask = torch.cat([self.mask, mask], dim=0)
        self.rows.append(seq)

    def drop(self, done: list[Seq]) -> None:
        """Removes finished rows, and the leading columns no row still needs."""
        if not done:
            return
        keep = [i for i, r in enumerate(self.rows) if r not in done]
        if not keep:
            self.rows, self.cache, self.mask = [], None, None
            return
        idx = torch.tensor(keep, device=self.mask.device)
        mask = self.mask[idx]
        start = int((mask.sum(dim=0) > 0).nonzero()[0].item())
        keep_cache(self.cache, idx, start)
        self.mask = mask[:, start:]
        self.rows = [self.rows[i] for i in keep]

    def step_inputs(self) -> dict:
        """One decode step's forward arguments: each row's last token at its
        own position; the mask grows by the column those tokens fill."""
        dev = self.mask.device
        ids = torch.tensor([[r.out[-1]] for r in self.rows], dtype=torch.long, device=dev)
        pos = torch.tensor([[r.position] for r in self.rows], dtype=torch.long, device=dev)
        self.mask = torch.cat([self.mask, torch.ones(len(self.rows), 1, dtype=torch.long, device=dev)], dim=1)
        return dict(input_ids=ids, position_ids=pos, attention_mask=self.mask, cache=self.cache,
                    use_cache=True)


class Engine(Renderer):
    """The model over a Renderer, and the scheduler thread that decodes the
    running requests (up to max_batch) as one batch (docs/serve.md §5)."""

    generates = True

    def __init__(self, model_dir: str, served_name: Optional[str] = None, seed: int = 0, max_batch: int = 32,
                 device: str = "cpu", max_model_len: Optional[int] = None,
                 demonstrations: Optional[str] = None, demonstration_marker: str = "<|im_start|>assistant",
                 dtype: str = "float32"):
        super().__init__(model_dir, served_name, max_model_len)
        if dtype not in ("float32", "float64"):
            raise ValueError(f"dtype {dtype!r}: want float32 or float64")
        self.dtype = getattr(torch, dtype)
        self.demos = Demonstrations(demonstrations, self.tokenizer, demonstration_marker) if demonstrations else None
        self.device = torch.device(device)
        if self.device.type == "cuda":  # float32 logits, no TF32 rounding (docs/serve.md §4)
            torch.backends.cuda.matmul.allow_tf32 = False
            torch.backends.cudnn.allow_tf32 = False
        self.model = self._load(self.model_dir)
        self.eos_ids = self._eos_ids(self.model_dir)
        self.max_batch = max(1, max_batch)
        self.widest = 0  # the most rows one decode forward has run (tests, benchmarks)
        self.batching = True  # off for a model whose cache cannot be batched (batchable)
        self.server_seed = seed
        self._seeds = torch.Generator().manual_seed(seed)
        self._seed_lock = threading.Lock()
        self.model_lock = threading.Lock()  # one forward or one reload at a time
        self.pause_cv = threading.Condition()
        self.paused = False
        self.pause_mode = "abort"
        self.running = 0  # jobs the worker has admitted and not finished
        self.queue: "queue.Queue[Optional[Job]]" = queue.Queue()
        self._stopping = False  # a None job was queued: finish the running rows, then stop
        self.worker = threading.Thread(target=self._work, name="kiln-serve-worker", daemon=True)
        self.worker.start()

    # -- loading

    def _load(self, path: str):
        from transformers import AutoModelForCausalLM

        m = AutoModelForCausalLM.from_pretrained(path, dtype=self.dtype).to(self.device)
        m.eval()
        return m

    def _eos_ids(self, path: str) -> list[int]:
        ids = set()
        if self.tokenizer.eos_token_id is not None:
            ids.add(int(self.tokenizer.eos_token_id))
        gc = Path(path) / "generation_config.json"
        if gc.is_file():
            e = json.loads(gc.read_text()).get("eos_token_id")
            for i in e if isinstance(e, list) else [e]:
                if isinstance(i, int):
                    ids.add(i)
        return sorted(ids)

    @property
    def vocab_size(self) -> int:
        """The served model's (a reload may change it), at least the tokenizer's."""
        return max(len(self.tokenizer), int(self.model.config.vocab_size))

    def reload(self, path: str, version: Optional[int] = None) -> int:
        """Loads a new checkpoint directory (HF layout) in place of the served
        weights; the next version unless given (docs/serve.md §6)."""
        p = Path(path)
        if not p.is_dir():
            raise bad(f"reload_weights: weights_path {path!r} is not a directory")
        try:
            check_model_dir(p)
        except FileNotFoundError as ex:
            raise bad(f"reload_weights: {ex}")
        new = self._load(str(p))
        with self.model_lock:
            self.model = new
            self.weights_path = str(p)
            self.weight_version = int(version) if version is not None else self.weight_version + 1
            return self.weight_version

    def set_weight_version(self, version: int) -> int:
        """Sets the weights version the server reports, as vLLM's RL router's
        /update_weight_version (docs/serve.md §6); the weights are unchanged.
        Under the model lock: a token's forward and its reported version
        stay consistent."""
        with self.model_lock:
            self.weight_version = int(version)
            return self.weight_version

    def next_seed(self) -> int:
        with self._seed_lock:
            return int(torch.randint(0, 2**62, (1,), generator=self._seeds).item())

    # -- pause / resume (docs/serve.md §6)

    def pause(self, mode: str) -> None:
        with self.pause_cv:
            self.paused = True
            self.pause_mode = mode
            self.pause_cv.notify_all()
            if mode == "wait":
                while self.running:
                    self.pause_cv.wait()

    def resume(self) -> None:
        with self.pause_cv:
            self.paused = False
            self.pause_cv.notify_all()

    # -- the worker: one scheduler thread owns the model (docs/serve.md §5)

    def submit(self, job: Job) -> dict:
        self.queue.put(job)
        job.done.wait()
        if job.error is not None:
            raise job.error
        return job.result

    def _admit(self, busy: int) -> Optional[list[Job]]:
        """Takes queued jobs while the batch has room: waits for one when
        nothing runs, never while something does. Nothing is admitted while
        paused: with nothing running, a taken job waits for resume (all
        modes); with rows running, the queue is left alone, so a pause wait
        sees them finish. None: the worker is told to stop (a None job)."""
        jobs: list[Job] = []
        while busy + len(jobs) < self.max_batch:
            with self.pause_cv:
                if busy + len(jobs) > 0:
                    if self.paused:
                        break
                    try:
                        job = self.queue.get_nowait()
                    except queue.Empty:
                        break
                    if job is None:
                        self._stopping = True
                        break
                    self.running += 1
                    jobs.append(job)
                    continue
            job = self.queue.get()
            if job is None:
                return None
            with self.pause_cv:
                while self.paused:
                    self.pause_cv.wait()
                self.running += 1
            jobs.append(job)
        return jobs

    def _finish(self, seqs: list[Seq], error: Optional[BaseException] = None) -> None:
        for q in seqs:
            if error is not None:
                q.job.error = error
            else:
                q.job.result = q.result()
            with self.pause_cv:
                self.running -= 1
                self.pause_cv.notify_all()
            q.job.done.set()

    def _pause_point(self) -> bool:
        """At a step boundary: True to abort the running rows (pause mode
        abort); blocks while paused in mode keep; continues in mode wait."""
        with self.pause_cv:
            if not self.paused:
                return False
            if self.pause_mode == "abort":
                return True
            if self.pause_mode == "keep":
                while self.paused:
                    self.pause_cv.wait()
            return False

    def _work(self) -> None:
        b = Batch()
        while True:
            if b.rows and self._pause_point():
                for q in b.rows:
                    q.finish = "abort"
                self._finish(b.rows)
                b = Batch()
            if self._stopping and not b.rows:
                return
            jobs = [] if self._stopping or not self.batching and b.rows else self._admit(len(b))
            if jobs is None:
                return
            for job in jobs:
                seq = Seq(job, self.eos_ids)
                try:
                    if self.demos is not None:
                        seq.forced = self.demos.tokens(job.prompt)
                    cache = self._prefill(seq)
                    if seq.finish is None:
                        if not batchable(cache):
                            self.batching = False
                        b.join(seq, cache)
                except BaseException as e:  # answered to the request's thread
                    self._finish([seq], e)
                    continue
                if seq.finish is not None:
                    self._finish([seq])
            if not b.rows:
                continue
            try:
                self._decode(b)
            except BaseException as e:
                self._finish(b.rows, e)
                b = Batch()
                continue
            done = [q for q in b.rows if q.finish is not None]
            b.drop(done)
            self._finish(done)

    @torch.no_grad()
    def _prefill(self, seq: Seq):
        """The request's prompt alone, one forward; emits its first token.
        Returns the prompt's KV cache."""
        ids = torch.tensor([seq.job.prompt], dtype=torch.long, device=self.device)
        with self.model_lock:
            version = self.weight_version
            o = self.model(input_ids=ids, use_cache=True, logits_to_keep=1)
        self._emit([seq], o.logits[:, -1].cpu(), version)  # sampling on the CPU generators (§3)
        return o.cache

    @torch.no_grad()
    def _decode(self, b: Batch) -> None:
        """One batched forward: every row's next token."""
        kw = b.step_inputs()
        self.widest = max(self.widest, len(b))
        with self.model_lock:
            version = self.weight_version
            o = self.model(**kw)
        b.cache = o.cache
        self._emit(b.rows, o.logits[:, -1].cpu(), version)

    def _emit(self, seqs: list[Seq], logits: torch.Tensor, version: int) -> None:
        """Each row's next token from its logits [B, V]: processed logprobs
        and the race for all rows at once (§3, §4)."""
        logp = processed_logprobs(logits, torch.tensor([q.temperature for q in seqs], dtype=torch.float64))
        chosen = choose_rows(logp, [q.step for q in seqs], [q.banned() for q in seqs])
        for i, (q, (tok, nuc)) in enumerate(zip(seqs, chosen)):
            if q.forced is not None:  # the demonstration's token, the model's logprobs (§11)
                tok, nuc = q.forced[len(q.out)], None
            q.emit(logp[i], tok, nuc, version, self.tokenizer)


# ------------------------------------------------------------------ limits


class Limits:
    """What the server accepts from its clients (docs/serve.md §10): vLLM's
    max_logprobs, a body size, a connection count, the time a request may
    take to arrive, whether a request may bring its own chat template, and
    the API key every route but /health needs (None: no key)."""

    def __init__(self, max_logprobs: int = 20, max_body_bytes: int = 8 << 20, max_connections: int = 128,
                 request_timeout: float = 30.0, allow_request_chat_template: bool = False,
                 api_key: Optional[str] = None):
        self.max_logprobs = max_logprobs
        self.max_body_bytes = max_body_bytes
        self.max_connections = max_connections
        self.request_timeout = request_timeout
        self.allow_request_chat_template = allow_request_chat_template
        self.api_key = api_key or None


class Deadlines:
    """One reaper thread that shuts down the connection of each handler
    whose request has not fully arrived by its deadline: a client sending
    partial headers, a slow body or nothing at all (an idle keep-alive)
    holds its connection slot for at most the timeout. The deadline covers
    the request only; generating and answering are not timed here."""

    def __init__(self, timeout: float):
        self.timeout = timeout
        self.lock = threading.Lock()
        self.due: dict = {}  # handler -> time.monotonic() deadline
        threading.Thread(target=self._reap, name="kiln-serve-reaper", daemon=True).start()

    def arm(self, handler) -> None:
        with self.lock:
            self.due[handler] = time.monotonic() + self.timeout

    def disarm(self, handler) -> bool:
        """False when the handler's deadline passed: its socket is shut
        down and the request must not be acted on."""
        with self.lock:
            return self.due.pop(handler, None) is not None

    def _reap(self) -> None:
        tick = min(1.0, max(0.02, self.timeout / 4))
        while True:
            time.sleep(tick)
            now = time.monotonic()
            with self.lock:
                late = [h for h, d in self.due.items() if d <= now]
                for h in late:
                    del self.due[h]
            for h in late:
                try:
                    h.connection.shutdown(socket.SHUT_RDWR)  # the blocked read returns EOF
                except OSError:
                    pass


class BoundedHTTPServer(ThreadingHTTPServer):
    """A thread per connection, at most limits.max_connections of them: a
    connection beyond is answered 503 and closed from the accepting thread,
    with no thread of its own."""

    daemon_threads = True
    block_on_close = False  # a stalled client never blocks shutdown
    request_queue_size = 128  # the listen backlog (socketserver's 5 drops bursts of connects)

    def __init__(self, addr, handler, limits: Limits):
        self.limits = limits
        self.slots = threading.BoundedSemaphore(limits.max_connections)
        self.deadlines = Deadlines(limits.request_timeout)
        super().__init__(addr, handler)

    def process_request(self, request, client_address):
        if not self.slots.acquire(blocking=False):
            self._refuse(request)
            return
        try:
            super().process_request(request, client_address)
        except BaseException:
            self.slots.release()
            self.shutdown_request(request)
            raise

    def process_request_thread(self, request, client_address):
        try:
            super().process_request_thread(request, client_address)
        finally:
            self.slots.release()

    def _refuse(self, request) -> None:
        msg = (f"kiln_gpu.serve has {self.limits.max_connections} connections open (--max-connections); "
               "retry later")
        body = json.dumps({"error": {"message": msg, "type": "ServiceUnavailableError", "param": None,
                                     "code": 503}}).encode()
        head = (f"HTTP/1.1 503 Service Unavailable\r\nContent-Type: application/json\r\n"
                f"Content-Length: {len(body)}\r\nConnection: close\r\n\r\n").encode()
        try:
            request.setblocking(False)  # a fresh socket's send buffer takes it; never wait on the client
            request.send(head + body)
        except OSError:
            pass
        self.shutdown_request(request)


# ------------------------------------------------------------------ server


def _ids(v: Any, what: str) -> list[int]:
    if not isinstance(v, list) or not v and what != "tokens":
        raise bad(f"{what} must be a non-empty list of token ids")
    for i, t in enumerate(v):
        if isinstance(t, bool) or not isinstance(t, int) or t < 0:
            raise bad(f"{what}[{i}] = {t!r} is not a non-negative token id")
    return v


def _messages_for_template(msgs: Any) -> list:
    """vLLM parses assistant tool_calls' JSON-string arguments into objects
    before rendering (docs/serve.md §7); the same here."""
    if not isinstance(msgs, list) or not msgs:
        raise bad("messages must be a non-empty list")
    out = []
    for m in msgs:
        if not isinstance(m, dict):
            raise bad("each message must be an object")
        m = dict(m)
        if m.get("reasoning") is not None and m.get("reasoning_content") is None:
            m["reasoning_content"] = m["reasoning"]  # vLLM's alias
        if isinstance(m.get("content"), list):  # --chat-template-content-format string
            m["content"] = "\n".join(p.get("text", "") for p in m["content"] if isinstance(p, dict) and p.get("type") == "text")
        if isinstance(m.get("tool_calls"), list):
            calls = []
            for c in m["tool_calls"]:
                c = dict(c)
                if isinstance(c.get("function"), dict):
                    f = dict(c["function"])
                    if isinstance(f.get("arguments"), str):
                        try:
                            f["arguments"] = json.loads(f["arguments"]) if f["arguments"].strip() else {}
                        except ValueError:
                            pass
                    c["function"] = f
                calls.append(c)
            if calls:
                m["tool_calls"] = calls
            else:
                del m["tool_calls"]  # vLLM drops an empty list
        out.append(m)
    return out


def _tools_for_template(tools: Any) -> Optional[list]:
    """Tools as vLLM's request model dumps them (docs/serve.md §7):
    {"type", "function": {"name", "description", "parameters", extras}},
    a missing description or parameters as null."""
    if tools is None:
        return None
    if not isinstance(tools, list):
        raise bad("tools must be a list")
    out = []
    for i, t in enumerate(tools):
        if not isinstance(t, dict) or not isinstance(t.get("function"), dict) or not isinstance(t["function"].get("name"), str):
            raise bad(f"tools[{i}] must be {{type: function, function: {{name, ...}}}}")
        f = t["function"]
        fn = {"name": f["name"], "description": f.get("description"), "parameters": f.get("parameters")}
        fn.update({k: v for k, v in f.items() if k not in fn})
        nt = {"type": t.get("type", "function"), "function": fn}
        nt.update({k: v for k, v in t.items() if k not in nt})
        out.append(nt)
    return out


# The routes that need the model: --tokenizer-only answers them 503
# (docs/serve.md §9).
GENERATION_ROUTES = ("/inference/v1/generate", "/v1/completions", "/pause", "/resume", "/collective_rpc",
                     "/update_weight_version")


class Server:
    """The routes over an Engine, or over a Renderer alone (--tokenizer-only:
    the GETs, /tokenize and /detokenize; docs/serve.md §2, §9)."""

    def __init__(self, engine: Renderer, limits: Optional[Limits] = None):
        self.e = engine
        self.limits = limits or Limits()

    def check_route(self, path: str) -> None:
        """503 for a generation route when no model is loaded."""
        if not self.e.generates and path in GENERATION_ROUTES:
            raise APIError(503, TOKENIZER_ONLY.format(route=f"POST {path}"), "ServiceUnavailableError")

    def check_model(self, body: dict) -> None:
        m = body.get("model")
        if m not in (None, "") and m != self.e.served_name:
            raise APIError(404, f"The model `{m}` does not exist.", "NotFoundError")

    def models(self) -> dict:
        e = self.e
        return {
            "object": "list",
            "data": [{
                "id": e.served_name, "object": "model", "created": int(time.time()), "owned_by": "kiln",
                "root": e.model_dir, "parent": None, "max_model_len": e.max_model_len,
                "weight_version": e.weight_version, "weights_path": e.weights_path,
            }],
        }

    def tokenize(self, body: dict) -> dict:
        self.check_model(body)
        tok = self.e.tokenizer
        if "messages" in body:
            kw = body.get("chat_template_kwargs") or {}
            if not isinstance(kw, dict):
                raise bad("chat_template_kwargs must be an object")
            tools = _tools_for_template(body.get("tools"))
            if (body.get("chat_template") or kw.get("chat_template")) and not self.limits.allow_request_chat_template:
                # vLLM's refusal (--trust-request-chat-template): a template
                # is code the server runs, e.g. {{ "x" * 6000000000 }}
                raise bad("Chat template is passed with request, but --allow-request-chat-template is not set. "
                          "Refused request with untrusted chat template.")
            args = dict(kw)
            if body.get("chat_template"):
                args["chat_template"] = body["chat_template"]
            try:
                text = tok.apply_chat_template(
                    _messages_for_template(body["messages"]), tools=tools, tokenize=False,
                    add_generation_prompt=bool(body.get("add_generation_prompt", True)),
                    continue_final_message=bool(body.get("continue_final_message", False)), **args,
                )
            except APIError:
                raise
            except Exception as ex:  # a template error is the request's fault
                raise bad(f"chat template: {ex}")
            add_special = bool(body.get("add_special_tokens", False))
        elif "prompt" in body:
            text = body["prompt"]
            if not isinstance(text, str):
                raise bad("prompt must be a string")
            add_special = bool(body.get("add_special_tokens", True))
        else:
            raise bad("either prompt or messages is required")
        ids = tok.encode(text, add_special_tokens=add_special)
        return {"count": len(ids), "max_model_len": self.e.max_model_len, "tokens": ids, "token_strs": None}

    def detokenize(self, body: dict) -> dict:
        self.check_model(body)
        ids = _ids(body.get("tokens"), "tokens")
        vocab = self.e.vocab_size
        for i, t in enumerate(ids):
            if t >= vocab:
                raise bad(f"tokens[{i}] = {t} is out of vocabulary")
        return {"prompt": self.e.tokenizer.decode(ids, skip_special_tokens=False)}

    def _run(self, body: dict, prompt: list[int], sp: dict) -> tuple[Sampling, dict]:
        vocab = self.e.model.config.vocab_size
        for i, t in enumerate(prompt):
            if t >= vocab:
                raise bad(f"Token id {t} is out of vocabulary (prompt[{i}])")
        s = Sampling(sp, self.e.max_model_len, len(prompt), self.limits.max_logprobs)
        rid = body.get("request_id")
        if s.seed is not None:
            seed = s.seed
        elif isinstance(rid, str) and rid:
            seed = request_seed(self.e.server_seed, rid)
        else:
            seed = self.e.next_seed()  # arrival order: reproducible only one at a time (§3)
        return s, self.e.submit(Job(prompt, s, seed))

    def generate(self, body: dict) -> tuple[dict, int]:
        self.check_model(body)
        prompt = _ids(body.get("token_ids"), "token_ids")
        s, r = self._run(body, prompt, body.get("sampling_params") or {})
        content = []
        for i, (t, lp) in enumerate(zip(r["out"], r["lps"])):
            ent = {"token_id": t, "token": f"token_id:{t}", "logprob": lp}
            if s.logprobs > 0:
                ent["top_logprobs"] = [{"token_id": a, "token": f"token_id:{a}", "logprob": b} for a, b in r["tops"][i]]
            content.append(ent)
        choice = {
            "index": 0, "token_ids": r["out"], "logprobs": {"content": content},
            "finish_reason": r["finish"], "stop_reason": r["stop_reason"],
            "sampling_mask": r["masks"] if s.return_sampling_mask else None,
            "weight_versions": r["versions"],
        }
        if s.return_sampling_mask_logprobs:
            choice["sampling_mask_logprobs"] = r["mask_lps"]
        rid = body.get("request_id") or uuid.uuid4().hex
        return {
            "request_id": f"generate-tokens-{rid}", "model": self.e.served_name, "created": int(time.time()),
            "output_mode": "token_ids", "prompt_token_ids": prompt, "choices": [choice],
            "usage": {"prompt_tokens": len(prompt), "completion_tokens": len(r["out"]),
                      "total_tokens": len(prompt) + len(r["out"]), "prompt_tokens_details": None},
            "weight_version": r["version"],
        }, r["version"]

    def completions(self, body: dict) -> tuple[dict, int]:
        self.check_model(body)
        prompt = body.get("prompt")
        if isinstance(prompt, list) and len(prompt) == 1 and isinstance(prompt[0], list):
            prompt = prompt[0]
        if not isinstance(prompt, list):
            raise bad("kiln_gpu.serve's /v1/completions takes a token-id prompt (a list of ids)")
        prompt = _ids(prompt, "prompt")
        sp = dict(body)
        if "logprobs" not in sp or sp["logprobs"] is None:
            sp["logprobs"] = 0
        s, r = self._run(body, prompt, sp)
        label = (lambda t: f"token_id:{t}") if body.get("return_tokens_as_token_ids") else self.e.tokenizer.convert_ids_to_tokens
        choice = {
            "index": 0, "text": self.e.tokenizer.decode(r["out"]),
            "logprobs": {
                "tokens": [label(t) for t in r["out"]], "token_logprobs": r["lps"],
                "top_logprobs": [{label(a): b for a, b in row} for row in r["tops"]] if s.logprobs > 0 else None,
                "text_offset": [],
            },
            "finish_reason": r["finish"], "stop_reason": r["stop_reason"],
        }
        if body.get("return_token_ids"):
            choice["token_ids"] = r["out"]
            choice["prompt_token_ids"] = prompt
        return {
            "id": f"cmpl-{uuid.uuid4().hex}", "object": "text_completion", "created": int(time.time()),
            "model": self.e.served_name, "choices": [choice],
            "usage": {"prompt_tokens": len(prompt), "completion_tokens": len(r["out"]),
                      "total_tokens": len(prompt) + len(r["out"])},
        }, r["version"]

    def collective_rpc(self, body: dict) -> dict:
        method = body.get("method")
        kw = body.get("kwargs") or {}
        if method != "reload_weights":
            raise bad(f"collective_rpc: method {method!r} is not supported by kiln_gpu.serve (only reload_weights)")
        if not isinstance(kw, dict) or not isinstance(kw.get("weights_path"), str):
            raise bad("collective_rpc reload_weights needs kwargs.weights_path (a checkpoint directory)")
        v = kw.get("weight_version", kw.get("target_version"))
        if v is not None and (isinstance(v, bool) or not isinstance(v, int)):
            raise bad("kwargs.weight_version must be an integer")
        try:
            ver = self.e.reload(kw["weights_path"], v)
        except APIError:
            raise
        except Exception as ex:
            raise APIError(500, f"reload_weights from {kw['weights_path']!r} failed: {ex}", "InternalServerError")
        return {"results": [None], "weight_version": ver}

    def update_weight_version(self, body: dict) -> dict:
        """vLLM's RL router's POST /update_weight_version {"new_version": str}
        (docs/sync.md §3): this server's versions are integers, so the value
        must be one (as a string or a JSON integer); anything else is 400 and
        the version is unchanged (docs/serve.md §6)."""
        v = body.get("new_version")
        if isinstance(v, str) and v.strip().lstrip("+-").isdigit() and v.strip().isascii():
            n = int(v.strip())
        elif isinstance(v, int) and not isinstance(v, bool):
            n = v
        else:
            raise bad(f"update_weight_version: new_version must be an integer weights version, got {v!r}")
        return {"weight_version": self.e.set_weight_version(n)}


def make_handler(srv: Server):
    lim = srv.limits
    key = None if lim.api_key is None else lim.api_key.encode()

    class Handler(BaseHTTPRequestHandler):
        protocol_version = "HTTP/1.1"
        timeout = lim.request_timeout  # each socket read and write (StreamRequestHandler.setup)

        def log_message(self, fmt, *args):  # quiet: kiln reads stdout/stderr
            pass

        def handle_one_request(self):
            """One request, its arrival (request line, headers, body) timed
            by the server's Deadlines; a keep-alive's wait for its next
            request too."""
            self.server.deadlines.arm(self)
            try:
                super().handle_one_request()
            finally:
                self.server.deadlines.disarm(self)

        def _arrived(self) -> bool:
            """Stops the request's clock; False (drop it, act on nothing)
            when it ran out: headers cut short by the reaper look complete."""
            if self.server.deadlines.disarm(self):
                return True
            self.close_connection = True
            return False

        def _send(self, status: int, obj: Any, version: Optional[int] = None) -> None:
            data = b"" if obj is None else json.dumps(obj).encode()
            self.send_response(status)
            self.send_header("Content-Type", "application/json")
            self.send_header("Content-Length", str(len(data)))
            self.send_header("x-kiln-weight-version", str(srv.e.weight_version if version is None else version))
            if self.close_connection:
                self.send_header("Connection", "close")
            self.end_headers()
            self.wfile.write(data)

        def _error(self, e: APIError) -> None:
            self._send(e.status, {"error": {"message": e.message, "type": e.typ, "param": None, "code": e.status}})

        def _authorized(self, path: str) -> bool:
            """--api-key: every route but /health needs "Authorization:
            Bearer KEY"; else 401 as vLLM answers it, the body unread and
            the connection closed."""
            if key is None or path == "/health":
                return True
            got = (self.headers.get("Authorization") or "").encode()
            if hmac.compare_digest(got, b"Bearer " + key):
                return True
            self.close_connection = True
            self._send(401, {"error": "Unauthorized"})
            return False

        def _content_length(self) -> int:
            """The body's length from its headers, checked before a byte of
            it is read: chunked is 411, a malformed length 400, one over
            --max-body-bytes 413. Each closes the connection (the body's
            end is unknown or unread)."""
            keep, self.close_connection = self.close_connection, True
            if self.headers.get("Transfer-Encoding"):
                raise APIError(411, "kiln_gpu.serve needs a Content-Length (no Transfer-Encoding)", "LengthRequired")
            vals = self.headers.get_all("Content-Length") or ["0"]
            v = vals[0].strip()
            if len(set(x.strip() for x in vals)) != 1 or not (v.isascii() and v.isdigit()):
                raise bad(f"Content-Length {', '.join(vals)!r} is not a non-negative integer")
            n = int(v)
            if n > lim.max_body_bytes:
                raise APIError(413, f"request body of {n} bytes is over the server's limit of {lim.max_body_bytes} "
                                    "(--max-body-bytes)", "RequestEntityTooLarge")
            self.close_connection = keep
            return n

        def _body(self, path: str) -> Optional[dict]:
            """The JSON body, or None when the client was dropped."""
            n = self._content_length()
            try:
                raw = self.rfile.read(n) if n else b""
            except OSError:  # a read timed out (--request-timeout) or the connection broke
                raw = b""
            if len(raw) < n:  # the client closed, timed out, or its deadline shut the socket
                self.close_connection = True
                return None
            if not self._arrived():
                return None
            srv.check_route(path)
            try:
                body = json.loads(raw or b"{}")
            except ValueError as ex:
                raise bad(f"request body is not JSON: {ex}")
            if not isinstance(body, dict):
                raise bad("request body must be a JSON object")
            return body

        def do_GET(self):
            path = urlparse(self.path).path
            if not self._arrived() or not self._authorized(path):
                return
            if self.headers.get("Content-Length", "0").strip() != "0" or self.headers.get("Transfer-Encoding"):
                self.close_connection = True  # a GET's body is never read
            if path == "/health":
                return self._send(200, None)
            if path == "/version":
                return self._send(200, {"version": VERSION})
            if path == "/v1/models":
                return self._send(200, srv.models())
            if path == "/is_paused":
                return self._send(200, {"is_paused": srv.e.paused})
            if path == "/weight_info":  # vLLM's RL router (docs/serve.md §6)
                return self._send(200, {"weight_version": srv.e.weight_version})
            self._send(404, {"detail": "Not Found"})

        def do_POST(self):
            u = urlparse(self.path)
            try:
                if not self._authorized(u.path):
                    return
                body = self._body(u.path)
                if body is None:
                    return
                if u.path == "/tokenize":
                    return self._send(200, srv.tokenize(body))
                if u.path == "/detokenize":
                    return self._send(200, srv.detokenize(body))
                if u.path == "/inference/v1/generate":
                    r, v = srv.generate(body)
                    return self._send(200, r, v)
                if u.path == "/v1/completions":
                    r, v = srv.completions(body)
                    return self._send(200, r, v)
                if u.path == "/pause":
                    mode = (parse_qs(u.query).get("mode") or [body.get("mode") or "abort"])[0]
                    if mode not in ("abort", "wait", "keep"):
                        raise bad(f"pause mode {mode!r}: want abort, wait or keep")
                    srv.e.pause(mode)
                    return self._send(200, {})
                if u.path == "/resume":
                    srv.e.resume()
                    return self._send(200, {})
                if u.path == "/collective_rpc":
                    return self._send(200, srv.collective_rpc(body))
                if u.path == "/reset_prefix_cache":
                    # No cache outlives a request here (docs/serve.md §6), so
                    # vLLM's reset is answered as done: kiln-sync reload
                    # --flush works against this server as against vLLM.
                    return self._send(200, {})
                if u.path == "/update_weight_version":
                    r = srv.update_weight_version(body)
                    return self._send(200, r, r["weight_version"])
                self._send(404, {"detail": "Not Found"})
            except APIError as e:
                self._error(e)
            except Exception as ex:  # never a traceback on the wire
                self._error(APIError(500, f"{type(ex).__name__}: {ex}", "InternalServerError"))

    return Handler


def serve(engine: Renderer, host: str = "127.0.0.1", port: int = 0,
          limits: Optional[Limits] = None) -> ThreadingHTTPServer:
    """A started-not-serving HTTP server over engine, an Engine or (for
    --tokenizer-only) a Renderer, within limits (default Limits()); call
    serve_forever."""
    limits = limits or Limits()
    return BoundedHTTPServer((host, port), make_handler(Server(engine, limits)), limits)


EXAMPLES = """examples:
  # the policy server on a checkpoint, on a free port written to a file
  python -m kiln_gpu.serve --model ckpt/ --port 0 --port-file port --served-model-name policy
  # the renderer of a replay, with no GPU and no weights loaded (docs/serve.md §9):
  # the recorded checkpoint's tokenizer, chat template and context length
  python -m kiln_gpu.serve --model ckpt/ --tokenizer-only --port 8001 &
  kiln-rollout run --engine replay://rollout/r1/turns@V --replay-renderer http://127.0.0.1:8001 ...
"""


def main(argv=None) -> int:
    p = argparse.ArgumentParser(
        prog="python -m kiln_gpu.serve", description=__doc__.split("\n\n")[0],
        formatter_class=argparse.RawDescriptionHelpFormatter, epilog=EXAMPLES)
    p.add_argument("--model", required=True, help="Hugging Face checkpoint directory")
    p.add_argument("--host", default="127.0.0.1")
    p.add_argument("--port", type=int, default=8000, help="0 picks a free port (see --port-file)")
    p.add_argument("--port-file", help="write the bound port here (tmp + rename) once serving")
    p.add_argument("--seed", type=int, default=0, help="seeds the per-request seeds of requests without one")
    p.add_argument("--max-batch", type=int, default=32,
                   help="the most requests decoded together, one forward per token (docs/serve.md §5)")
    p.add_argument("--served-model-name", help="the model name /v1/models reports (default: --model)")
    p.add_argument("--device", default="cpu", help="torch device, e.g. cuda (docs/serve.md §1)")
    p.add_argument("--dtype", default="float32", choices=("float32", "float64"),
                   help="the weights' and logits' dtype whatever the checkpoint's: float64 for an on-policy "
                        "identity far below 1e-5, with kiln-train --dtype float64 (docs/serve.md §4)")
    p.add_argument("--max-model-len", type=int,
                   help="the context length /v1/models and /tokenize report and requests are checked against "
                        "(default: config.json's max_position_embeddings)")
    p.add_argument("--tokenizer-only", action="store_true",
                   help="load the tokenizer and config.json only, never the weights: serve GET /health, /version, "
                        "/v1/models, /is_paused, POST /tokenize, /detokenize as the full server does and answer "
                        "every generation route 503; the no-GPU renderer of a replay "
                        "(kiln-rollout run --replay-renderer; docs/serve.md §9)")
    p.add_argument("--api-key", default=os.environ.get("KILN_ENGINE_API_KEY") or None,
                   help="every route but /health needs 'Authorization: Bearer KEY', else 401 (default "
                        "$KILN_ENGINE_API_KEY, which kiln-sync and kiln-rollout send too; the environment keeps the "
                        "key out of ps, where an argument is visible to every local user)")
    p.add_argument("--max-logprobs", type=int, default=20,
                   help="the most top logprobs a request may ask for (vLLM's default 20); more is 400")
    p.add_argument("--max-body-bytes", type=int, default=8 << 20,
                   help="the largest request body; a larger Content-Length is 413, never read (default 8 MiB)")
    p.add_argument("--max-connections", type=int, default=128,
                   help="connections served at once, a thread each; one beyond is answered 503 and closed")
    p.add_argument("--request-timeout", type=float, default=30.0,
                   help="seconds a request (request line, headers, body) or an idle keep-alive may take to "
                        "arrive before its connection is dropped; each socket read and write is bounded by it too")
    p.add_argument("--allow-request-chat-template", "--trust-request-chat-template", action="store_true",
                   help="let /tokenize requests bring their own chat_template (code the server runs); without it "
                        "they are 400, as vLLM without --trust-request-chat-template")
    p.add_argument("--demonstrations", metavar="FILE",
                   help="forced decoding (docs/serve.md §11): a JSONL file of {match, turns}; every generation "
                        "returns the tokens of the turn of the one demonstration whose match occurs in the prompt "
                        "(turn n after n assistant turns), each with the model's own logprob, instead of sampling "
                        "(a supervised warm start's demonstrations, recorded through the usual rollout path)")
    p.add_argument("--demonstration-marker", default="<|im_start|>assistant",
                   help="the text that starts an assistant turn in the rendered prompt (default: Qwen3's)")
    a = p.parse_args(argv)
    if a.demonstrations and a.tokenizer_only:
        print("kiln_gpu.serve: --demonstrations needs the model (it reports the model's logprobs); "
              "drop --tokenizer-only", file=sys.stderr)
        return 2
    if a.max_model_len is not None and a.max_model_len < 1:
        print(f"kiln_gpu.serve: --max-model-len {a.max_model_len}: want a positive number of tokens", file=sys.stderr)
        return 2
    if a.max_logprobs < 0:
        print(f"kiln_gpu.serve: --max-logprobs {a.max_logprobs}: want 0 or more", file=sys.stderr)
        return 2
    for flag, v in (("--max-body-bytes", a.max_body_bytes), ("--max-connections", a.max_connections),
                    ("--request-timeout", a.request_timeout)):
        if not v > 0:
            print(f"kiln_gpu.serve: {flag} {v}: want a positive number", file=sys.stderr)
            return 2
    limits = Limits(a.max_logprobs, a.max_body_bytes, a.max_connections, a.request_timeout,
                    a.allow_request_chat_template, a.api_key)
    torch.manual_seed(a.seed)
    try:
        if a.tokenizer_only:
            eng = Renderer(a.model, a.served_model_name, a.max_model_len)
        else:
            eng = Engine(a.model, a.served_model_name, a.seed, a.max_batch, a.device, a.max_model_len,
                         a.demonstrations, a.demonstration_marker, a.dtype)
    except (FileNotFoundError, ValueError) as ex:
        print(f"kiln_gpu.serve: {ex}", file=sys.stderr)
        return 2
    httpd = serve(eng, a.host, a.port, limits)
    port = httpd.server_address[1]
    if a.port_file:
        tmp = a.port_file + ".tmp"
        with open(tmp, "w") as f:
            f.write(f"{port}\n")
        os.replace(tmp, a.port_file)
    mode = " (--tokenizer-only: renders and decodes, never generates)" if a.tokenizer_only else ""
    if getattr(eng, "demos", None) is not None:
        mode += f" (--demonstrations: forced decoding of {len(eng.demos.demos)} demonstration(s))"
    if limits.api_key is not None:
        mode += " (--api-key: every route but /health needs the key)"
    print(f"kiln_gpu.serve: serving {eng.served_name} on http://{a.host}:{port}{mode}", flush=True)
    try:
        httpd.serve_forever()
    except KeyboardInterrupt:
        pass
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
