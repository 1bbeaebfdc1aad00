"""A job's code folder (``jobs.<name>.code``, docs/jobs.md, Your code without an image rebuild):
the setting read as a stack gives it (bad folders one line, exit 2, before anything exists),
the snapshot's hash as the job's input under Pulumi's mocks, the offline plan, and what a
changed folder replaces (the job, named as a code change in the preview; never the image)."""

from __future__ import annotations

import json
import subprocess
from pathlib import Path

import pytest

from dt_commands import preview_jobs
from dt_commands.plan import evaluate, render
from infra.code_snapshot import snapshot
from infra.image_packages import image_pins
from infra.job_spec import JobSpec
from infra.settings.checks import ConfigError
from infra.settings.jobs import job_settings
from tests.dt_commands.test_preview_jobs import _digest
from tests.infra.test_job_payloads import SPEC
from tests.support.stacks import CLIENT_IP, REPO, dt_plan_of_jobs, of_type, stack_values

JOB = "pulumi-python:dynamic:Resource"
IMAGE = "pulumi-python:dynamic/acr:ImageBuild"  # the dev stack's builder
MINE = {"command": "python train.py --steps 40", "code": "examples/torchrun_ddp", "nodes": 1}
# A job whose code is another folder, and the command a file of that folder.
CUSTOM = {**MINE, "command": "python model.py --steps 40"}


def _jobs(entry: dict) -> tuple:
    return job_settings({"jobs": {"mine": entry}, "node_count": 2}, {"jobs"})


def _stack(jobs: dict) -> dict:
    # The deployer's address: a code job's upload must get through the account's firewall.
    allowed = json.dumps([CLIENT_IP])
    return {
        **stack_values("dev"),
        "gpu-cluster:jobs": json.dumps(jobs),
        "gpu-cluster:storageAllowedIps": allowed,
    }


def _inputs(plan) -> dict[str, dict]:
    return {r.name: r.inputs for r in of_type(plan, JOB) if "trainer_args" in r.inputs}


def test_a_code_folder_is_read_into_its_snapshot_when_the_settings_load():
    (job,) = _jobs(MINE)
    expected = snapshot("examples/torchrun_ddp", REPO)
    assert job.code is not None and job.code.sha256 == expected.sha256
    assert job.code.folder == "examples/torchrun_ddp" and job.code.files >= 1
    (trainer_job,) = _jobs({"trainerConfig": "trainer/presets/demo.yaml", "code": "examples"})
    assert trainer_job.code is not None  # plug-ins (--model pkg.module:factory) use it too
    (plain,) = _jobs({"command": "python -m trainer --help"})
    assert plain.code is None


@pytest.mark.parametrize(
    ("code", "expected"),
    [
        ("examples/nowhere", "jobs.mine.code='examples/nowhere': no such folder; give a folder"),
        ("..", "jobs.mine.code='..': outside the repository; give a folder inside it"),
        (3, "jobs.mine.code"),
        ("", "jobs.mine.code='': empty, which would be the whole repository; give the folder"),
    ],
)
def test_bad_code_folders_are_one_line_naming_the_setting_and_the_fix(code, expected):
    with pytest.raises(ConfigError) as refused:
        _jobs({**MINE, "code": code})
    assert str(refused.value).startswith(expected)
    assert "\n" not in str(refused.value)


def test_the_plan_shows_the_code_hash_of_each_job_that_has_one():
    # A job without code runs what the image holds (the trainer's own modules).
    other = {"command": "python -m trainer.data --help"}
    plan = evaluate("dev", _stack({"mine": MINE, "other": other}))
    inputs = _inputs(plan)
    sha = snapshot("examples/torchrun_ddp", REPO).sha256
    assert inputs["platform-dev-job-mine"]["code_sha256"] == sha
    assert inputs["platform-dev-job-other"]["code_sha256"] == ""
    lines = render(plan, 160).splitlines()
    assert f"    code: snapshot sha256 {sha}" in lines
    assert sum(line.startswith("    code: ") for line in lines) == 1


