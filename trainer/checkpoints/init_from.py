"""``--init-from``: the weights a fresh run starts from (safetensors, a torch state dict or another
run's checkpoint, local or an https Blob URL read with the machine's identity); strict by
default. A resume from the run's own checkpoint wins. Formats and errors: docs/trainer.md,
"Starting from weights"."""

from __future__ import annotations

import contextlib
import tempfile
from collections.abc import Iterator, Mapping
from pathlib import Path
from typing import Any

import torch
from torch import nn

from trainer.checkpoints import sharded as sharded_checkpoint
from trainer.checkpoints import single_file
from trainer.common.blob_folder import BlobFolder
from trainer.common.errors import first_line
from trainer.common.grant_wait import READER, GrantMissing, GrantWait
from trainer.outputs.results import WEIGHTS
from trainer.settings.checks import init_source, registered_model

# Prefixes wrappers add to every key: DDP's ``module.`` and torch.compile's ``_orig_mod.``.
_WRAPPER_PREFIXES = ("module.", "_orig_mod.")
# How many keys a one-line report names of each kind.
_NAMED = 3


class InitError(Exception):
    """The weights cannot be used; one line, and the exit code (2: bad input, 1: environment)."""

    def __init__(self, message: str, exit_code: int = 2) -> None:
        super().__init__(message)
        self.exit_code = exit_code


def apply(model: nn.Module, source: str, strict: bool) -> str:
    """Load ``source``'s weights into ``model`` (sharded by FSDP or not); the line to log."""
    with local_copy(source) as path:
        weights, kind = read_weights(source, path)
    expected = {name: tuple(t.shape) for name, t in model.state_dict().items()}
    weights = _unwrapped(weights, expected)
    loaded, report = match(source, expected, weights, strict)
    _load(model, loaded)
    return f"init_from={source}: started from {len(loaded)} tensors ({kind}){report}"


# ---------------------------------------------------------------------- where the bytes are
@contextlib.contextmanager
def local_copy(source: str) -> Iterator[Path]:
    """``source`` as a local path: itself, or a Blob's or a registered model's download in a
    temporary folder that is removed afterwards."""
    location = init_source(source)
    if registered_model(source):
        with tempfile.TemporaryDirectory(prefix="init-from-") as temp:
            yield registered_download(source, Path(temp))
        return
    if location is None:
        path = Path(source).expanduser()
        if not path.exists():
            raise InitError(
                f"init_from={source}: no such file or folder; give a weights file, a "
                "checkpoint file or a step-*.dcp folder"
            )
        yield path
        return
    with tempfile.TemporaryDirectory(prefix="init-from-") as temp:
        yield download(location, source, Path(temp))


def download(location: BlobFolder, source: str, into: Path) -> Path:
    """The blob the URL names, or every blob of the folder it names, under ``into``."""
    from trainer.common.azure_sdk import (
        ClientAuthenticationError,
        HttpResponseError,
        ResourceNotFoundError,
        ServiceRequestError,
    )
    from trainer.common.blob_client import container_client

    name = location.prefix.rstrip("/")
    wait = GrantWait(READER, log=print)
    try:
        container = container_client(location)
        return wait.call(lambda: _fetch(container, name, into), source)
    except GrantMissing as err:
        raise InitError(f"init_from={err}", 1) from None
    except ResourceNotFoundError as err:
        # The container itself is missing (a missing blob is found out by _fetch).
        raise InitError(f"init_from={source}: not found ({err.reason}); check the URL") from None
    except ClientAuthenticationError as err:
        raise InitError(
            f"init_from={source}: cannot authenticate ({first_line(err)}); log in with `az "
            f"login` or give the machine an identity with {READER}",
            1,
        ) from None
    except (HttpResponseError, ServiceRequestError, OSError) as err:
        raise InitError(
            f"init_from={source}: cannot download ({type(err).__name__}: {first_line(err)})", 1
        ) from None


