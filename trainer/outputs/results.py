"""The run's results: what a finished run leaves for its users, in ``<output_dir>/results/``.
Why it is built this way: docs/internals.md, `trainer/outputs/results.py`."""

from __future__ import annotations

import json
import math
from collections.abc import Mapping
from contextlib import suppress
from pathlib import Path
from typing import TYPE_CHECKING, Any, cast

from trainer.common.blob_folder import BlobFolder
from trainer.common.errors import first_line
from trainer.common.files import (
    OutputError,
    fsync_folder,
    remove_partials,
    sha256_file,
    write_atomic,
)
from trainer.common.grant_wait import CONTRIBUTOR, GrantMissing, GrantWait
from trainer.outputs.results_manifest import MANIFEST, Entry, ResultsError, manifest_bytes, verify

if TYPE_CHECKING:
    import torch
    from torch import nn

RESULTS_DIR = "results"
WEIGHTS = "model.safetensors"
CONFIG = "config.yaml"
METRICS = "metrics.json"
EVALUATION = "evaluation.json"
# Why a run stops where its results are final (trainer.training.run's stopped_by): a signal or
# --run-steps pauses a run that resumes later, and writes none.
FINISHED = ("epochs", "max_steps")


# ---------------------------------------------------------------------- what goes in
def full_state_dict(model: nn.Module, sharded: bool, is_root: bool) -> dict[str, torch.Tensor]:
    """The model's whole state on the CPU, on rank 0 (empty elsewhere). With sharded state
    (FSDP) every rank must call this: the shards are gathered onto rank 0."""
    if sharded:
        from torch.distributed.checkpoint.state_dict import StateDictOptions, get_model_state_dict

        # cpu_offload: rank 0 receives each gathered tensor in host memory, the other ranks
        # keep nothing, so no GPU ever holds the whole model.
        state = get_model_state_dict(
            model, options=StateDictOptions(full_state_dict=True, cpu_offload=True)
        )
        if not is_root:
            return {}
    elif is_root:
        state = model.state_dict()
    else:
        return {}
    # Contiguous copies: channels_last weights are strided, which safetensors refuses. A model's
    # state dict holds tensors only (DCP's type admits other values).
    return {
        name: cast("torch.Tensor", value).detach().to("cpu").contiguous()
        for name, value in state.items()
    }


def evaluation_summary(
    metrics: Mapping[str, float] | None, step: int, language_model: bool, unit: str
) -> dict[str, Any]:
    """The final evaluation (``trainer.training.steps.evaluate``'s figures) as ``evaluation.json``
    says it; ``metrics`` None: the data has no validation split."""
    summary: dict[str, Any] = {"step": step, "unit": unit}
    if metrics is None:
        return {**summary, "samples": 0, "note": "no validation data: nothing was evaluated"}
    loss = float(metrics["val_loss"])
    summary.update(samples=int(metrics["val_samples"]), loss=loss)
    if language_model:
        # exp() overflows a float beyond ~709; such a model has no meaningful perplexity.
        summary["perplexity"] = math.exp(loss) if loss < 700 else None
    elif "val_accuracy" in metrics:  # a plug-in loss without a metric measures none
        summary["accuracy"] = float(metrics["val_accuracy"])
    return summary


def _json(value: Any) -> bytes:
    return (json.dumps(_finite(value), indent=2, sort_keys=True, allow_nan=False) + "\n").encode()


def _finite(value: Any) -> Any:
    """``value`` with NaN and infinities as null: JSON has no such numbers (a diverged run's
    loss is one), and every reader must be able to parse the file."""
    if isinstance(value, float) and not math.isfinite(value):
        return None
    if isinstance(value, dict):
        return {k: _finite(v) for k, v in value.items()}
    if isinstance(value, list | tuple):
        return [_finite(v) for v in value]
    return value


