"""The trainer image `make image` built for this checkout, checked as its consumers use it: Batch
(its configuration: no ENTRYPOINT in front of the task's command line, the user and folders the
emulator assumes), the pool's OS disk (its size), and a node (inside it, as its user: Horovod's
build, the trainer's dry run, the launcher, the region decoder, and a job's code snapshot
unpacked and its requirements installed over the image's packages by the image's own Python).
The tests run the image's Python 3.13, not the test machine's: what differs between the two
shows here (tests/support/built_image.py)."""

from __future__ import annotations

import json
import os
import subprocess
from pathlib import Path

import pytest

from infra import toolchain
from infra.code_snapshot import snapshot
from infra.image_packages import image_pins
from infra.sizes import UBUNTU_HPC_2404
from tests.batch_emulator import REPO
from tests.batch_emulator.image import container_argv, read_dockerfile
from tests.support.built_image import ImageContainer, image_config, image_container, image_name
from tests.support.wheels import write_wheel

# Processes inside the image (buildah's chroot), each importing the image's CUDA torch: make
# test runs them one at a time.
pytestmark = pytest.mark.processes

INSIDE = "/checks"  # where a test's folder is mounted in the container


@pytest.fixture(scope="module")
def image():
    with image_container(image_name()) as container:
        yield container


@pytest.fixture
def shared(tmp_path):
    """A folder of the test's, mounted at INSIDE, that the image's user may write."""
    folder = tmp_path / "shared"
    folder.mkdir()
    os.chmod(folder, 0o777)
    return folder


def _ok(result: subprocess.CompletedProcess[str]) -> str:
    assert result.returncode == 0, result.stdout[-3000:] + result.stderr[-3000:]
    return result.stdout


def test_batchs_command_line_reaches_the_image_as_the_emulator_assumes():
    """Batch passes a task's command line as the container's CMD and keeps the image's
    ENTRYPOINT in front of it (MicrosoftDocs/azure-docs #94943): the built image has none, and
    its command, user, folder and variables are what the emulator reads from the Dockerfile."""
    built = image_config(image_name())
    assumed = read_dockerfile(REPO / "docker" / "Dockerfile")
    assert not built.get("Entrypoint")
    assert tuple(built["Cmd"]) == assumed.cmd == ("python", "-m", "trainer", "--help")
    assert built["User"] == assumed.user == "1000:1000"
    assert built["WorkingDir"] == assumed.workdir == "/home/trainer"
    env = dict(item.split("=", 1) for item in built["Env"])
    assert {key: env.get(key) for key in assumed.env_dict()} == assumed.env_dict()
    line = "/bin/bash -c 'python -m trainer.launch --help'"
    assert container_argv(assumed, line, None) == [
        "/bin/bash",
        "-c",
        "python -m trainer.launch --help",
    ]


def test_the_image_is_the_size_the_plan_counts_and_fits_the_pools_os_disk(image: ImageContainer):
    """dt-plan estimates the image's unpacked size (infra.toolchain) for the OS disk check: the
    built image is within it, and the HPC image's disk takes it while a pull unpacks it."""
    used = subprocess.run(
        ["du", "-s", "--block-size=1", "--one-file-system", str(image.root)],
        capture_output=True,
        text=True,
        check=True,
    )
    unpacked_gb = int(used.stdout.split()[0]) / 1e9
    estimate = toolchain.image_unpacked_gb()
    assert 0.85 * estimate <= unpacked_gb <= 1.05 * estimate, (unpacked_gb, estimate)
    pulling = unpacked_gb * (1 + toolchain.PULL_OVERHEAD)
    assert UBUNTU_HPC_2404.os_used_gb + pulling <= UBUNTU_HPC_2404.os_disk_gb, pulling


def test_horovod_in_the_image_has_pytorch_nccl_and_gloo(image: ImageContainer):
    said = _ok(image.run(["horovodrun", "--check-build"]))
    for line in ("[X] PyTorch", "[X] NCCL", "[X] Gloo"):
        assert line in said, said


