"""``--init-from``: a fresh run starts from weights in each format, from a local path or a Blob
URL (Azurite over HTTPS with the managed identity's tokens, as on a node); strict refuses keys
that do not match, relaxed reports them in one line; the run's own checkpoint wins; a bad
source is one line, exit 2 (an environment fault exit 1), with nothing written.

Each refusal is decided in this process (``refused``: the run set up and resumed until the
weights are refused, then the command's own ``fail``); ``python -m trainer`` itself runs once per
exit code, for a damaged sharded checkpoint (exit 2) and unreachable storage (exit 1): each
``python -m trainer`` pays seconds of torch's import for a one-line answer."""

from __future__ import annotations

import logging
import pickle
import shutil
import subprocess
import sys
from pathlib import Path

import pytest
import torch
from safetensors.torch import save_file

from tests.conftest import tiny_config as base_config
from trainer.checkpoints import single_file
from trainer.checkpoints.init_from import InitError
from trainer.common.cli import fail
from trainer.engines.local import LocalDist
from trainer.models.build import build_model
from trainer.settings.flags import to_flags
from trainer.settings.train_config import DEFAULTS
from trainer.training.run import _Run, train
from trainer.watch.signals import StopRequest

REPO = Path(__file__).resolve().parents[3]


def tiny_config(output_dir: Path, **extra):
    return DEFAULTS.replace(**base_config(output_dir, **{"backend": "local", **extra}))


@pytest.fixture(scope="module")
def source(tmp_path_factory) -> dict:
    """Weights to start from: another run's (2 steps) final checkpoint and results, and its
    state dict in every other format, beside a fresh model's."""
    folder = tmp_path_factory.mktemp("source")
    train(tiny_config(folder / "run", max_steps=2), LocalDist())
    _, state = single_file.load_latest(folder / "run" / "checkpoints")
    weights = state["model"]
    torch.save(weights, folder / "plain.pt")
    torch.save({"state_dict": {f"module.{k}": v for k, v in weights.items()}}, folder / "ddp.pt")
    renamed = {k.replace("fc.", "head."): v for k, v in weights.items()}
    save_file(renamed, str(folder / "renamed.safetensors"))
    save_file({k: v for k, v in weights.items() if not k.startswith("fc.")}, str(folder / "no_fc"))
    import torch.distributed.checkpoint as dcp

    dcp.save({"model": weights, "optimizer": {}}, checkpoint_id=folder / "step-000000002.dcp")
    (folder / "step-000000002.dcp" / "complete").write_text("{}")
    (folder / "garbage.bin").write_bytes(b"not weights at all")
    wider = build_model("tiny", 7).state_dict()
    torch.save(wider, folder / "seven_classes.pt")
    return {
        "folder": folder,
        "weights": weights,
        "checkpoint": single_file.list_checkpoints(folder / "run" / "checkpoints")[0][1],
    }


def started(cfg) -> dict[str, torch.Tensor]:
    """The model's weights once a run has started (resumed or initialized), before any step."""
    run = _Run(cfg, LocalDist(), StopRequest())
    run.resume()
    run.checkpointer.close()
    return {k: v.detach().clone() for k, v in run.model.state_dict().items()}


@pytest.mark.parametrize(
    ("name", "kind"),
    [
        ("run/results/model.safetensors", "safetensors"),
        ("plain.pt", "torch state dict"),
        ("ddp.pt", "torch file, its 'state_dict' entry"),
        ("checkpoint", "checkpoint"),
        ("step-000000002.dcp", "sharded checkpoint"),
    ],
)
def test_each_format_starts_a_fresh_run_from_its_weights(source, tmp_path, capsys, name, kind):
    path = source["checkpoint"] if name == "checkpoint" else source["folder"] / name
    weights = started(tiny_config(tmp_path / "run", init_from=str(path)))
    fresh = build_model("tiny", 5).state_dict()
    assert any(not torch.equal(fresh[k], v) for k, v in source["weights"].items())
    for key, tensor in source["weights"].items():
        assert torch.equal(weights[key], tensor), key
    out = capsys.readouterr().out
    assert f"init_from={path}: started from {len(weights)} tensors ({kind})\n" in out


def test_relaxed_loads_what_matches_and_reports_the_rest_in_one_line(source, tmp_path, capsys):
    path = source["folder"] / "renamed.safetensors"
    weights = started(tiny_config(tmp_path / "run", init_from=str(path), init_strict=False))
    assert torch.equal(weights["features.0.weight"], source["weights"]["features.0.weight"])
    assert not torch.equal(weights["fc.weight"], source["weights"]["fc.weight"])
    line = next(li for li in capsys.readouterr().out.splitlines() if "init_from" in li)
    assert line == (
        f"init_from={path}: started from {len(weights) - 2} tensors (safetensors); not strict: "
        "missing 2 (fc.weight, fc.bias), unexpected 2 (head.bias, head.weight): those keep "
        "their initial values"
    )


