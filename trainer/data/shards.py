"""Prepared shards as a random-access sample source.

The tar headers are read once to index every member (shard, offset, size, label); a sample is
then one ``pread`` from an open shard, so the sampler decides the order (a shuffle buffer over
each rank's run of shards, see ``StreamSampler``) and a resume can start at any sample.
Shards are checked against the manifest's sizes and sample counts when opened; their SHA-256
when they were written, uploaded or staged, and on each node before training reads them
(``trainer.data.verify``).
"""

from __future__ import annotations

import os
import tarfile
from pathlib import Path

import numpy as np

from trainer.data.errors import DataError
from trainer.data.manifest import MANIFEST_NAME, Manifest


class ShardSource:
    def __init__(self, folder: Path, split: str, manifest: Manifest | None = None) -> None:
        self.folder = folder
        manifest = manifest or Manifest.load(folder)
        self.classes = list(manifest.classes)
        entry = manifest.split(split, folder)
        self.shard_names = [shard.name for shard in entry.shards]
        self.shard_samples = [shard.samples for shard in entry.shards]
        shard_ids, offsets, sizes, labels, keys = [], [], [], [], []
        for shard_id, shard in enumerate(entry.shards):
            path = folder / shard.name
            if not path.is_file():
                raise DataError(
                    f"shard {path} is listed in {MANIFEST_NAME} but missing: restage it"
                )
            if path.stat().st_size != shard.bytes:
                raise DataError(
                    f"shard {path} has {path.stat().st_size} bytes, the manifest says "
                    f"{shard.bytes}: restage it"
                )
            members = self._index(path)
            if len(members) != shard.samples:
                raise DataError(
                    f"shard {path} has {len(members)} samples, the manifest says {shard.samples}"
                )
            for key, offset, size, label in members:
                shard_ids.append(shard_id)
                offsets.append(offset)
                sizes.append(size)
                labels.append(label)
                keys.append(key)
        self.shard_ids = np.asarray(shard_ids, dtype=np.int32)
        self.offsets = np.asarray(offsets, dtype=np.int64)
        self.sizes = np.asarray(sizes, dtype=np.int64)
        self.labels = np.asarray(labels, dtype=np.int64)
        self.keys = keys
        self._fds: dict[int, int] = {}

    @staticmethod
    def _index(path: Path) -> list[tuple[str, int, int, int]]:
        """(key, data offset, size, label) per sample (``<key>.jpg`` + ``<key>.cls``)."""
        images: dict[str, tuple[int, int]] = {}
        labels: dict[str, int] = {}
        try:
            with tarfile.open(path, "r:") as tar:
                for member in tar:
                    key, _, extension = member.name.rpartition(".")
                    if extension == "cls":
                        file = tar.extractfile(member)
                        labels[key] = int(file.read()) if file else -1
                    else:
                        images[key] = (member.offset_data, member.size)
        except (tarfile.TarError, ValueError, OSError) as err:
            raise DataError(f"shard {path} is not a readable tar of samples ({err})") from None
        if images.keys() != labels.keys():
            odd = sorted(images.keys() ^ labels.keys())[0]
            raise DataError(f"shard {path}: sample {odd} lacks its image or its .cls label")
        return [(key, *images[key], labels[key]) for key in sorted(images)]

    def __len__(self) -> int:
        return len(self.offsets)

    def __getstate__(self) -> dict:
        # Open descriptors do not travel to loader worker processes; each opens its own.
        return {**self.__dict__, "_fds": {}}

    def label(self, index: int) -> int:
        return int(self.labels[index])

    def describe(self, index: int) -> str:
        return f"{self.folder / self.shard_names[self.shard_ids[index]]}:{self.keys[index]}"

    def encoded_size(self, index: int) -> int:
        return int(self.sizes[index])

    def read(self, index: int) -> bytes:
        shard_id = int(self.shard_ids[index])
        fd = self._fds.get(shard_id)
        if fd is None:
            fd = os.open(self.folder / self.shard_names[shard_id], os.O_RDONLY)
            self._fds[shard_id] = fd
        return os.pread(fd, int(self.sizes[index]), int(self.offsets[index]))