def registered_download(source: str, into: Path) -> Path:
    """A registered model's version from MLflow's registry at MLFLOW_TRACKING_URI (the stack's
    workspace: AzureML sets it in its jobs, the stack in Batch's): its model.safetensors when
    it holds one (the trainer's results, as `dt-jobs fetch --register` registers them), else
    its folder."""
    import os

    if not os.environ.get("MLFLOW_TRACKING_URI"):
        raise InitError(
            f"init_from={source}: a registered model is read from MLflow's registry, and "
            "MLFLOW_TRACKING_URI is not set; run on a stack with an AzureML workspace (its jobs "
            "get it) or set it"
        )
    os.environ.setdefault("MLFLOW_DISABLE_TELEMETRY", "true")
    from mlflow.artifacts import download_artifacts
    from mlflow.exceptions import MlflowException

    try:
        folder = Path(download_artifacts(artifact_uri=source, dst_path=str(into)))
    except MlflowException as err:
        missing = err.error_code == "RESOURCE_DOES_NOT_EXIST"
        raise InitError(
            f"init_from={source}: {first_line(err)}"
            + ("; check the name and version (the workspace's Models page)" if missing else ""),
            2 if missing else 1,
        ) from None
    weights = folder / WEIGHTS
    return weights if weights.is_file() else folder


def _fetch(container: Any, name: str, into: Path) -> Path:
    """A blob called ``name`` to ``into/<its name>``; else the blobs under ``name/`` (a
    folder) to ``into/<folder>/``. Blob storage has no folders: a folder is the prefix its blobs'
    names share. On an account with a hierarchical namespace a folder also exists as a
    zero-length blob with metadata ``hdi_isfolder=true`` ("directories appear in the list as
    zero-length blobs", learn.microsoft.com/azure/storage/blobs/storage-blobs-list): such a
    blob is taken for the folder it marks, never downloaded as a weights file."""
    from trainer.common.azure_sdk import ResourceNotFoundError

    try:
        properties = container.get_blob_client(name).get_blob_properties()
        if not _is_folder_marker(properties):
            target = into / Path(name).name
            _download_blob(container, name, target)
            return target
    except ResourceNotFoundError as err:
        if getattr(err, "error_code", None) == "ContainerNotFound":
            raise
    folder = into / Path(name).name
    found = False
    for blob in container.list_blobs(name_starts_with=f"{name}/", include=["metadata"]):
        if _is_folder_marker(blob):
            continue
        relative = blob.name[len(name) + 1 :]
        if any(part in ("", ".", "..") for part in relative.split("/")):
            continue  # a name that would leave the folder: never written
        _download_blob(container, blob.name, folder / relative)
        found = True
    if not found:
        raise InitError(
            f"init_from={container.url}/{name}: no blob or folder of that name; check the URL"
        )
    return folder


def _is_folder_marker(properties: Any) -> bool:
    metadata = getattr(properties, "metadata", None) or {}
    return str(metadata.get("hdi_isfolder", "")).lower() == "true"


def _download_blob(container: Any, name: str, target: Path) -> None:
    target.parent.mkdir(parents=True, exist_ok=True)
    with open(target, "wb") as file:
        container.download_blob(name, max_concurrency=4).readinto(file)


# ---------------------------------------------------------------------- formats
def read_weights(source: str, path: Path) -> tuple[dict[str, torch.Tensor], str]:
    """The tensors of the file or folder at ``path`` (``source`` names it in errors), and
    what it was."""
    if path.is_dir():
        return _read_folder(source, path)
    try:
        with open(path, "rb") as file:
            head = file.read(9)
    except OSError as err:
        raise InitError(f"init_from={source}: cannot read ({err.strerror})", 1) from None
    # safetensors: an 8-byte little-endian header length, then the JSON header. Tested first:
    # that length's first byte may be 0x80, legacy torch pickles' first byte.
    if len(head) == 9 and head[8:9] == b"{":
        from safetensors import SafetensorError
        from safetensors.torch import load_file

        try:
            return load_file(str(path)), "safetensors"
        except (SafetensorError, OSError, ValueError) as err:
            raise InitError(
                f"init_from={source}: not a readable safetensors file ({first_line(err)})"
            ) from None
    if head[:4] == b"PK\x03\x04" or head[:1] == b"\x80":  # torch's zip format, legacy pickle
        return _read_torch(source, path)
    raise InitError(
        f"init_from={source}: neither safetensors nor a torch file; give a .safetensors file, "
        "a torch state dict or checkpoint, or a step-*.dcp folder"
    )