def test_the_runs_own_checkpoint_wins_over_init_from(source, tmp_path, capsys):
    output = tmp_path / "run"
    train(tiny_config(output, max_steps=1), LocalDist())
    own = single_file.load_latest(output / "checkpoints")
    path = source["folder"] / "plain.pt"
    weights = started(tiny_config(output, max_steps=2, init_from=str(path)))
    for key, tensor in own[1]["model"].items():
        assert torch.equal(weights[key], tensor), key
    assert (
        f"init_from={path} not applied: the run resumes from its own checkpoint {own[0]}"
        in capsys.readouterr().out
    )


def _trainer(cfg, env=None) -> subprocess.CompletedProcess[str]:
    command = [sys.executable, "-m", "trainer", *to_flags(cfg)]
    return subprocess.run(command, cwd=REPO, env=env, capture_output=True, text=True, timeout=300)


def _one_line_exit(done, code: int, *parts: str) -> None:
    assert done.returncode == code, done.stdout[-2000:] + done.stderr[-2000:]
    lines = done.stderr.strip().splitlines()
    assert len(lines) == 1 and lines[0].startswith("error: init_from="), done.stderr
    for part in parts:
        assert part in lines[0], lines[0]


BAD = [
    ("missing.pt", "no such file or folder"),
    ("garbage.bin", "neither safetensors nor a torch file"),
    ("renamed.safetensors", "missing 2 (fc.weight, fc.bias), unexpected 2 (head.bias, "),
    ("no_fc", "pass --no-init-strict"),
    ("seven_classes.pt", "fc.weight has shape [7, 32] there but [5, 32] in the model"),
    ("run", "a folder without .metadata is no sharded checkpoint"),
]


def refused(cfg, capsys, caplog) -> subprocess.CompletedProcess[str]:
    """How ``python -m trainer`` would end for ``cfg``, whose --init-from source is refused,
    decided in this process: the run set up and resumed (as ``started`` does) until it raises
    the InitError, which is then given to the command's ``fail`` with its exit code, as
    trainer/__main__.py does. stderr: what was logged (the command logs to stderr) and written
    there on the way, then that line. That the command itself ends so:
    test_the_command_ends_a_refused_source_with_its_one_line_and_exit_2 and
    test_unreachable_storage_is_an_environment_fault_exit_1."""
    capsys.readouterr()  # what the test printed before: not this run's
    with caplog.at_level(logging.INFO):
        start = len(caplog.records)
        run = _Run(cfg, LocalDist(), StopRequest())
        try:
            with pytest.raises(InitError) as error:
                run.resume()
        finally:
            run.checkpointer.close()
        # The command's log level: INFO (trainer/__main__.py, logging.basicConfig).
        logged = "".join(
            f"{record.getMessage()}\n"
            for record in caplog.records[start:]
            if record.levelno >= logging.INFO
        )
    with pytest.raises(SystemExit) as exit_:
        fail(str(error.value), error.value.exit_code)
    captured = capsys.readouterr()
    return subprocess.CompletedProcess([], exit_.value.code, captured.out, logged + captured.err)


@pytest.mark.parametrize(("name", "expected"), BAD)
def test_a_bad_source_is_one_line_exit_2_and_nothing_written(
    source, tmp_path, capsys, caplog, name, expected
):
    output = tmp_path / "run"
    cfg = tiny_config(output, init_from=str(source["folder"] / name))
    _one_line_exit(refused(cfg, capsys, caplog), 2, expected)
    assert not output.exists()


