"""``python -m dt_commands.preview_jobs --stack NAME PREVIEW_JSON``: the training jobs a
``pulumi preview --json`` would create, replace or delete, and why, as Markdown for the pull
request's preview comment.
Why it is built this way: docs/internals.md, `dt_commands/preview_jobs.py`."""

from __future__ import annotations

import json
import shlex
import sys
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from infra.job import KEEPS_IMAGE
from infra.job_spec import run_folder, run_name
from trainer.common.cli import OneLineParser, fail

DYNAMIC_TYPE = "pulumi-python:dynamic:Resource"
# A job of the AzureML backend (infra.azureml_job): a native command or sweep job whose name
# any change renews, so a change is a replacement with the engine's reason "id".
AZUREML_JOB_TYPE = "azure-native:machinelearningservices:Job"
# Why an AzureML job is replaced, by the property that differs (a sweep's in its trial).
AZUREML_REASONS = {
    "environmentId": "new trainer image (an image input changed)",
    "command": "trainer settings or the job's command changed",
    "resources": "node count changed",
    "limits": "limits changed (an AzureML job never changes: a new job)",
    "environmentVariables": "tracking or node identity changed",
    "computeId": "compute cluster replaced",
    "searchSpace": "sweep changed",
    "objective": "sweep changed",
    "samplingAlgorithm": "sweep changed",
    "earlyTermination": "sweep changed",
    "experimentName": "experiment changed",
}
# A replacement shows as up to three steps of one URN (delete-before-replace: delete-replaced,
# replace, create-replacement); a step of any of them makes the job "replaced".
REPLACE_OPS = ("replace", "create-replacement", "delete-replaced")
# Why a job is replaced, in the words of the stack settings that change these inputs.
REASONS = {
    "image_ref": "new trainer image (an image input changed)",
    "trainer_args": "trainer settings changed",
    "command": "the job's command changed",
    "engine": "the job's engine changed",
    "code_sha256": "the job's code changed (jobs.<name>.code: a new snapshot, no image rebuild)",
    "node_count": "node count changed",
    "vm_size": "VM size changed",
    "dataset_prefix": "dataset changed",
    "priority": "priority changed",
    "pool_id": "pool replaced",
    "endpoint": "Batch account replaced",
    "account_id": "Batch account replaced",
    "registry_server": "registry replaced",
    "node_identity_id": "node identity replaced",
    "node_identity_client_id": "node identity replaced",
    "blob_endpoint": "storage account replaced",
}


class PreviewError(ValueError):
    """The file is not a preview digest."""


@dataclass(frozen=True)
class JobChange:
    name: str
    change: str  # created | replaced | deleted | kept running
    reasons: tuple[str, ...]
    training: str
    runs: str = ""  # what a created or replaced job's workers run (and its code snapshot)


def _is_job(state: Any) -> bool:
    return (
        isinstance(state, dict)
        and state.get("type") == DYNAMIC_TYPE
        and isinstance(state.get("inputs"), dict)
        and "trainer_args" in state["inputs"]
    )


def _is_azureml_job(state: Any) -> bool:
    return (
        isinstance(state, dict)
        and state.get("type") == AZUREML_JOB_TYPE
        and isinstance(state.get("inputs"), dict)
        and isinstance(state["inputs"].get("properties"), dict)
    )


def _azureml(state: dict[str, Any]) -> tuple[dict[str, Any], dict[str, Any]]:
    """(the job's properties, its trial's or its own: where its command is)."""
    props = state["inputs"]["properties"]
    trial = props.get("trial") if isinstance(props.get("trial"), dict) else props
    return props, trial


def _azureml_reasons(old: dict[str, Any], new: dict[str, Any]) -> tuple[str, ...]:
    """Why the job is replaced: the properties that differ, its command compared without its
    own name (its Blob folders carry it, and any change renews it)."""

    def seen(state: dict[str, Any]) -> dict[str, Any]:
        props, trial = _azureml(state)
        values = {**props, **trial}
        if isinstance(values.get("command"), str):
            values["command"] = values["command"].replace(str(state["inputs"].get("id")), "")
        return values

    before, after = seen(old), seen(new)
    keys = [key for key in AZUREML_REASONS if before.get(key) != after.get(key)]
    return tuple(dict.fromkeys(AZUREML_REASONS[k] for k in keys)) or ("the job changed",)


def azureml_run(state: dict[str, Any]) -> str:
    tags = _azureml(state)[0].get("tags") or {}
    stack, run = tags.get("stack"), tags.get("run")
    return f"checkpoints/{stack}/{run}/" if isinstance(run, str) and stack else ""


def _azureml_training(old: dict[str, Any] | None, new: dict[str, Any]) -> str:
    """Where the AzureML job's run lives: its checkpoints mirrored to Blob (a sweep's trials
    each train afresh)."""
    if _azureml(new)[0].get("jobType") == "Sweep":
        return "a sweep: each trial trains afresh"
    folder = azureml_run(new)
    if not folder:
        return "run known after the update"
    before = azureml_run(old) if old is not None else ""
    if old is None or before == folder:
        return f"resumes from the newest checkpoint in Blob {folder} (if there is one)"
    return f"starts a fresh run in Blob {folder} (the old run's checkpoints stay in {before})"


