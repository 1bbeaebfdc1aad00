"""``build_loaders``: the train and validation batches for one rank, on its device, from
synthetic tensors, an image folder or prepared shards, optionally through a memory cache
(``--cache-scope node``: one copy per node, shared; ``rank``: each rank its fixed part); for a
language model, windows of tokens from ``prepare-text``'s shards or synthetic tokens.
Shards are checked against their SHA-256 once per node first (``verify``); an image that does
not decode is replaced or stops the run as ``--on-bad-image`` says (``bad_images``)."""

from __future__ import annotations

from collections.abc import Callable, Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Protocol

import torch
from torch.utils.data import DataLoader, Dataset

from trainer.data.bad_images import FIXES, BadImages, worker_error
from trainer.data.cache import MemoryCache, Source
from trainer.data.dataset import CheckedImageDataset, collate_images
from trainer.data.errors import DataError
from trainer.data.folder import FolderSource
from trainer.data.manifest import Manifest
from trainer.data.node_memory import Collectives, NodeGroup
from trainer.data.sampler import PartSampler, RankSampler, StreamSampler
from trainer.data.shards import ShardSource
from trainer.data.synthetic import SyntheticLoader
from trainer.data.text_prepare import BYTE_VOCAB
from trainer.data.token_windows import SyntheticTokens, TokenDataset
from trainer.data.transforms import normalize
from trainer.data.verify import verify_shards
from trainer.data.worker_processes import forkserver
from trainer.models.gpt_sizes import GPT_SIZES
from trainer.settings.train_config import TrainConfig, global_micro_batch


class Loader(Protocol):
    """Batches of (images, labels) already on the device; ``len`` counts batches left.

    ``sampler`` decides which samples and where in the epoch to start; a resume positions it
    with ``sampler.set_epoch(epoch, offset=..., layout_replicas=...)``.
    """

    sampler: RankSampler

    def set_epoch(self, epoch: int, skip_batches: int = 0) -> None: ...
    def __len__(self) -> int: ...
    def __iter__(self) -> Iterator[tuple[torch.Tensor, torch.Tensor]]: ...
    def stop_workers(self) -> None: ...


@dataclass
class Loaders:
    train: Loader
    val: Loader | None
    batches_per_epoch: int
    # A language model's vocabulary (the token data's), None for images.
    vocab_size: int | None = None
    # Images that did not decode: the --on-bad-image policy and this rank's count of skipped.
    bad_images: BadImages = field(default_factory=BadImages)

    def stop_workers(self) -> None:
        """Stop both loaders' worker processes: the run is over (``trainer.training.run.train``)."""
        for loader in (self.train, self.val):
            if loader is not None:
                loader.stop_workers()


def _one_line_errors(loader: DataLoader) -> Iterator[Any]:
    """``loader``'s batches; a ``DataError`` a worker raised as its own one line."""
    batches = iter(loader)
    while True:
        try:
            batch = next(batches)
        except StopIteration:
            return
        except DataError as err:
            raise worker_error(err) from None
        yield batch


