"""What a language model trains on: windows of ``context + 1`` tokens cut from a split's shards
(``TokenDataset``), or from a seeded random stream when no data is given (``SyntheticTokens``);
the first ``context`` are the inputs, the last ``context`` the targets."""

from __future__ import annotations

import bisect
from pathlib import Path
from typing import Any

import numpy as np
import torch
from torch.utils.data import Dataset

from trainer.common.files import sha256_file
from trainer.data.errors import DataError
from trainer.data.token_shards import TokenManifest, TokenSplit, open_shards


class TokenDataset(Dataset[tuple[torch.Tensor, torch.Tensor]]):
    """Sample ``i`` of a prepared split: the ``context + 1`` tokens from ``i * context`` (windows
    do not overlap except for the one token each shares with the next, and may span two shards),
    as (inputs, targets) int64 tensors of ``context`` tokens, targets shifted by one.

    Shard sizes are checked against the manifest when the dataset is made (``check_sha256``
    also hashes them: a full read). The shards are memory-mapped lazily in each process, so
    DataLoader workers receive only the paths, never a copy of the data."""

    def __init__(
        self, folder: Path, split: str, context: int, *, check_sha256: bool = False
    ) -> None:
        if context < 1:
            raise DataError(f"context={context}: must be at least 1 token")
        self.folder = Path(folder)
        self.manifest = TokenManifest.load(self.folder)
        self.split = split
        self.context = context
        entry = self.manifest.split(split, self.folder)
        self._shards = entry.shards
        open_shards(self.folder, self.manifest, entry)  # checks the sizes now
        if check_sha256:
            for shard in entry.shards:
                if sha256_file(self.folder / shard.name) != shard.sha256:
                    raise DataError(
                        f"shard {self.folder / shard.name} does not match its SHA-256 in the "
                        f"manifest: stage the dataset again or rerun prepare-text"
                    )
        self.tokens = entry.tokens
        self._ends = np.cumsum([shard.tokens for shard in entry.shards]).tolist()
        self._maps: list[np.ndarray] | None = None

    @property
    def vocab_size(self) -> int:
        return self.manifest.vocab_size

    def __len__(self) -> int:
        return (self.tokens - 1) // self.context if self.tokens else 0

    def window(self, start: int, length: int) -> np.ndarray:
        """``length`` tokens of the split from ``start`` (across shard boundaries)."""
        if self._maps is None:
            self._maps = open_shards(
                self.folder, self.manifest, TokenSplit(self.tokens, self._shards)
            )
        pieces = []
        shard = bisect.bisect_right(self._ends, start)
        while length > 0:
            begin = self._ends[shard - 1] if shard else 0
            piece = self._maps[shard][start - begin : start - begin + length]
            pieces.append(piece)
            start += len(piece)
            length -= len(piece)
            shard += 1
        return pieces[0] if len(pieces) == 1 else np.concatenate(pieces)

    def __getitem__(self, index: int) -> tuple[torch.Tensor, torch.Tensor]:
        if not 0 <= index < len(self):
            raise IndexError(f"window {index} of {len(self)}")
        tokens = torch.from_numpy(
            self.window(index * self.context, self.context + 1).astype(np.int64)
        )
        return tokens[:-1], tokens[1:]

    def __getstate__(self) -> dict[str, Any]:
        # Pickled to DataLoader workers: a memmap would be pickled as a full copy of the data.
        return {**self.__dict__, "_maps": None}


class SyntheticTokens(Dataset[tuple[torch.Tensor, torch.Tensor]]):
    """``size`` windows of uniformly random tokens, for runs without data: window ``i`` is a pure
    function of (seed, i), so every worker and every resumed run sees the same one."""

    def __init__(self, size: int, context: int, vocab_size: int, seed: int = 0) -> None:
        if min(size, context, vocab_size) < 1:
            raise DataError(
                f"synthetic tokens size={size}, context={context}, vocab_size={vocab_size}: "
                f"each must be at least 1"
            )
        self.size, self.context, self.vocab_size, self.seed = size, context, vocab_size, seed

    def __len__(self) -> int:
        return self.size

    def __getitem__(self, index: int) -> tuple[torch.Tensor, torch.Tensor]:
        if not 0 <= index < self.size:
            raise IndexError(f"window {index} of {self.size}")
        generator = np.random.default_rng([self.seed, index])
        tokens = torch.from_numpy(
            generator.integers(0, self.vocab_size, self.context + 1, dtype=np.int64)
        )
        return tokens[:-1], tokens[1:]
