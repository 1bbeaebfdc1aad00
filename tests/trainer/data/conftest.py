"""The data tests use the shared dataset and Azurite fixtures in tests/conftest.py."""

from trainer.settings.train_config import DEFAULTS, TrainConfig


def shard_settings(root) -> dict:
    """The settings that load the small prepared dataset (``shards``) at 32 px, in process."""
    return dict(
        data="shards",
        data_dir=str(root),
        image_size=32,
        batch_size=4,
        num_classes=3,
        loader_workers=0,
        shuffle_buffer=8,
    )


def shard_config(root, **extra) -> TrainConfig:
    """``shard_settings`` with ``extra``, over the defaults."""
    return DEFAULTS.replace(**{**shard_settings(root), **extra})