class DeviceLoader:
    """A DataLoader over a ``RankSampler`` that hands out normalized batches on the device.

    Its dataset is a ``CheckedImageDataset``: every batch names the samples it had to replace,
    and ``bad_images`` stops the run at one or counts it."""

    def __init__(
        self,
        loader: DataLoader,
        sampler: RankSampler,
        device: torch.device,
        channels_last: bool,
        bad_images: BadImages | None = None,
    ) -> None:
        self.loader, self.sampler, self.device = loader, sampler, device
        self.memory_format = torch.channels_last if channels_last else torch.contiguous_format
        self.bad_images = bad_images or BadImages()
        # The loaders whose workers stop when this one meets bad data: the run ends, and a
        # persistent worker of the other split would outlive it.
        self.stopped_together: list[DeviceLoader] = [self]

    def set_epoch(self, epoch: int, skip_batches: int = 0) -> None:
        self.sampler.set_epoch(epoch, skip_batches)

    def __len__(self) -> int:
        return len(self.loader)

    def __iter__(self) -> Iterator[tuple[torch.Tensor, torch.Tensor]]:
        try:
            for images, labels, problems in _one_line_errors(self.loader):
                self.bad_images.met(problems)
                # uint8 travels to the device in the NHWC memory it was collated into:
                # channels_last runs keep it, the others rearrange it there while it is still
                # 1 byte per value. Normalizing (one fused pass per batch) keeps the layout.
                images = images.to(self.device, non_blocking=True)
                images = normalize(images.contiguous(memory_format=self.memory_format))
                yield images, labels.to(self.device)
        except DataError:
            for loader in self.stopped_together:
                loader.stop_workers()
            raise

    def stop_workers(self) -> None:
        """Stop the loader's worker processes now (a later iteration starts new ones). Their
        parent is the forkserver, not this process, and each keeps the server running (it holds
        the server's liveness pipe), so torch's watchdog in a worker waits for a parent that
        never goes. Only this call or torch's atexit hook (which ``os._exit`` skips) stops
        them: bad data and the end of every run call it (``Loaders.stop_workers``)."""
        iterator, self.loader._iterator = self.loader._iterator, None  # the persistent one
        shutdown = getattr(iterator, "_shutdown_workers", None)
        if shutdown is not None:
            shutdown()


def batch_loader(
    dataset: Dataset,
    sampler: RankSampler,
    batch_size: int,
    workers: int,
    device: torch.device,
    collate: Callable[[list[Any]], Any] | None = None,
) -> DataLoader:
    """Full batches of ``dataset`` in ``sampler``'s order, read by ``workers`` processes and
    put together by ``collate`` (PyTorch's default collate if None)."""
    return DataLoader(
        dataset,
        batch_size=batch_size,
        sampler=sampler,
        drop_last=True,
        collate_fn=collate,
        num_workers=workers,
        pin_memory=device.type == "cuda",
        # InfiniBand verbs and CUDA are not fork-safe: start workers from a clean server process.
        multiprocessing_context=forkserver() if workers else None,
        persistent_workers=workers > 0,
        prefetch_factor=4 if workers else None,
    )


class TokenDeviceLoader(DeviceLoader):
    """(inputs, targets) token windows on the device: nothing to normalize."""

    def __iter__(self) -> Iterator[tuple[torch.Tensor, torch.Tensor]]:
        for inputs, targets in _one_line_errors(self.loader):
            yield inputs.to(self.device, non_blocking=True), targets.to(self.device)


class _Windows(Dataset[tuple[torch.Tensor, torch.Tensor]]):
    """The samplers' ``(index, epoch)`` keys -> a token dataset's windows (no augmentation)."""

    def __init__(self, windows: TokenDataset | SyntheticTokens) -> None:
        self.windows = windows

    def __len__(self) -> int:
        return len(self.windows)

    def __getitem__(self, key: tuple[int, int]) -> tuple[torch.Tensor, torch.Tensor]:
        return self.windows[key[0]]


def no_full_batch(data: str, sampler: RankSampler, fix: str) -> str:
    """The one line for data that gives ``sampler`` no full batch on every worker: ``data``
    names what was read (the setting, or the data and its size), then the batch, the workers
    and ``fix``."""
    return (
        f"{data} give no full batch of {sampler.batch_size} per worker for "
        f"{sampler.num_replicas} workers: {fix}"
    )