def _read_torch(source: str, path: Path) -> tuple[dict[str, torch.Tensor], str]:
    kind = "torch state dict"
    try:
        if single_file.checksum_path(path).is_file():
            state: Any = single_file.load(path)  # a run's checkpoint: its SHA-256 checked
        else:
            state = torch.load(path, map_location="cpu", weights_only=True)
    except Exception as err:
        raise InitError(
            f"init_from={source}: not a readable torch file ({type(err).__name__}: "
            f"{first_line(err)})"
        ) from None
    if isinstance(state, Mapping) and "schema" in state and "model" in state:
        state, kind = state["model"], "checkpoint"
    elif isinstance(state, Mapping):
        for wrapper in ("model", "state_dict"):
            if isinstance(state.get(wrapper), Mapping):
                state, kind = state[wrapper], f"torch file, its {wrapper!r} entry"
                break
    return _tensors(source, state), kind


def _read_folder(source: str, path: Path) -> tuple[dict[str, torch.Tensor], str]:
    """A DCP folder read whole, without a process group: our checkpoints keep the model under
    ``model``; a folder saved from a bare state dict has the parameters at its top."""
    if not (path / ".metadata").is_file():
        raise InitError(
            f"init_from={source}: a folder without .metadata is no sharded checkpoint; give a "
            "step-*.dcp folder, a weights file or a checkpoint file"
        )
    if (path / sharded_checkpoint.TRAINER_STATE).exists() and not (
        sharded_checkpoint.is_complete(path)
    ):
        raise InitError(
            f"init_from={source}: an incomplete sharded checkpoint (no "
            f"{sharded_checkpoint.COMPLETE} marker: its save never finished); give a complete one"
        )
    _check_metadata(source, path)
    # torch's own converter (format_utils.dcp_to_torch_save) reads a folder this way; it writes
    # the result to a file, where this keeps it in memory and reads the model's entries only.
    from torch.distributed.checkpoint import FileSystemReader
    from torch.distributed.checkpoint.api import CheckpointException
    from torch.distributed.checkpoint.default_planner import _EmptyStateDictLoadPlanner
    from torch.distributed.checkpoint.state_dict_loader import _load_state_dict

    def load(keys: set[str] | None) -> dict[str, Any]:
        state: dict[str, Any] = {}
        _load_state_dict(
            state,
            storage_reader=FileSystemReader(path),
            planner=_EmptyStateDictLoadPlanner(keys=keys),
            no_dist=True,
        )
        return state

    try:
        state = load({"model"})
        state = state["model"] if isinstance(state.get("model"), Mapping) else load(None)
    # DCP wraps what failed in a CheckpointException, a BaseException (not an Exception) whose
    # text is every rank's traceback: the first rank's own error is the one line to quote.
    except (Exception, CheckpointException) as err:
        raise InitError(
            f"init_from={source}: cannot read its shards ({_dcp_cause(err)}); {_DAMAGED_FIX}"
        ) from None
    return _tensors(source, state), "sharded checkpoint"


# What repairs a sharded checkpoint whose files torch cannot read.
_DAMAGED_FIX = (
    "the sharded checkpoint is damaged or incomplete: copy the folder again from where its run "
    "saved it, or give another step-*.dcp folder"
)


def _check_metadata(source: str, path: Path) -> None:
    """The folder's ``.metadata`` (DCP's index of every tensor's place in the shards) read
    first: damaged, it fails deep inside DCP's load, which names neither the file nor the
    folder."""
    from torch.distributed.checkpoint import FileSystemReader
    from torch.distributed.checkpoint.metadata import Metadata

    try:
        metadata = FileSystemReader(path).read_metadata()
    except Exception as err:
        problem = f"{type(err).__name__}: {first_line(err)}"
    else:
        if isinstance(metadata, Metadata):
            return
        problem = f"it holds a {type(metadata).__name__}, not DCP's Metadata"
    raise InitError(f"init_from={source}: its .metadata cannot be read ({problem}); {_DAMAGED_FIX}")