def test_changed_code_replaces_the_job_named_as_a_code_change_and_not_the_image():
    # A command of the image's own (infra.runnable), so that only the folder changes.
    runs_trainer = {**MINE, "command": "python -m trainer.data --help"}
    before_plan = evaluate("dev", _stack({"mine": runs_trainer}))
    after_plan = evaluate(
        "dev", _stack({"mine": {**runs_trainer, "code": "examples/custom_model"}})
    )
    before, after = _inputs(before_plan), _inputs(after_plan)
    (change,) = preview_jobs.job_changes(_digest(before, after))
    assert (change.name, change.change) == ("mine", "replaced")
    assert change.reasons == (preview_jobs.REASONS["code_sha256"],)
    assert "code changed" in change.reasons[0]
    # The pull request's comment shows what the job now runs and from which snapshot.
    sha = snapshot("examples/custom_model", REPO).sha256
    command = "python -m trainer.data --help (engine torch, its own command)"
    assert change.runs == f"{command}; code sha256 {sha}"
    assert f"| `{change.runs}` |" in preview_jobs.render("dev", [change])
    old = JobSpec.from_props(before["platform-dev-job-mine"])
    new = JobSpec.from_props(after["platform-dev-job-mine"])
    assert old.job_id != new.job_id
    # The same command resumes in the same run folder: a code fix continues the run.
    assert old.run_name == new.run_name
    images = [[r.inputs for r in of_type(plan, IMAGE)] for plan in (before_plan, after_plan)]
    assert images[0] and images[0] == images[1]  # the image's inputs (and so its tag) do not move


def test_jobs_without_code_keep_their_ids():
    older = {k: v for k, v in SPEC.__dict__.items() if k != "code_sha256"}
    assert JobSpec.from_props(older).job_id == SPEC.job_id
    with_code = JobSpec(**{**SPEC.__dict__, "code_sha256": "ab" * 32})
    assert with_code.job_id != SPEC.job_id and with_code.run_name == SPEC.run_name


def test_a_missing_code_folder_stops_dt_plan_in_one_line_exit_2(tmp_path):
    result = dt_plan_of_jobs(tmp_path, "      command: python train.py\n      code: team/nowhere\n")
    assert result.returncode == 2, result.stderr
    assert result.stderr.strip() == (
        "error: jobs.mine.code='team/nowhere': no such folder; give a folder of the repository"
    )
    assert result.stdout == ""


def test_an_empty_code_stops_dt_plan_in_one_line_exit_2(tmp_path):
    result = dt_plan_of_jobs(tmp_path, "      command: python -m trainer --help\n      code: ''\n")
    assert result.returncode == 2, result.stderr
    assert result.stderr.startswith("error: jobs.mine.code='': empty, which would be the whole ")
    assert result.stderr.count("\n") == 1 and result.stdout == ""


def _team_repo(root: Path, link: str) -> Path:
    """A repository whose folder team/ holds a script and a link to ``link``."""
    (root / "team").mkdir(parents=True)
    (root / "team" / "train.py").write_text("print('team')\n")
    (root / "secret.txt").write_text("outside\n")
    (root / "team" / "data").symlink_to(link)
    subprocess.run(["git", "init", "-q", str(root)], check=True)
    subprocess.run(["git", "-C", str(root), "add", "."], check=True)
    return root


def _refused_by_dt_plan(tmp_path: Path, monkeypatch, capsys, repo: Path) -> str:
    """dt-plan as it runs, in-process, on a repository of the test's own
    (infra.settings.jobs.REPO) whose folder team/ is job mine's code: exit 2, nothing on
    stdout, and the one line it wrote to stderr."""
    from dt_commands.plan import main

    monkeypatch.setattr("infra.settings.jobs.REPO", repo)
    stack_file = tmp_path / "Pulumi.mine.yaml"
    stack_file.write_text(
        "config:\n  gpu-cluster:team: vision\n  gpu-cluster:jobs:\n    mine:\n"
        "      command: python train.py\n      code: team\n"
    )
    assert main(["--stack", "mine", "--stack-file", str(stack_file)]) == 2
    out, err = capsys.readouterr()
    assert out == "" and err.count("\n") == 1
    return err


@pytest.mark.parametrize("link", ["/etc", "../secret.txt"])
def test_a_link_leaving_the_code_folder_stops_dt_plan_in_one_line_exit_2(
    tmp_path, monkeypatch, capsys, link
):
    repo = _team_repo(tmp_path / "repo", link)
    err = _refused_by_dt_plan(tmp_path, monkeypatch, capsys, repo)
    assert err.startswith(
        f"error: jobs.mine.code='team': its link data points at {link}, outside the folder"
    )
    assert "replace it by the file it points at, or move that into the folder" in err


def _repo_with_requirements(root: Path, requirements: str) -> Path:
    (root / "team").mkdir(parents=True)
    (root / "team" / "train.py").write_text("print('team')\n")
    (root / "team" / "requirements.txt").write_text(requirements)
    subprocess.run(["git", "init", "-q", str(root)], check=True)
    subprocess.run(["git", "-C", str(root), "add", "."], check=True)
    return root