def _token_loaders(cfg: TrainConfig, rank: int, world: int, device: torch.device) -> Loaders:
    context = cfg.context or GPT_SIZES[cfg.model].context
    if cfg.data == "tokens":
        root = Path(cfg.data_dir or "")
        train_set = TokenDataset(root, "train", context)
        vocab = train_set.vocab_size
        if cfg.vocab_size not in (None, vocab):
            raise DataError(
                f"vocab_size={cfg.vocab_size}: {root} holds tokens of a {vocab}-token "
                f"vocabulary; leave --vocab-size unset or set it to {vocab}"
            )
        has_val = "val" in train_set.manifest.splits
        val_set = TokenDataset(root, "val", context) if has_val else None
        workers = cfg.loader_workers
    else:
        vocab = cfg.vocab_size or BYTE_VOCAB
        train_set = SyntheticTokens(cfg.synthetic_size, context, vocab, seed=cfg.seed)
        val_size = global_micro_batch(cfg.batch_size, world)  # one batch of every worker
        val_set = SyntheticTokens(val_size, context, vocab, seed=cfg.seed + 1)
        workers = 0  # made on the fly from (seed, index): nothing to overlap
    loaders: list[TokenDeviceLoader | None] = []
    for dataset, train in ((train_set, True), (val_set, False)):
        sampler = RankSampler(
            len(dataset) if dataset is not None else 0,
            world,
            rank,
            cfg.batch_size,
            shuffle=train,
            seed=cfg.seed,
        )
        if dataset is None or sampler.batches_per_epoch == 0:
            if train:
                raise DataError(
                    no_full_batch(
                        f"{cfg.data} data: {len(train_set)} windows of {context} tokens",
                        sampler,
                        "lower --batch-size or --context, or add text",
                    )
                )
            loaders.append(None)  # too little validation text for one batch: no evaluation
            continue
        loader = batch_loader(_Windows(dataset), sampler, cfg.batch_size, workers, device)
        loaders.append(TokenDeviceLoader(loader, sampler, device, channels_last=False))
    train_loader, val_loader = loaders
    assert train_loader is not None
    return Loaders(train_loader, val_loader, train_loader.sampler.batches_per_epoch, vocab)


def _file_loader(
    dataset: CheckedImageDataset,
    sampler: RankSampler,
    where: Path,
    cfg: TrainConfig,
    device: torch.device,
    channels_last: bool,
    bad_images: BadImages,
) -> DeviceLoader:
    if sampler.batches_per_epoch == 0:
        raise DataError(
            no_full_batch(f"{len(dataset)} images in {where}", sampler, "lower --batch-size")
        )
    loader = batch_loader(
        dataset, sampler, cfg.batch_size, cfg.loader_workers, device, collate_images
    )
    return DeviceLoader(loader, sampler, device, channels_last, bad_images)


def _sources(
    cfg: TrainConfig, root: Path, group: NodeGroup
) -> tuple[list[str], Source, Source | None, Path]:
    """(classes, train source, val source or None, where train lives) for folder or shards;
    shards are verified against the manifest's SHA-256 once per node (``group``)."""
    if cfg.data == "shards":
        manifest = Manifest.load(root)
        train = ShardSource(root, "train", manifest)
        val = ShardSource(root, "val", manifest) if "val" in manifest.splits else None
        verify_shards(root, manifest.shards, group)
        return train.classes, train, val, root
    train = FolderSource(root / "train")
    val = None
    if (root / "val").is_dir():
        val = FolderSource(root / "val")
        if val.classes != train.classes:
            raise DataError(f"{root / 'val'}: class folders differ from {root / 'train'}")
    return train.classes, train, val, root / "train"


def _sampler(
    cfg: TrainConfig, source: Source, rank: int, world: int, *, shuffle: bool
) -> RankSampler:
    # A rank-scope cache holds only what its rank reads: that must be the same every epoch.
    fixed = cfg.cache != "none" and cfg.cache_scope == "rank"
    if isinstance(source, ShardSource):
        return StreamSampler(
            source.shard_samples,
            world,
            rank,
            cfg.batch_size,
            shuffle=shuffle,
            seed=cfg.seed,
            buffer=cfg.shuffle_buffer,
            fixed_parts=fixed,
        )
    if fixed and shuffle:
        return PartSampler(len(source), world, rank, cfg.batch_size, seed=cfg.seed)
    return RankSampler(len(source), world, rank, cfg.batch_size, shuffle=shuffle, seed=cfg.seed)


def _cache(
    cfg: TrainConfig,
    source: Source,
    sampler: RankSampler,
    group: NodeGroup | None,
    ranks_per_node: int,
    name: str,
    bad_images: BadImages,
) -> MemoryCache:
    part = None
    if cfg.cache_scope == "rank":
        part = sampler.part()
        assert part is not None, "rank scope needs a sampler with fixed parts"
    return MemoryCache(
        source,
        cfg.cache,
        cfg.image_size,
        cfg.loader_workers,
        ranks_per_node,
        group=group,
        indices=part,
        name=name,
        bad_images=bad_images,
    )