def _truncated(data: bytes) -> bytes | None:
    return data[: len(data) // 2]


# A damaged copy of a sharded checkpoint: its file, what happened to it (None: removed), and
# what the one line must say of it besides the folder.
DAMAGED = {
    "truncated metadata": (".metadata", _truncated, "its .metadata cannot be read (Unpickling"),
    "garbage metadata": (".metadata", lambda data: b"x" * len(data), "its .metadata cannot be"),
    "empty metadata": (".metadata", lambda data: b"", "its .metadata cannot be read"),
    "metadata of something else": (".metadata", lambda data: pickle.dumps({"a": 1}), "dict"),
    "missing shard": ("__0_0.distcp", lambda data: None, "__0_0.distcp"),
    "truncated shard": ("__0_0.distcp", _truncated, "cannot read its shards"),
}


def _damaged_copy(source: dict, tmp_path: Path, damage: str) -> Path:
    """A copy of the source's sharded checkpoint with ``damage`` done to it (DAMAGED)."""
    folder = tmp_path / "step-000000002.dcp"
    shutil.copytree(source["folder"] / "step-000000002.dcp", folder)
    name, change, _ = DAMAGED[damage]
    data = change((folder / name).read_bytes())
    if data is None:
        (folder / name).unlink()
    else:
        (folder / name).write_bytes(data)
    return folder


@pytest.mark.parametrize("damage", DAMAGED)
def test_a_damaged_sharded_checkpoint_is_one_line_exit_2_and_nothing_written(
    source, tmp_path, capsys, caplog, damage
):
    """torch reports a folder it cannot read with a CheckpointException, which is no
    ``Exception`` (a BaseException carrying each rank's traceback): one line all the same."""
    folder = _damaged_copy(source, tmp_path, damage)
    output = tmp_path / "run"
    done = refused(tiny_config(output, init_from=str(folder)), capsys, caplog)
    _one_line_exit(done, 2, f"init_from={folder}: ", DAMAGED[damage][2], "copy the folder again")
    assert not output.exists()


def test_the_command_ends_a_refused_source_with_its_one_line_and_exit_2(source, tmp_path):
    """``python -m trainer`` itself, for the refusals above that are decided in process: a
    shard torch cannot read (its CheckpointException, a BaseException, must not escape as a
    traceback) is one line on stderr, exit 2, nothing written."""
    folder = _damaged_copy(source, tmp_path, "truncated shard")
    output = tmp_path / "run"
    done = _trainer(base_config(output, backend="local", init_from=str(folder)))
    _one_line_exit(done, 2, f"init_from={folder}: ", "cannot read its shards", "copy the folder")
    assert not output.exists()


# ---------------------------------------------------------------------- Blob storage
def test_weights_and_a_sharded_checkpoint_from_blob_urls(
    source, tmp_path, entra_env, capsys, caplog
):
    """A file's URL and a folder's URL (a prefix: Blob storage has no folders), read with the
    managed identity's tokens (``entra_env``: this process's), by a one-step run each, here in
    process; ``python -m trainer`` reads a URL in the exit-1 test below."""
    weights = entra_env.container("weights-init-from")
    weights.create_container()
    try:
        file = source["folder"] / "run" / "results" / "model.safetensors"
        weights.upload_blob("team/model.safetensors", file.read_bytes())
        dcp_folder = source["folder"] / "step-000000002.dcp"
        for part in dcp_folder.iterdir():
            weights.upload_blob(f"runs/a/step-000000002.dcp/{part.name}", part.read_bytes())
        for blob, kind in (
            ("team/model.safetensors", "safetensors"),
            ("runs/a/step-000000002.dcp", "sharded checkpoint"),
        ):
            url = entra_env.folder_url("weights-init-from", blob)
            run = tmp_path / kind.replace(" ", "-")
            result = train(tiny_config(run, max_steps=1, init_from=url), LocalDist())
            assert result.step == 1, result  # the run trained from them
            assert f"init_from={url}: started from 14 tensors ({kind})" in capsys.readouterr().out
        missing = entra_env.folder_url("weights-init-from", "team/other.safetensors")
        output = tmp_path / "missing"
        done = refused(tiny_config(output, init_from=missing), capsys, caplog)
        _one_line_exit(done, 2, "no blob or folder of that name")
        assert not output.exists()
    finally:
        weights.delete_container()


def test_unreachable_storage_is_an_environment_fault_exit_1(tmp_path, entra_env):
    from tests.support.ports import free_port

    url = f"https://127.0.0.1:{free_port()}/devstoreaccount1/weights/model.safetensors"
    output = tmp_path / "run"
    done = _trainer(base_config(output, backend="local", init_from=url))
    _one_line_exit(done, 1, "cannot download (ServiceRequestError")
    assert not output.exists()


class _HierarchicalContainer:
    """A container of an account with a hierarchical namespace, as Blob storage presents it:
    every folder is also a zero-length blob with metadata ``hdi_isfolder=true``, listed with
    the files ("directories appear in the list as zero-length blobs",
    learn.microsoft.com/azure/storage/blobs/storage-blobs-list). Azurite has no such accounts;
    this takes that reading for the folder the URL names and for a folder inside it."""

    url = "https://acct.blob.core.windows.net/weights"

    def __init__(self, files: dict[str, bytes], folders: list[str]) -> None:
        from types import SimpleNamespace

        self.blobs = {n: SimpleNamespace(name=n, metadata={}, data=d) for n, d in files.items()}
        for name in folders:
            marker = {"hdi_isfolder": "true"}
            self.blobs[name] = SimpleNamespace(name=name, metadata=marker, data=b"")

    def get_blob_client(self, name: str):
        from types import SimpleNamespace

        from azure.core.exceptions import ResourceNotFoundError

        def properties():
            if name not in self.blobs:
                raise ResourceNotFoundError("The specified blob does not exist.")
            return self.blobs[name]

        return SimpleNamespace(get_blob_properties=properties)

    def list_blobs(self, name_starts_with: str, include: list[str]):
        return [b for n, b in sorted(self.blobs.items()) if n.startswith(name_starts_with)]

    def download_blob(self, name: str, max_concurrency: int = 1):
        from types import SimpleNamespace

        data = self.blobs[name].data
        return SimpleNamespace(readinto=lambda file: file.write(data))


def test_a_folder_that_is_also_a_blob_is_downloaded_as_a_folder(source, tmp_path):
    from trainer.checkpoints.init_from import _fetch

    dcp_folder = source["folder"] / "step-000000002.dcp"
    files = {f"runs/a/{p.name}": p.read_bytes() for p in dcp_folder.iterdir()}
    container = _HierarchicalContainer(files, ["runs/a", "runs/a/sub"])
    got = _fetch(container, "runs/a", tmp_path)
    assert sorted(p.name for p in got.iterdir()) == sorted(p.name for p in dcp_folder.iterdir())
    assert not (got / "sub").exists()
