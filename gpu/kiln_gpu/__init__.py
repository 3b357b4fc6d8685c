"""kiln's PyTorch side: the loss core, the tiny Qwen3 checkpoint (docs/train.md)."""