def build_loaders(
    cfg: TrainConfig,
    rank: int,
    world: int,
    device: torch.device,
    channels_last: bool,
    ranks_per_node: int = 1,
    dist: Collectives | None = None,
) -> Loaders:
    """Loaders for this rank's share. Raises ``DataError`` for unusable data.

    With a memory cache, ``dist`` (every rank's, all calling this together) finds the ranks
    on this node; without it this process is alone on its node and ``ranks_per_node`` estimates
    what a rank-scope cache's neighbours hold."""
    if cfg.language_model:
        return _token_loaders(cfg, rank, world, device)
    if cfg.data == "synthetic":
        return _synthetic_loaders(cfg, rank, world, device, channels_last)
    return _image_loaders(cfg, rank, world, device, channels_last, ranks_per_node, dist)


def _synthetic_loaders(
    cfg: TrainConfig, rank: int, world: int, device: torch.device, channels_last: bool
) -> Loaders:
    sampler = RankSampler(cfg.synthetic_size, world, rank, cfg.batch_size, seed=cfg.seed)
    if sampler.batches_per_epoch == 0:
        raise DataError(
            no_full_batch(
                f"synthetic_size={cfg.synthetic_size}: its samples",
                sampler,
                f"raise it to at least {sampler.global_micro_batch}",
            )
        )
    common = dict(
        image_size=cfg.image_size,
        num_classes=cfg.num_classes,
        device=device,
        channels_last=channels_last,
    )
    train = SyntheticLoader(sampler, pool=cfg.synthetic_pool, seed=cfg.seed, **common)
    val_sampler = RankSampler(
        max(cfg.synthetic_pool, sampler.global_micro_batch),
        world,
        rank,
        cfg.batch_size,
        shuffle=False,
    )
    val = SyntheticLoader(val_sampler, pool=cfg.synthetic_pool, seed=cfg.seed + 1, **common)
    return Loaders(train, val, sampler.batches_per_epoch)


def _image_loaders(
    cfg: TrainConfig,
    rank: int,
    world: int,
    device: torch.device,
    channels_last: bool,
    ranks_per_node: int,
    dist: Collectives | None,
) -> Loaders:
    """An image folder's or shards' loaders, through a memory cache if ``cfg.cache`` asks."""
    root = Path(cfg.data_dir or "")
    # The node's ranks: they verify shards together, share a node cache, and a rank cache's
    # check counts their parts.
    needs_group = cfg.cache != "none" or cfg.data == "shards"
    group = NodeGroup.form(dist) if needs_group and dist is not None else None
    classes, train_source, val_source, where = _sources(cfg, root, group or NodeGroup.alone())
    if len(classes) > cfg.num_classes:
        raise DataError(
            f"num_classes={cfg.num_classes}: {where} has {len(classes)} "
            f"classes; set --num-classes {len(classes)}"
        )
    bad_images = BadImages(cfg.on_bad_image, FIXES[cfg.data])
    loaders: list[DeviceLoader | None] = []
    for source, train in ((train_source, True), (val_source, False)):
        if source is None:
            loaders.append(None)
            continue
        sampler = _sampler(cfg, source, rank, world, shuffle=train)
        if cfg.cache != "none":
            name = "train" if train else "val"
            source = _cache(cfg, source, sampler, group, ranks_per_node, name, bad_images)
        dataset = CheckedImageDataset(source, cfg.image_size, train=train, seed=cfg.seed)
        loader = _file_loader(dataset, sampler, where, cfg, device, channels_last, bad_images)
        loaders.append(loader)
    train_loader, val_loader = loaders
    assert train_loader is not None
    train_loader.stopped_together = [loader for loader in loaders if loader is not None]
    if val_loader is not None:
        val_loader.stopped_together = train_loader.stopped_together
    return Loaders(
        train_loader, val_loader, train_loader.sampler.batches_per_epoch, bad_images=bad_images
    )
