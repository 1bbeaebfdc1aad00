"""What a run leaves: its folder, checkpoints, log cadence and seed (``OutputSettings``), and the
copies rank 0 makes to Blob storage: live metrics, the finished results, the checkpoint mirror
(``UploadSettings``); each field checked here."""

from __future__ import annotations

from dataclasses import dataclass

from trainer.common.blob_folder import BlobFolder
from trainer.common.errors import ConfigError
from trainer.settings.checks import check_float_range, check_int_range
from trainer.settings.declare import setting


@dataclass(frozen=True)
class OutputSettings:
    """The run's folder, its checkpoints and logs, and its seed."""

    output_dir: str = setting(
        "runs/default", "folder for checkpoints/, metrics.jsonl and tensorboard/"
    )
    checkpoint_every: int = setting(
        0, "also checkpoint every N steps (0: only at epoch ends and on exit)"
    )
    # A step waits only for an in-memory copy; training goes on while the bytes reach storage
    # (the last save of a run, and a SIGTERM's, wait until written).
    checkpoint_async: bool = setting(
        True,
        "write checkpoints in the background while training goes on (at most "
        "one in flight; the run's last save waits until written)",
    )
    keep_checkpoints: int = setting(3, "checkpoints to keep")
    log_every: int = setting(10, "log metrics every N steps")
    seed: int = setting(42, "random seed (same on every worker)")

    def check_outputs(self) -> None:
        if not self.output_dir:
            raise ConfigError("output_dir='': give a folder for checkpoints and metrics")
        check_int_range("checkpoint_every", self.checkpoint_every, 0, 10**12)
        check_int_range("keep_checkpoints", self.keep_checkpoints, 1, 1000)
        check_int_range("log_every", self.log_every, 1, 10**9)
        check_int_range("seed", self.seed, 0, 2**32 - 1)


@dataclass(frozen=True)
class UploadSettings:
    """Rank 0's copies to Blob folder URLs ("": off): live metrics (trainer.outputs.live_upload),
    the results (trainer.outputs.results), the checkpoint mirror (trainer.checkpoints.mirror)."""

    # Fractions of a minute are allowed (short runs, tests).
    metrics_upload_url: str = setting(
        "",
        "rank 0 copies metrics.jsonl and tensorboard/ to this Blob folder "
        "(https://<account>.blob.core.windows.net/<container>/<prefix>/) with the machine's "
        "identity, every --metrics-upload-minutes and at the end; empty: off",
    )
    metrics_upload_minutes: float = setting(5.0, "minutes between live uploads (fractions allowed)")
    outputs_url: str = setting(
        "",
        "when the run ends, rank 0 copies its results/ (final weights, config, "
        "metrics, evaluation, manifest last) to this Blob folder with the machine's identity; "
        "empty: they stay in --output-dir",
    )
    # The newest N kept; a resume takes the newest verified copy of the local folder and it.
    checkpoint_mirror_url: str = setting(
        "",
        "rank 0 copies each finished checkpoint to this Blob folder in the "
        "background with the machine's identity (verified, its manifest last); a resume takes the "
        "newest verified checkpoint of --output-dir and this folder; empty: off",
    )
    checkpoint_mirror_keep: int = setting(
        2, "mirrored checkpoints to keep in --checkpoint-mirror-url"
    )

    def check_uploads(self) -> None:
        for name in ("metrics_upload_url", "outputs_url"):
            _check_blob_folder(name, getattr(self, name))
        check_float_range("metrics_upload_minutes", self.metrics_upload_minutes, 0.01, 1440.0)
        _check_blob_folder("checkpoint_mirror_url", self.checkpoint_mirror_url)
        check_int_range("checkpoint_mirror_keep", self.checkpoint_mirror_keep, 1, 1000)


def _check_blob_folder(name: str, url: str) -> None:
    if url:
        try:
            BlobFolder.parse(url)
        except ValueError as err:
            raise ConfigError(f"{name}={url!r}: {err}") from None