def _dcp_cause(err: BaseException) -> str:
    """``err``'s type and first line; for DCP's CheckpointException, its first rank's error's."""
    failures = getattr(err, "failures", None)
    if isinstance(failures, Mapping) and failures:
        wrapped = next(iter(failures.values()))
        if isinstance(wrapped, tuple) and wrapped and isinstance(wrapped[0], BaseException):
            err = wrapped[0]
    return f"{type(err).__name__}: {first_line(err)}"


def _tensors(source: str, state: Any) -> dict[str, torch.Tensor]:
    if not isinstance(state, Mapping) or not state:
        raise InitError(f"init_from={source}: holds no state dict (a mapping of names to tensors)")
    others = [str(k) for k, v in state.items() if not isinstance(v, torch.Tensor)]
    if others:
        raise InitError(
            f"init_from={source}: {others[0]!r} is no tensor; expected a state dict (a mapping "
            "of names to tensors)"
        )
    return {str(k): v for k, v in state.items()}


# ---------------------------------------------------------------------- matching
def _unwrapped(
    weights: dict[str, torch.Tensor], expected: Mapping[str, tuple[int, ...]]
) -> dict[str, torch.Tensor]:
    """Keys without a wrapper's prefix that every one of them has and the model's lack."""
    for prefix in _WRAPPER_PREFIXES:
        if all(k.startswith(prefix) for k in weights) and not any(
            k.startswith(prefix) for k in expected
        ):
            weights = {k[len(prefix) :]: v for k, v in weights.items()}
    return weights


def match(
    source: str,
    expected: Mapping[str, tuple[int, ...]],
    weights: dict[str, torch.Tensor],
    strict: bool,
) -> tuple[dict[str, torch.Tensor], str]:
    """The tensors to load, and the report of what did not match (empty: everything did)."""
    for name, shape in expected.items():
        if name in weights and tuple(weights[name].shape) != shape:
            raise InitError(
                f"init_from={source}: {name} has shape {list(weights[name].shape)} there but "
                f"{list(shape)} in the model; start from weights of the same model"
            )
    missing = [name for name in expected if name not in weights]
    unexpected = [name for name in weights if name not in expected]
    if not missing and not unexpected:
        return weights, ""
    if not set(expected) & set(weights):
        raise InitError(
            f"init_from={source}: none of its {len(weights)} keys ({_names(unexpected)}) is the "
            f"model's ({_names(missing)}); start from weights of the same model"
        )
    report = f": missing {len(missing)} ({_names(missing)}), unexpected {len(unexpected)} " + (
        f"({_names(unexpected)})"
    )
    if strict:
        raise InitError(
            f"init_from={source}{report}; start from weights of the same model, or pass "
            "--no-init-strict to load the keys that match"
        )
    loaded = {name: weights[name] for name in expected if name in weights}
    return loaded, f"; not strict{report}: those keep their initial values"


def _names(keys: list[str]) -> str:
    if not keys:
        return "none"
    more = f", +{len(keys) - _NAMED} more" if len(keys) > _NAMED else ""
    return ", ".join(keys[:_NAMED]) + more


def _load(model: nn.Module, weights: dict[str, torch.Tensor]) -> None:
    """Into the model's parameters and buffers in place: plain tensors by ``load_state_dict``,
    FSDP's sharded ones by DCP's ``set_model_state_dict`` (each rank keeps its shard)."""
    sharded = any(type(t).__name__ == "DTensor" for t in model.state_dict().values())
    if sharded:
        from torch.distributed.checkpoint.state_dict import StateDictOptions, set_model_state_dict

        options = StateDictOptions(full_state_dict=True, strict=False)
        set_model_state_dict(model, weights, options=options)
    else:
        model.load_state_dict(weights, strict=False)