def test_a_requirement_that_excludes_an_image_pin_stops_dt_plan_in_one_line_exit_2(
    tmp_path, monkeypatch, capsys
):
    """A node installs the job's requirements over the image and never replaces its packages,
    so `numpy<2` against the image's numpy could only fail on every node, after the pool and
    the job exist: the stack says so first, naming the line, both versions and the fix."""
    numpy = image_pins()["numpy"]
    requirements = "# the team's\nscipy>=1.10\ntorch>=2.0\nnumpy<2  # an old pin\n"
    repo = _repo_with_requirements(tmp_path, requirements)
    err = _refused_by_dt_plan(tmp_path, monkeypatch, capsys, repo)
    assert err.startswith(
        f"error: jobs.mine.code='team': its requirements.txt line 4 `numpy<2` excludes the "
        f"image's numpy {numpy} (docker/requirements.txt or the Dockerfile pins it); accept "
        "the image's version or drop the line"
    )


@pytest.mark.parametrize(
    "requirements",
    [
        "numpy>=2\ntorch\nhorovod==0.28.*\nrequests\n",
        'numpy<2 ; python_version < "3.12"\n',  # not installed on the image's Python 3.13
        "-r other.txt\n./wheels/team-0.1-py3-none-any.whl\n",
    ],
)
def test_requirements_the_image_pins_satisfy_load(tmp_path, monkeypatch, requirements):
    monkeypatch.setattr("infra.settings.jobs.REPO", _repo_with_requirements(tmp_path, requirements))
    (job,) = _jobs({"command": "python train.py", "code": "team"})
    assert job.code is not None and job.code.requirements == requirements


def test_the_image_pins_are_read_from_its_build_inputs():
    pins = image_pins()
    pinned = dict(
        line.split("==")
        for line in (REPO / "docker" / "requirements.txt").read_text().split()
        if "==" in line
    )
    assert {name: pins[name] for name in ("numpy", "pyyaml", "azure-identity")} == {
        name: pinned[name] for name in ("numpy", "pyyaml", "azure-identity")
    }
    dockerfile = (REPO / "docker" / "Dockerfile").read_text()
    assert f"ARG TORCH_VERSION={pins['torch']}\n" in dockerfile
    assert f"HOROVOD_VERSION={pins['horovod']}\n" in (REPO / "scripts/build_horovod.sh").read_text()


UPLOAD = "pulumi-python:dynamic:Resource"


def test_each_code_hash_is_one_upload_the_job_waits_for():
    plan = evaluate(
        "dev",
        _stack({"mine": MINE, "again": MINE, "other": {**CUSTOM, "code": "examples/custom_model"}}),
    )
    uploads = {r.name: r.inputs for r in of_type(plan, UPLOAD) if "folder" in r.inputs}
    sha = snapshot("examples/torchrun_ddp", REPO).sha256
    assert len(uploads) == 2
    upload = uploads[f"platform-dev-code-{sha[:12]}"]
    assert (upload["folder"], upload["sha256"]) == ("examples/torchrun_ddp", sha)
    assert "data" not in upload  # the bytes never reach the state
    for job in ("platform-dev-job-mine", "platform-dev-job-again"):
        assert f"platform-dev-code-{sha[:12]}" in plan.dependencies[job]


def test_the_provider_uploads_the_snapshot_once_with_the_deployers_credential(
    entra_env, azurite_entra
):
    from infra.code_upload import CodeUploadError, CodeUploadProvider

    code = azurite_entra.container("code")
    if not code.exists():
        code.create_container()
    snap = snapshot("examples/torchrun_ddp", REPO)
    if code.get_blob_client(snap.blob_name).exists():
        code.delete_blob(snap.blob_name)
    props = {
        "folder": snap.folder,
        "sha256": snap.sha256,
        "blob_endpoint": azurite_entra.blob_endpoint,
    }
    made = CodeUploadProvider().create(props)
    assert made.id == snap.sha256 and made.outs["url"].endswith(f"/code/{snap.blob_name}")
    assert code.download_blob(snap.blob_name).readall() == snap.data
    assert CodeUploadProvider().create(props).id == snap.sha256  # there already: kept
    with pytest.raises(CodeUploadError, match="changed since the preview"):
        CodeUploadProvider().create({**props, "sha256": "0" * 64})
