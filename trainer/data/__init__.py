"""Input pipelines: synthetic tensors on the device, image folders and prepared shards (with an
optional memory cache), sharded per rank; `dt-data` prepares and moves datasets."""

from trainer.data.errors import DataError
from trainer.data.loaders import Loader, Loaders, build_loaders
from trainer.data.sampler import RankSampler

__all__ = ["DataError", "Loader", "Loaders", "RankSampler", "build_loaders"]
