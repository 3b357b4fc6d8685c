"""The tiny Qwen3 checkpoint loads through transformers' Auto classes and
renders conversations with the real Qwen3 chat template (docs/train.md §5)."""

import hashlib
import json

import pytest
import torch

from kiln_gpu.tiny import build

TOOLS = [
    {
        "type": "function",
        "function": {
            "name": "bash",
            "description": "Run a shell command",
            "parameters": {"type": "object", "properties": {"cmd": {"type": "string"}}, "required": ["cmd"]},
        },
    }
]

CONVERSATION = [
    {"role": "system", "content": "You are a coding agent."},
    {"role": "user", "content": "Fix the failing test."},
    {
        "role": "assistant",
        "content": "",
        "reasoning_content": "Look at the tests first.",
        "tool_calls": [
            {"type": "function", "function": {"name": "bash", "arguments": {"cmd": "ls"}}},
            {"type": "function", "function": {"name": "bash", "arguments": {"cmd": "cat test.py"}}},
        ],
    },
    {"role": "tool", "content": "test.py"},
    {"role": "tool", "content": "assert 1 == 2"},
    {"role": "assistant", "content": "The assertion is wrong.", "reasoning_content": "1 is not 2."},
]

RENDERED = (
    "<|im_start|>system\nYou are a coding agent.\n\n# Tools\n\nYou may call one or more functions to assist"
    " with the user query.\n\nYou are provided with function signatures within <tools></tools> XML tags:\n"
    '<tools>\n{"type": "function", "function": {"name": "bash", "description": "Run a shell command", '
    '"parameters": {"type": "object", "properties": {"cmd": {"type": "string"}}, "required": ["cmd"]}}}\n'
    "</tools>\n\nFor each function call, return a json object with function name and arguments within "
    '<tool_call></tool_call> XML tags:\n<tool_call>\n{"name": <function-name>, "arguments": '
    "<args-json-object>}\n</tool_call><|im_end|>\n"
    "<|im_start|>user\nFix the failing test.<|im_end|>\n"
    "<|im_start|>assistant\n<think>\nLook at the tests first.\n</think>\n\n"
    '<tool_call>\n{"name": "bash", "arguments": {"cmd": "ls"}}\n</tool_call>\n'
    '<tool_call>\n{"name": "bash", "arguments": {"cmd": "cat test.py"}}\n</tool_call><|im_end|>\n'
    "<|im_start|>user\n<tool_response>\ntest.py\n</tool_response>\n"
    "<tool_response>\nassert 1 == 2\n</tool_response><|im_end|>\n"
    "<|im_start|>assistant\n<think>\n1 is not 2.\n</think>\n\nThe assertion is wrong.<|im_end|>\n"
)


def test_layout(tiny_checkpoint):
    names = sorted(p.name for p in tiny_checkpoint.iterdir())
    assert names == [
        "config.json",
        "generation_config.json",
        "model.safetensors",
        "tokenizer.json",
        "tokenizer_config.json",
    ]
    cfg = json.loads((tiny_checkpoint / "config.json").read_text())
    assert cfg["model_type"] == "qwen3" and cfg["architectures"] == ["Qwen3ForCausalLM"]


def test_loads_with_auto_classes_and_runs(tiny_checkpoint):
    from transformers import AutoModelForCausalLM, AutoTokenizer

    model = AutoModelForCausalLM.from_pretrained(tiny_checkpoint, dtype=torch.float32)
    tok = AutoTokenizer.from_pretrained(tiny_checkpoint)
    assert type(model).__name__ == "Qwen3ForCausalLM"
    assert tok.convert_tokens_to_ids(["<|im_start|>", "<|im_end|>", "<think>", "<tool_call>"]) == [
        151644,
        151645,
        151667,
        151657,
    ]
    assert tok.eos_token == "<|im_end|>"
    ids = tok("def f(x):\n    return x", add_special_tokens=False)["input_ids"]
    assert tok.decode(ids) == "def f(x):\n    return x"
    with torch.no_grad():
        logits = model(torch.tensor([ids])).logits
    assert logits.shape == (1, len(ids), 151936)
    assert torch.isfinite(logits).all()


def test_same_seed_same_weights(tiny_checkpoint, qwen3_tokenizer_dir, tmp_path):
    again = build(tmp_path / "again", qwen3_tokenizer_dir, seed=0)
    other = build(tmp_path / "other", qwen3_tokenizer_dir, seed=1)
    digest = lambda p: hashlib.sha256((p / "model.safetensors").read_bytes()).hexdigest()  # noqa: E731
    assert digest(again) == digest(tiny_checkpoint)
    assert digest(other) != digest(tiny_checkpoint)