def azureml_runs(state: dict[str, Any]) -> str:
    """What the job's workers run: its command after the launcher's ``--``."""
    command = _azureml(state)[1].get("command")
    try:
        words = shlex.split(command) if isinstance(command, str) else []
    except ValueError:
        return ""
    return shlex.join(words[words.index("--") + 1 :]) if "--" in words else ""


def azureml_name(state: dict[str, Any], urn: str) -> str:
    name = (_azureml(state)[0].get("tags") or {}).get("job")
    return name if isinstance(name, str) and name else urn.rsplit("::", 1)[-1]


def _run_folder(inputs: dict[str, Any]) -> str | None:
    """The run folder these inputs train in; None when a value is unknown at preview."""
    args, stack = inputs.get("trainer_args"), inputs.get("stack")
    prefix, name = inputs.get("dataset_prefix", ""), inputs.get("name", "")
    if not (isinstance(args, list) and all(isinstance(a, str) for a in args)):
        return None
    if not (isinstance(prefix, str) and isinstance(name, str) and isinstance(stack, str)):
        return None
    return run_folder(stack, run_name(args, prefix, name))


def _runs(inputs: dict[str, Any]) -> str:
    """What the job's workers run, as dt-plan says it: its own command and engine, or the
    trainer with its flags; then its code snapshot's hash. "" for a value unknown at preview."""
    command, args = inputs.get("command") or [], inputs.get("trainer_args") or []
    words = command if command else ["python", "-m", "trainer", *args]
    if not all(isinstance(w, str) for w in words):
        return ""
    runs = shlex.join(words)
    if command:
        runs += f" (engine {inputs.get('engine')}, its own command)"
    code = inputs.get("code_sha256")
    if isinstance(code, str) and code:
        runs += f"; code sha256 {code}"
    return runs


def _job_name(state: dict[str, Any], urn: str) -> str:
    name = state["inputs"].get("name")
    return name if isinstance(name, str) and name else urn.rsplit("::", 1)[-1]


def _reasons(keys: list[str]) -> tuple[str, ...]:
    seen: dict[str, None] = {}
    for key in keys:
        seen.setdefault(REASONS.get(key, f"{key} changed"), None)
    return tuple(seen)


def _outputs(state: dict[str, Any]) -> dict[str, Any]:
    """A state's outputs; {} when the digest has none or another shape there."""
    outputs = state.get("outputs")
    return outputs if isinstance(outputs, dict) else {}


def _training(old: dict[str, Any] | None, new: dict[str, Any]) -> str:
    folder = _run_folder(new["inputs"])
    if folder is None:
        return "run folder known after the update"
    if old is None:
        return f"trains in {folder} (resumes if checkpoints are there)"
    before = _outputs(old).get("checkpoint_path") or _run_folder(old["inputs"])
    if before == folder:
        return f"resumes from the newest checkpoint in {folder}"
    return f"starts a fresh run in {folder} (the old run's checkpoints stay in {before})"


def job_changes(digest: Any) -> list[JobChange]:
    """The jobs the preview creates, replaces or deletes, in the order of its steps."""
    if not isinstance(digest, dict) or not isinstance(digest.get("steps", []), list):
        raise PreviewError("not a `pulumi preview --json` digest (no list of steps)")
    by_urn: dict[str, dict[str, Any]] = {}
    aml_by_urn: dict[str, dict[str, Any]] = {}
    for step in digest.get("steps", []):
        if not isinstance(step, dict) or not isinstance(step.get("urn"), str):
            raise PreviewError("a step without a urn: not a `pulumi preview --json` digest")
        old, new = step.get("oldState"), step.get("newState")
        if _is_azureml_job(old) or _is_azureml_job(new):
            aml = aml_by_urn.setdefault(step["urn"], {"ops": []})
            aml["ops"].append(step.get("op"))
            aml.setdefault("old", old if _is_azureml_job(old) else None)
            aml["new"] = new if _is_azureml_job(new) else aml.get("new")
            continue
        if not (_is_job(old) or _is_job(new)):
            continue
        entry = by_urn.setdefault(step["urn"], {"ops": [], "reasons": []})
        entry["ops"].append(step.get("op"))
        reasons = step.get("replaceReasons")
        entry["reasons"] += (
            [r for r in reasons if isinstance(r, str)] if isinstance(reasons, list) else []
        )
        if _is_job(old):
            entry.setdefault("old", old)
        if _is_job(new):
            entry["new"] = new
    changes = []
    for urn, entry in by_urn.items():
        ops, old, new = entry["ops"], entry.get("old"), entry.get("new")
        if any(op in REPLACE_OPS for op in ops) and new is not None:
            training, runs = _training(old, new), _runs(new["inputs"])
            reasons = _reasons(entry["reasons"])
            changes.append(JobChange(_job_name(new, urn), "replaced", reasons, training, runs))
        elif "create" in ops and new is not None:
            training, runs = _training(None, new), _runs(new["inputs"])
            changes.append(JobChange(_job_name(new, urn), "created", (), training, runs))
        elif "delete" in ops and old is not None:
            folder = _outputs(old).get("checkpoint_path") or _run_folder(old["inputs"])
            changes.append(
                JobChange(_job_name(old, urn), "deleted", (), f"checkpoints stay in {folder}")
            )
    return changes + _azureml_changes(aml_by_urn) + _kept_running(digest)