# ---------------------------------------------------------------------- the local folder
def write(
    folder: Path,
    weights: Mapping[str, torch.Tensor],
    *,
    config: Mapping[str, Any],
    summary: Mapping[str, Any],
    evaluation: Mapping[str, Any],
    weights_metadata: Mapping[str, str],
) -> list[Entry]:
    """Rank 0: write a complete results folder (see the module's docstring); its entries.
    ``trainer.common.files.OutputError`` (one line) when the disk refuses: nothing then passes for
    complete results."""
    import yaml
    from safetensors.torch import save

    documents = {
        CONFIG: yaml.safe_dump(dict(config), sort_keys=True).encode(),
        METRICS: _json(dict(summary)),
        EVALUATION: _json(dict(evaluation)),
    }
    try:
        folder.mkdir(parents=True, exist_ok=True)
        # From here on the previous results are incomplete: a crash cannot pass a mixture off.
        (folder / MANIFEST).unlink(missing_ok=True)
        remove_partials(folder)
        # Serialized in memory, then the one atomic writer (safetensors' own file writer reports
        # a full disk as a SafetensorError, not as an OSError).
        write_atomic(folder / WEIGHTS, save(dict(weights), metadata=dict(weights_metadata)))
        for name, data in documents.items():
            write_atomic(folder / name, data)
        entries = [
            Entry(name, (folder / name).stat().st_size, sha256_file(folder / name))
            for name in sorted((WEIGHTS, *documents))
        ]
        fsync_folder(folder)  # the files' renames before the manifest that vouches for them
        write_atomic(folder / MANIFEST, manifest_bytes(entries))
        fsync_folder(folder)
    except OSError as err:
        # The final checkpoint is kept: once fixed, the run writes its results again without
        # training (trainer.training.run, "already_complete").
        raise OutputError.of(err, folder) from None
    return entries


def is_complete(folder: Path) -> bool:
    """Whether ``folder`` holds complete results (``verify`` passes)."""
    try:
        verify(folder)
    except (ResultsError, OSError):
        return False
    return True


# ---------------------------------------------------------------------- Blob storage
def upload(
    folder: Path, destination: BlobFolder, grant_wait: GrantWait | None = None
) -> list[Entry]:
    """Rank 0: copy a complete results folder to ``destination``, the manifest last (after the
    previous one is deleted); ResultsError, one line, when it cannot. ``grant_wait``: how long
    a refusal for want of the role is waited out (default: 30 min)."""
    from trainer.common.azure_sdk import AzureError
    from trainer.common.blob_client import container_client

    entries = verify(folder)  # never upload what no longer matches its manifest
    wait = grant_wait or GrantWait(CONTRIBUTOR, log=_say)
    try:
        container = container_client(destination)
        wait.call(lambda: _send(folder, destination, entries, container), destination.url)
    except GrantMissing as err:
        raise ResultsError(
            f"outputs_url={err}; the results are complete in {folder}, and running the job "
            "again uploads them"
        ) from None
    except (AzureError, OSError) as err:
        raise ResultsError(
            f"outputs_url={destination.url}: cannot upload the results "
            f"({type(err).__name__}: {first_line(err)}); they are complete in {folder}, and "
            "running the job again uploads them (a finished run trains no more)"
        ) from None
    return entries


def _send(folder: Path, destination: BlobFolder, entries: list[Entry], container: Any) -> None:
    """The old manifest deleted, every file, the manifest last (all again after a refusal:
    each upload overwrites)."""
    from trainer.common.azure_sdk import ResourceNotFoundError

    manifest = destination.blob(MANIFEST)
    with suppress(ResourceNotFoundError):
        container.delete_blob(manifest)
    for entry in entries:
        with open(folder / entry.name, "rb") as data:
            container.upload_blob(
                destination.blob(entry.name), data, length=entry.size, overwrite=True
            )
    container.upload_blob(manifest, (folder / MANIFEST).read_bytes(), overwrite=True)


def _say(line: str) -> None:
    print(line, flush=True)
