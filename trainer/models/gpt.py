"""A GPT-2-style decoder (Radford et al. 2019; the layout of nanoGPT's ``model.py``).

Token and learned position embeddings, pre-LayerNorm blocks of causal self-attention and a 4x
GELU MLP, a final LayerNorm, and an output layer that reuses the token embedding's matrix. Each
block is its own submodule in ``model.blocks`` so FSDP can wrap (shard and gather) one block at
a time. Imports torch only: no I/O and no distributed code.
"""

from __future__ import annotations

import math
from contextlib import nullcontext

import torch
import torch.nn.functional as F
from torch import nn

from trainer.models.gpt_sizes import GPT_SIZES, GPTSize

INIT_STD = 0.02  # GPT-2's initializer range


class CausalSelfAttention(nn.Module):
    def __init__(self, size: GPTSize) -> None:
        super().__init__()
        self.heads = size.heads
        self.qkv = nn.Linear(size.width, 3 * size.width)
        self.proj = nn.Linear(size.width, size.width)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        batch, time, width = x.shape
        # (B, T, 3, heads, head_width) -> three (B, heads, T, head_width)
        qkv = self.qkv(x).view(batch, time, 3, self.heads, width // self.heads)
        q, k, v = qkv.permute(2, 0, 3, 1, 4).unbind(0)
        # The fused kernel (flash or memory-efficient attention on GPUs) never materializes the
        # T x T score matrix; is_causal masks the future.
        out = F.scaled_dot_product_attention(q, k, v, is_causal=True)
        return self.proj(out.transpose(1, 2).reshape(batch, time, width))


class MLP(nn.Module):
    def __init__(self, size: GPTSize) -> None:
        super().__init__()
        self.up = nn.Linear(size.width, 4 * size.width)
        # GPT-2 used the tanh approximation of GELU; keep it so its weights would load unchanged.
        self.act = nn.GELU(approximate="tanh")
        self.proj = nn.Linear(4 * size.width, size.width)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.proj(self.act(self.up(x)))


class Block(nn.Module):
    """Pre-LayerNorm (GPT-2): x + attn(ln(x)), then x + mlp(ln(x))."""

    def __init__(self, size: GPTSize) -> None:
        super().__init__()
        self.ln_attn = nn.LayerNorm(size.width)
        self.attn = CausalSelfAttention(size)
        self.ln_mlp = nn.LayerNorm(size.width)
        self.mlp = MLP(size)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        x = x + self.attn(self.ln_attn(x))
        return x + self.mlp(self.ln_mlp(x))


class GPT(nn.Module):
    def __init__(self, size: GPTSize, vocab_size: int) -> None:
        super().__init__()
        if vocab_size < 1:
            raise ValueError(f"vocab_size={vocab_size}: must be at least 1")
        self.size = size
        self.vocab_size = vocab_size
        self.token_embedding = nn.Embedding(vocab_size, size.width)
        self.position_embedding = nn.Embedding(size.context, size.width)
        self.blocks = nn.ModuleList([Block(size) for _ in range(size.layers)])
        self.ln_final = nn.LayerNorm(size.width)
        self.init_weights()

    @torch.no_grad()
    def init_weights(self) -> None:
        """GPT-2's initialization: N(0, 0.02) weights and zero biases, with the two projections
        that write into the residual stream scaled by 1/sqrt(2 * layers) so its variance does
        not grow with depth (Radford et al. 2019, section 2.3). Public so a model built on the
        meta device can be initialized after ``to_empty()`` (the FSDP recipe)."""
        residual_std = INIT_STD / math.sqrt(2 * self.size.layers)
        for name, module in self.named_modules():
            if isinstance(module, nn.Linear):
                std = residual_std if name.endswith(".proj") else INIT_STD
                nn.init.normal_(module.weight, mean=0.0, std=std)
                if module.bias is not None:
                    nn.init.zeros_(module.bias)
            elif isinstance(module, nn.Embedding):
                nn.init.normal_(module.weight, mean=0.0, std=INIT_STD)
            elif isinstance(module, nn.LayerNorm):
                nn.init.ones_(module.weight)
                nn.init.zeros_(module.bias)

    def forward(self, tokens: torch.Tensor) -> torch.Tensor:
        """tokens: int64 [batch, time], time <= context -> logits [batch, time, vocab_size]."""
        time = tokens.shape[1]
        if time > self.size.context:
            raise ValueError(
                f"sequence of {time} tokens is longer than the context, {self.size.context}"
            )
        positions = torch.arange(time, device=tokens.device)
        x = self.token_embedding(tokens) + self.position_embedding(positions)
        for block in self.blocks:
            x = block(x)
        # The output layer is the token embedding's matrix, used directly rather than shared
        # with an nn.Linear: a tie between two modules' Parameters is broken by to_empty() and
        # by wrappers that replace parameters (FSDP), a single Parameter cannot be.
        return F.linear(self.ln_final(x), self.token_embedding.weight)

    def extra_repr(self) -> str:
        return f"{self.size}, vocab_size={self.vocab_size}"


def build_gpt(name: str, vocab_size: int, device: torch.device | str | None = None) -> GPT:
    """The GPT named in ``GPT_SIZES``. ``device="meta"`` allocates nothing: count parameters of
    any size, or build for FSDP and materialize the shards with ``to_empty()`` + init_weights."""
    size = GPT_SIZES.get(name)
    if size is None:
        raise ValueError(f"model {name!r} is not one of {', '.join(GPT_SIZES)}")
    with torch.device(device) if device is not None else nullcontext():
        return GPT(size, vocab_size)
