"""What a run reads and how: the data source (built-in or plug-in) and its folder, the image and
batch sizes, synthetic data, the loader, the memory cache, the shuffle buffer and what a bad
image does; each field checked here. ``batch_size`` is per worker; the global batch is
batch_size x workers x accumulation (``trainer.settings.train_config.global_batch``)."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from trainer.common.errors import ConfigError
from trainer.settings.checks import (
    check_choice,
    check_choice_or_plugin,
    check_int_range,
    check_plugin_args,
)
from trainer.settings.choices import (
    BAD_IMAGE_POLICIES,
    CACHE_MODES,
    CACHE_SCOPES,
    DATA_SOURCES,
    is_plugin_ref,
)
from trainer.settings.declare import setting

# The sources read from --data-dir, and what that folder holds for each.
_FOLDER_NEEDED = {
    "tokens": "--data tokens needs --data-dir DIR (dt-data prepare-text's output, with "
    "manifest.json)",
    "folder": "--data folder needs --data-dir DIR (with train/)",
    "shards": "--data shards needs --data-dir DIR (with manifest.json)",
}


@dataclass(frozen=True)
class DataSettings:
    """The data source, the batch and the loader."""

    # A built-in source (DATA_SOURCES) or a plug-in ``pkg.module:factory`` called as
    # ``factory(cfg, **data_args)``.
    data: str = setting(
        "synthetic",
        f"input: {', '.join(DATA_SOURCES)}, or your own as pkg.module:factory "
        "(factory(cfg, **data_args) -> a map-style Dataset of (input, target), or (train, val))",
    )
    # setting() gives each instance its own copy of a dict default.
    data_args: dict[str, Any] = setting(  # noqa: RUF009
        {}, "a plug-in dataset's keyword arguments, a YAML mapping like '{size: 512}'"
    )
    data_dir: str | None = setting(
        None,
        "--data folder: root with train/<class>/ (and val/); --data shards: the "
        "folder with manifest.json (dt-data prepare); --data tokens: the folder "
        "dt-data prepare-text wrote",
    )
    image_size: int = setting(224, "training crop in pixels")
    batch_size: int = setting(
        32, "images per worker per step (the global batch multiplies by workers)"
    )
    synthetic_size: int = setting(12_800, "images in one synthetic epoch (all workers together)")
    synthetic_pool: int = setting(
        256, "distinct random images kept on the device for synthetic data"
    )
    loader_workers: int = setting(
        4, "DataLoader processes per worker for folders and shards (forkserver)"
    )
    cache: str = setting(
        "none", f"keep the dataset in RAM after the first read: {', '.join(CACHE_MODES)}"
    )
    cache_scope: str = setting(
        "node",
        "with --cache: node (one copy per node in shared memory, filled by the "
        "node's ranks together) or rank (each rank caches only its fixed part of the samples)",
    )
    shuffle_buffer: int = setting(
        1000, "samples in the shuffle buffer over each rank's shards (--data shards)"
    )
    on_bad_image: str = setting(
        "fail",
        "an image that does not decode while training (--data folder or shards): "
        "fail (stop, naming it) or skip (train on the next image instead; counted as "
        "skipped_images in the metrics and the run summary)",
    )

    @property
    def plugin_data(self) -> bool:
        return is_plugin_ref(self.data)

    def check_data(self) -> None:
        """The source and its folder, a plug-in's arguments, then the cache and the loader."""
        check_choice_or_plugin("data", self.data, DATA_SOURCES)
        if self.data in _FOLDER_NEEDED and not self.data_dir:
            raise ConfigError(f"data_dir=None: {_FOLDER_NEEDED[self.data]}")
        check_plugin_args("data_args", self.data_args, "data", self.data)
        self._check_cache()
        check_int_range("shuffle_buffer", self.shuffle_buffer, 1, 10_000_000)
        check_choice("on_bad_image", self.on_bad_image, BAD_IMAGE_POLICIES)
        check_int_range("image_size", self.image_size, 16, 1024)
        check_int_range("batch_size", self.batch_size, 1, 65_536)
        check_int_range("synthetic_size", self.synthetic_size, 1, 100_000_000)
        check_int_range("synthetic_pool", self.synthetic_pool, 1, 65_536)
        check_int_range("loader_workers", self.loader_workers, 0, 256)

    def _check_cache(self) -> None:
        check_choice("cache", self.cache, CACHE_MODES)
        if self.cache != "none" and self.data == "tokens":
            raise ConfigError(
                f"cache={self.cache}: token shards are memory-mapped (the page cache holds them); "
                "use --cache none"
            )
        if self.cache != "none" and self.plugin_data:
            raise ConfigError(
                f"cache={self.cache}: the cache serves --data folder and shards; a plug-in "
                "dataset keeps what it likes in memory itself; use --cache none"
            )
        if self.cache != "none" and self.data == "synthetic":
            raise ConfigError(
                f"cache={self.cache}: synthetic data is already in memory; use --cache none"
            )
        check_choice("cache_scope", self.cache_scope, CACHE_SCOPES)