def test_end_rate_makes_turns_end(tiny_checkpoint, qwen3_tokenizer_dir, tmp_path):
    """--end-rate r: <|im_end|> is about r of the samples at T = 1 in any
    context (the on-policy identity test's multi-turn and CLI cases need
    turns that finish "stop"); the plain model all but never samples it."""
    from transformers import AutoModelForCausalLM

    ids = torch.randint(0, 151643, (8, 40), generator=torch.Generator().manual_seed(3))
    ids[:, 20] = 151645  # contexts after an <|im_end|> too

    def rate(path):
        m = AutoModelForCausalLM.from_pretrained(path)
        with torch.no_grad():
            return float(torch.softmax(m(input_ids=ids).logits, -1)[..., 151645].mean())

    ending = build(tmp_path / "ending", qwen3_tokenizer_dir, seed=0, end_rate=0.2)
    assert 0.1 < rate(ending) < 0.4
    assert rate(tiny_checkpoint) < 1e-3


def test_chat_template_tools_reasoning_tool_calls(tiny_checkpoint):
    from transformers import AutoTokenizer

    tok = AutoTokenizer.from_pretrained(tiny_checkpoint)
    text = tok.apply_chat_template(CONVERSATION, tools=TOOLS, tokenize=False)
    assert text == RENDERED
    # The prompt for the next turn ends with the assistant header.
    prompt = tok.apply_chat_template(CONVERSATION[:5], tools=TOOLS, tokenize=False, add_generation_prompt=True)
    assert prompt == RENDERED[: RENDERED.index("<think>\n1 is not 2.")]
    # enable_thinking=False (a chat_template_kwargs) renders an empty think block.
    plain = tok.apply_chat_template(
        CONVERSATION[:2], tokenize=False, add_generation_prompt=True, enable_thinking=False
    )
    assert plain.endswith("<|im_start|>assistant\n<think>\n\n</think>\n\n")
    # Reasoning of turns before the last user query is not rendered.
    later = CONVERSATION + [{"role": "user", "content": "Thanks."}]
    assert "Look at the tests first." not in tok.apply_chat_template(later, tools=TOOLS, tokenize=False)
    # The special tokens are single ids: encoding the text never splits them.
    ids = tok(text, add_special_tokens=False)["input_ids"]
    assert ids.count(151644) == text.count("<|im_start|>") == 5
    assert ids.count(151657) == text.count("<tool_call>") == 4  # 2 in the system prompt, 2 calls
    assert tok.decode(ids) == text


def test_token_logprobs_match_transformers_loss(tiny_checkpoint):
    """The shift of docs/train.md §2 is the one transformers' own causal-LM
    loss uses: its mean cross-entropy is minus the mean token logprob."""
    from transformers import AutoModelForCausalLM, AutoTokenizer

    from kiln_gpu.loss import token_logprobs

    model = AutoModelForCausalLM.from_pretrained(tiny_checkpoint, dtype=torch.float32)
    tok = AutoTokenizer.from_pretrained(tiny_checkpoint)
    text = tok.apply_chat_template(CONVERSATION, tools=TOOLS, tokenize=False)
    ids = torch.tensor([tok(text, add_special_tokens=False)["input_ids"]])
    with torch.no_grad():
        out = model(ids, labels=ids)
    lp = token_logprobs(out.logits, ids)
    assert lp.shape == (1, ids.shape[1] - 1)
    assert torch.allclose(-lp.mean(), out.loss, atol=1e-5)


def test_split_micro_batches_same_gradient_on_qwen3(tiny_checkpoint):
    """docs/train.md §4 on the real architecture in float64: a rollout's
    segments in one micro-batch or spread over two give the same gradient."""
    from test_loss import _segment, _step_grad
    from transformers import AutoModelForCausalLM

    from kiln_gpu.loss import LossConfig

    class Logits(torch.nn.Module):
        def __init__(self, m):
            super().__init__()
            self.m = m

        def forward(self, tokens):
            return self.m(tokens.unsqueeze(0)).logits[0]

    model = Logits(AutoModelForCausalLM.from_pretrained(tiny_checkpoint, dtype=torch.float64))
    g = torch.Generator().manual_seed(5)
    vocab = 151643
    r0 = [_segment(g, vocab, 5, 6, 0, 0.7), _segment(g, vocab, 4, 5, 0, 0.7)]
    r1 = [_segment(g, vocab, 3, 7, 1, -1.2)]
    cfg = LossConfig(correction="tis")
    one_loss, one = _step_grad(model, [r0 + r1], cfg)
    two_loss, two = _step_grad(model, [[r0[0], r1[0]], [r0[1]]], cfg)
    assert two_loss == pytest.approx(one_loss, abs=1e-12)
    diff = max(float((a - b).abs().max()) for a, b in zip(one, two))
    scale = max(float(a.abs().max()) for a in one)
    assert scale > 1e-6  # a real gradient (small: the weights are initialised at std 0.02)
    assert diff <= 1e-6 and diff <= 1e-9 * scale
