"""``dt-jobs fetch --stack NAME [--job NAME] [--to DIR] [--force] [--register MODEL]``: download
a finished job's results (and register its model: dt_commands.jobs.model_registry).

The trainer's rank 0 uploads them to the job's ``outputs_url`` (``trainer.outputs.results``: the
final weights, config, metrics and evaluation, then ``manifest.json`` last, listing every file with
its SHA-256). Here the manifest is read first: without one the run has not finished (or is uploading
its results), and nothing is downloaded. Every file is checked against the manifest in a hidden
folder beside ``DIR``, which is renamed into place only once all of them match: ``DIR`` holds a
complete, verified set or is left as it was. The reads use the process's one
credential (``infra.credentials``: ``az login``; Storage Blob Data Reader on ``outputs``, which
the stack grants its deployer and its team), as ``metrics`` does.
"""

from __future__ import annotations

import argparse
import hashlib
import os
import shutil
from contextlib import suppress
from pathlib import Path
from typing import Any, TextIO

from dt_commands.jobs.call import Call
from dt_commands.jobs.model_registry import register, registry_uri
from dt_commands.stack_outputs import Job, JobsError, OutputsError
from infra.live_metrics import NotUploaded, StorageError, blob_container, storage_errors
from trainer.common.blob_folder import BlobFolder
from trainer.common.files import partial_path
from trainer.outputs.results_manifest import MANIFEST, ResultsError, parse_manifest

NAME = "fetch"
HELP = "download the finished run's results, verified against their manifest"


def add_arguments(sub: argparse.ArgumentParser) -> None:
    sub.add_argument("--to", type=Path, help="local folder (default: results/<job>)")
    sub.add_argument("--force", action="store_true", help="replace a non-empty --to")
    sub.add_argument(
        "--register",
        metavar="MODEL",
        help="then register the run's model as a new version of MODEL in the stack's AzureML "
        "workspace, with its lineage (--init-from models:/MODEL/VERSION starts from it)",
    )


def run(call: Call) -> int:
    job = call.job()
    name = call.args.register
    uri = registry_uri(call.outputs, call.stack, name) if name is not None else None
    code = fetch_job(job, call.stack, call.args.to, call.args.force, call.out)
    if uri is not None and name is not None:
        call.out.write(register(uri, call.outputs, job, name) + "\n")
    return code


class ResultsMissing(StorageError):
    """The job's outputs folder has no manifest: its run has not finished."""


def fetch_job(job: Job, stack: str, dest: Path | None, force: bool, out: TextIO) -> int:
    """``fetch``: the job's results into ``dest`` (default ``results/<job>``)."""
    folder = outputs_folder(job, stack)
    dest = dest if dest is not None else Path("results", job.name)
    refuse_existing(dest, force)
    return fetch(blob_container(folder), folder, f"job {job.name} ({job.job_id})", dest, out)


def outputs_folder(job: Job, stack: str) -> BlobFolder:
    """The job's ``outputs_url`` output, parsed; OutputsError when absent or invalid."""
    url = job.outputs.get("outputs_url")
    if url is None:
        raise OutputsError(
            f"stack={stack}: job {job.name} has no outputs_url output; is `pulumi up` done with "
            "this version?"
        )
    try:
        return BlobFolder.parse(url)
    except ValueError as err:
        raise OutputsError(f"stack={stack}: output outputs_url={url!r}: {err}") from None


def refuse_existing(dest: Path, force: bool) -> None:
    """JobsError when ``dest`` is not a folder, or has something in it and no ``force``:
    fetching never mixes two result sets, nor drops someone's files unasked."""
    if dest.exists() and not dest.is_dir():
        raise JobsError(f"to={dest}: is not a folder; give a folder with --to")
    if dest.is_dir() and any(dest.iterdir()) and not force:
        raise JobsError(
            f"to={dest}: exists and is not empty; pass --force to replace it, or another --to"
        )


def fetch(container: Any, folder: BlobFolder, job_label: str, dest: Path, out: TextIO) -> int:
    """Download the results in ``folder`` into ``dest`` (replaced whole), verified."""
    manifest_url = folder.url + MANIFEST
    try:
        with storage_errors(manifest_url):
            manifest = container.download_blob(folder.blob(MANIFEST)).readall()
    except NotUploaded:
        raise ResultsMissing(
            f"{job_label}: no results at {folder.url} yet ({MANIFEST} is missing): the run has "
            "not finished, or is uploading them; try again once the job has completed"
        ) from None
    try:
        entries = parse_manifest(manifest, manifest_url)
    except ResultsError as err:
        raise StorageError(str(err)) from None
    dest = dest.absolute()
    temp = partial_path(dest)
    try:
        dest.parent.mkdir(parents=True, exist_ok=True)
        temp.mkdir()
        total = 0
        for entry in entries:
            url = folder.url + entry.name
            digest = hashlib.sha256()
            target = temp / entry.name
            try:
                with storage_errors(url), open(target, "wb") as file:
                    for chunk in container.download_blob(folder.blob(entry.name)).chunks():
                        digest.update(chunk)
                        file.write(chunk)
            except NotUploaded:
                raise StorageError(
                    f"{url}: listed in {MANIFEST} but not uploaded: the results are being "
                    f"replaced; nothing was written to {dest}"
                ) from None
            if digest.hexdigest() != entry.sha256:
                raise StorageError(
                    f"{url}: SHA-256 {digest.hexdigest()} differs from {MANIFEST}'s "
                    f"{entry.sha256}: the upload is damaged or being replaced; nothing was "
                    f"written to {dest}"
                )
            total += target.stat().st_size
        (temp / MANIFEST).write_bytes(manifest)
        _replace(temp, dest)
    except OSError as err:
        raise StorageError(
            f"to={dest}: cannot write the results there ({err.strerror or err}); nothing was "
            "written"
        ) from None
    finally:
        if temp.exists():
            shutil.rmtree(temp, ignore_errors=True)
    out.write(
        f"{job_label}: {len(entries)} file(s), {total:,} bytes, verified against {MANIFEST}, "
        f"in {dest}\n"
    )
    return 0


def _replace(temp: Path, dest: Path) -> None:
    """``temp`` renamed to ``dest``; an existing ``dest`` (``--force``) moved aside first and
    removed only once the new folder is in place."""
    if not dest.exists():
        os.replace(temp, dest)
        return
    old = dest.with_name(f".{dest.name}.old-{os.getpid()}")
    os.replace(dest, old)
    try:
        os.replace(temp, dest)
    except OSError:
        with suppress(OSError):
            os.replace(old, dest)  # put it back: the command changes nothing when it fails
        raise
    shutil.rmtree(old, ignore_errors=True)