def test_the_trainer_launcher_and_decoder_run_on_the_images_python(image: ImageContainer):
    script = (
        "import sys, tarfile; print(tuple(sys.version_info[:2]), hasattr(tarfile, 'data_filter'))"
    )
    release = tuple(int(part) for part in toolchain.BASE_PYTHON.removeprefix("python").split("."))
    assert _ok(image.run(["python", "-c", script])).strip() == f"{release} True"
    dry_run = _ok(image.run(["python", "-m", "trainer", "--model", "resnet50", "--dry-run"]))
    assert "resnet50" in dry_run
    launcher = _ok(image.run(["python", "-m", "trainer.launch", "--help"]))
    assert "usage:" in launcher
    _ok(
        image.run(
            [
                "python",
                "-c",
                "import sys, trainer.data.jpeg_region as r; sys.exit(not r.available())",
            ]
        )
    )
    # What the image holds is what the stack says it pins (infra.image_packages).
    held = json.loads(
        _ok(
            image.run(
                [
                    "python",
                    "-c",
                    "import json; from trainer.launch.code_folder import image_packages; "
                    "print(json.dumps(image_packages()))",
                ]
            )
        )
    )
    for name, version in image_pins().items():
        assert held[name].split("+")[0] == version, (name, held[name], version)


# A job's code made ready in the image: unpacked by the image's Python (tarfile's filter, which
# the 3.11.0 of the image's former base lacked) and its requirements installed over the image.
READY = """
import json, sys
from pathlib import Path
from trainer.launch import code_folder
folder = Path(sys.argv[1])
code_folder.unpack(folder / "snapshot.tar.gz", folder / "src")
try:
    code_folder.install_requirements(folder, code_folder.image_packages())
except code_folder.CodeError as err:
    print(json.dumps({"error": str(err)}))
else:
    print(json.dumps({"site": sorted(p.name for p in (folder / "site").iterdir())}))
"""


def _snapshot_in(shared: Path, tmp_path: Path, requires: tuple[str, ...]) -> Path:
    """A team's code folder whose requirements.txt installs its own wheel, which depends on
    ``requires``; its snapshot written into ``shared``/job as a node downloads it."""
    repo = tmp_path / "repo"
    write_wheel(repo / "team" / "wheels", "team_stats", "VALUE = 1\n", requires)
    (repo / "team" / "train.py").write_text("print('team')\n")
    (repo / "team" / "requirements.txt").write_text("./wheels/team_stats-0.1-py3-none-any.whl\n")
    subprocess.run(["git", "init", "-q", str(repo)], check=True)
    subprocess.run(["git", "-C", str(repo), "add", "team"], check=True)
    job = shared / "job"
    job.mkdir()
    (job / "snapshot.tar.gz").write_bytes(snapshot("team", repo).data)
    os.chmod(job, 0o777)
    return job


def _ready(image: ImageContainer, shared: Path) -> dict:
    said = _ok(
        image.run(
            ["python", "-c", READY, f"{INSIDE}/job"],
            env={"PIP_NO_INDEX": "1"},  # nothing to fetch: the image must have what it needs
            binds=[(shared, INSIDE)],
        )
    )
    return json.loads(said.splitlines()[-1])


def test_a_requirement_on_torch_and_numpy_adds_only_the_teams_package_in_the_image(
    image: ImageContainer, shared, tmp_path
):
    pins = image_pins()
    _snapshot_in(shared, tmp_path, (f"numpy>={pins['numpy']}", "torch>=2"))
    assert _ready(image, shared) == {"site": ["team_stats", "team_stats-0.1.dist-info"]}
    where = _ok(
        image.run(
            [
                "python",
                "-c",
                "import numpy, torch, team_stats; print(numpy.__file__, torch.__file__)",
            ],
            env={"PYTHONPATH": f"{INSIDE}/job/site:/opt/trainer"},
            binds=[(shared, INSIDE)],
        )
    )
    assert all(path.startswith("/opt/venv/") for path in where.split()), where


def test_a_dependency_excluding_the_images_numpy_is_one_line_in_the_image(
    image: ImageContainer, shared, tmp_path
):
    _snapshot_in(shared, tmp_path, ("numpy<2",))
    assert _ready(image, shared) == {
        "error": "requirements.txt of the job's code does not install over the image: "
        f"team-stats 0.1 depends on numpy<2, and the image holds numpy=={image_pins()['numpy']}"
    }


