"""The data tests use the shared dataset and Azurite fixtures in tests/conftest.py."""

from trainer.config import DEFAULTS, TrainConfig


def shard_config(root, **extra) -> TrainConfig:
    """Settings for loading the small prepared dataset (``shards``) at 32 px, in process."""
    values = dict(
        data="shards",
        data_dir=str(root),
        image_size=32,
        batch_size=4,
        num_classes=3,
        loader_workers=0,
        shuffle_buffer=8,
    )
    return DEFAULTS.replace(**{**values, **extra})