def _azureml_changes(by_urn: dict[str, dict[str, Any]]) -> list[JobChange]:
    changes = []
    for urn, entry in by_urn.items():
        ops, old, new = entry["ops"], entry.get("old"), entry.get("new")
        if any(op in REPLACE_OPS for op in ops) and old is not None and new is not None:
            name, reasons = azureml_name(new, urn), _azureml_reasons(old, new)
            training, runs = _azureml_training(old, new), azureml_runs(new)
            changes.append(JobChange(name, "replaced", reasons, training, runs))
        elif "create" in ops and new is not None:
            training, runs = _azureml_training(None, new), azureml_runs(new)
            changes.append(JobChange(azureml_name(new, urn), "created", (), training, runs))
        elif "delete" in ops and old is not None:
            kept = f"its record stays in the workspace; checkpoints stay in Blob {azureml_run(old)}"
            changes.append(JobChange(azureml_name(old, urn), "deleted", (), kept))
    return changes


def _diagnostics(digest: dict[str, Any], severity: str) -> list[dict[str, Any]]:
    found = digest.get("diagnostics")
    return [
        d
        for d in (found if isinstance(found, list) else [])
        if isinstance(d, dict)
        and d.get("severity") == severity
        and isinstance(d.get("message"), str)
    ]


def _kept_running(digest: dict[str, Any]) -> list[JobChange]:
    """Running jobs a new image waits for (infra/job.py: their provider's warning)."""
    kept = []
    for warning in _diagnostics(digest, "warning"):
        message = warning["message"].strip()
        if KEEPS_IMAGE in message and message.startswith("job "):
            name = message.split()[1]
            why = "new trainer image waits until the job ends (or is listed in replaceJobs)"
            kept.append(JobChange(name, "kept running", (why,), message))
    return kept


def errors(digest: Any) -> list[str]:
    """The preview's error messages, one line each."""
    if not isinstance(digest, dict):
        return []
    return [" ".join(d["message"].split()) for d in _diagnostics(digest, "error")]


def _cell(text: str) -> str:
    """``text`` as code in one Markdown table cell (a ``|`` in a command would split it)."""
    escaped = text.replace("|", "\\|")
    return f"`{escaped}`" if text else "-"


def render(stack: str, changes: list[JobChange], failures: Sequence[str] = ()) -> str:
    title = f"### Training jobs: stack `{stack}`\n\n"
    if failures:
        title += "**The preview failed**, so what follows may be incomplete:\n\n"
        title += "".join(f"- {failure}\n" for failure in failures) + "\n"
    if not changes:
        return title + "No training job is created, replaced or deleted.\n"
    replaced = sum(c.change == "replaced" for c in changes)
    lines = [
        "| job | change | why | training | runs |",
        "|---|---|---|---|---|",
        *(
            f"| {c.name} | {c.change} | {'; '.join(c.reasons) or '-'} | {c.training} | "
            f"{_cell(c.runs)} |"
            for c in changes
        ),
    ]
    note = ""
    if replaced:
        note = (
            f"\n{replaced} running job(s) would be terminated (each checkpoints first) and "
            "submitted again. With protectRunningJobs, `pulumi up` refuses to replace a job "
            "that is still running unless it is listed in replaceJobs.\n"
        )
    return title + "\n".join(lines) + "\n" + note


def main(argv: list[str] | None = None) -> int:
    parser = OneLineParser(prog="python -m dt_commands.preview_jobs", description=__doc__)
    parser.add_argument("--stack", required=True, help="the stack the preview is of")
    parser.add_argument("preview", type=Path, help="the output of `pulumi preview --json`")
    args = parser.parse_args(argv)
    try:
        digest = json.loads(args.preview.read_bytes())
        changes, failures = job_changes(digest), errors(digest)
    except OSError as err:
        fail(f"{args.preview}: cannot read it ({err.strerror or err})", 1)
    except (json.JSONDecodeError, UnicodeDecodeError, RecursionError):
        fail(f"{args.preview}: not JSON; give the output of `pulumi preview --json`", 2)
    except PreviewError as err:
        fail(f"{args.preview}: {err}", 2)
    sys.stdout.write(render(args.stack, changes, failures))
    return 0


if __name__ == "__main__":
    sys.exit(main())
