"""Named GPT shapes, their parameter counts and training FLOPs per token.

No torch import: ``trainer.settings.train_config`` validates a model name and the launch tools
estimate memory and throughput without loading torch. ``trainer.models.gpt`` builds the network from
these shapes; tests check that ``parameter_count`` equals the real model's count for every size.
"""

from __future__ import annotations

from dataclasses import dataclass


@dataclass(frozen=True)
class GPTSize:
    layers: int
    heads: int
    width: int  # the residual stream (d_model); each head gets width // heads
    context: int  # the longest sequence, in tokens (rows of the position embedding)

    def __post_init__(self) -> None:
        if min(self.layers, self.heads, self.width, self.context) < 1:
            raise ValueError(f"{self}: every dimension must be at least 1")
        if self.width % self.heads:
            raise ValueError(f"{self}: width {self.width} is not a multiple of heads {self.heads}")


GPT_SIZES: dict[str, GPTSize] = {
    # For tests and CPU demos: ~0.22M parameters with the 257-token byte vocabulary.
    "gpt-tiny": GPTSize(layers=4, heads=4, width=64, context=128),
    # GPT-2 small (Radford et al. 2019): 124M parameters with GPT-2's 50,257 tokens.
    "gpt-small": GPTSize(layers=12, heads=12, width=768, context=1024),
    # GPT-2 medium: 355M with 50,257 tokens (the GPT-2 paper lists it as 345M).
    "gpt-350m": GPTSize(layers=24, heads=16, width=1024, context=1024),
    # GPT-3 XL (Brown et al. 2020, table 2.1): 1.316B with 50,257 tokens.
    "gpt-1.3b": GPTSize(layers=24, heads=16, width=2048, context=2048),
}


def parameter_count(size: GPTSize, vocab_size: int) -> int:
    """Parameters of ``trainer.models.gpt.GPT`` for this shape, in closed form.

    Per block: two LayerNorms (2 * 2d), attention QKV (d * 3d + 3d) and output (d * d + d), MLP
    up (d * 4d + 4d) and down (4d * d + d): 12d^2 + 13d. Plus the token table (V * d, also the
    output layer: tied), the position table (T * d) and the final LayerNorm (2d)."""
    d = size.width
    return vocab_size * d + size.context * d + size.layers * (12 * d * d + 13 * d) + 2 * d


def flops_per_token(size: GPTSize, vocab_size: int) -> int:
    """Training FLOPs per token, forward and backward: 6N (Kaplan et al. 2020, section 2.1), the
    estimate MFU is usually quoted with.

    It leaves out the attention scores and their weighted sum (12 * layers * context * width per
    token, PaLM appendix B), about 15% more at the GPT-2/GPT-3 shapes above, so an MFU computed
    from it is a lower bound. N includes the embeddings: the tied token table is also the output
    layer's matrix, which costs 6Vd per token; the position table (a lookup, a fraction of a
    percent of N) is counted too, for simplicity."""
    return 6 * parameter_count(size, vocab_size)