def test_the_images_trainer_logs_its_run_to_an_mlflow_server(image: ImageContainer, shared):
    """The image's MLflow client (mlflow-skinny on its Python 3.13) against a real tracking
    server on this machine's 127.0.0.1: the trainer's run with its steps and its results; and
    a sqlite store, which that client cannot open (no SQLAlchemy in mlflow-skinny), is one line
    before anything trains, naming the URI."""
    from mlflow.tracking import MlflowClient

    from tests.support.mlflow_server import mlflow_server

    flags = ["--model", "tiny", "--num-classes", "3", "--image-size", "16", "--batch-size", "4",
             "--synthetic-size", "16", "--backend", "local", "--max-steps", "2",
             "--log-every", "1", "--output-dir", f"{INSIDE}/run"]  # fmt: skip
    with mlflow_server(shared.parent / "mlflow") as uri:
        env = {"MLFLOW_TRACKING_URI": uri, "MLFLOW_EXPERIMENT_NAME": "image"}
        _ok(image.run(["python", "-m", "trainer", *flags], env=env, binds=[(shared, INSIDE)]))
        client = MlflowClient(uri)
        (run,) = client.search_runs([client.get_experiment_by_name("image").experiment_id])
        assert run.info.status == "FINISHED" and run.info.run_name == "run"
        assert [m.step for m in client.get_metric_history(run.info.run_id, "loss")] == [1, 2]
        folder = "results/step-000000002"  # the results of the step the run ended at
        artifacts = {a.path for a in client.list_artifacts(run.info.run_id, folder)}
        assert f"{folder}/model.safetensors" in artifacts
    sqlite = {"MLFLOW_TRACKING_URI": f"sqlite:///{INSIDE}/mlflow.db"}
    again = [*flags[:-1], f"{INSIDE}/run2"]
    refused = image.run(["python", "-m", "trainer", *again], env=sqlite, binds=[(shared, INSIDE)])
    assert refused.returncode == 2, refused.stdout[-2000:] + refused.stderr[-2000:]
    (line,) = [line for line in refused.stderr.splitlines() if "MLFLOW_TRACKING_URI" in line]
    assert line.startswith(f"error: MLFLOW_TRACKING_URI={sqlite['MLFLOW_TRACKING_URI']}: the ")
    assert "Traceback" not in refused.stderr and not (shared / "run2").exists()


def test_the_images_trainer_tracks_in_an_azureml_workspace_as_the_nodes_identity(
    image: ImageContainer, shared, azurite_entra
):
    """The image's azureml-mlflow plugin (on its Python 3.13, beside its mlflow-skinny) against
    a fake workspace in front of a real MLflow server (tests/support/fake_azureml.py): the
    nodes' managed identity's token, the run, its metrics and its model in the workspace's
    storage, as a job of a stack with azuremlWorkspace tracks there."""
    from mlflow.tracking import MlflowClient

    from tests.support.fake_azureml import FakeAzureML
    from tests.support.fake_imds import IDENTITY
    from tests.support.mlflow_server import mlflow_server

    flags = ["--model", "tiny", "--num-classes", "3", "--image-size", "16", "--batch-size", "4",
             "--synthetic-size", "16", "--backend", "local", "--max-steps", "2",
             "--log-every", "1", "--output-dir", f"{INSIDE}/run"]  # fmt: skip
    with mlflow_server(shared.parent / "mlflow") as backend:
        workspace = FakeAzureML(shared.parent / "tls", backend, azurite_entra, {IDENTITY})
        try:
            env = {
                **azurite_entra.env(),
                **workspace.env(shared / "ca.pem"),
                "REQUESTS_CA_BUNDLE": f"{INSIDE}/ca.pem",  # the bundle, as the image sees it
                "MLFLOW_EXPERIMENT_NAME": "image",
                "AZ_BATCH_JOB_ID": "dev-default-image",
            }
            run = image.run(["python", "-m", "trainer", *flags], env=env, binds=[(shared, INSIDE)])
            _ok(run)
        finally:
            workspace.close()
        client = MlflowClient(backend)
        (found,) = client.search_runs([client.get_experiment_by_name("image").experiment_id])
    assert found.info.status == "FINISHED" and found.info.run_name == "dev-default-image"
    assert f"MLflow: new run {found.info.run_id} https://ml.azure.com/runs/" in run.stdout
    folder = f"ExperimentRun/dcid.{found.info.run_id}/results/step-000000002/"
    blobs = {b.name for b in workspace.artifacts.list_blobs(folder)}
    assert f"{folder}model.safetensors" in blobs, blobs
    assert workspace.refusals == [] and "Traceback" not in run.stderr
