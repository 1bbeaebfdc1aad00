"""Input pipelines: synthetic tensors on the device and image folders, sharded per rank."""

from trainer.data.folder import DataError
from trainer.data.loaders import Loader, Loaders, build_loaders
from trainer.data.sampler import ShardSampler

__all__ = ["DataError", "Loader", "Loaders", "ShardSampler", "build_loaders"]
